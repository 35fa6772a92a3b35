package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/testsupport/azuritetest"
	"github.com/headwater-gitops/headwater/testsupport/fakegcstest"
)

// TestBucketProviders runs the walkthrough's first steps for the gcp and
// azure providers, each against its emulator (fake-gcs-server, Azurite):
// a bucket holding TESTFILE.md = 11111 becomes a Ready Bucket whose
// revision is Flux's for the ETags the emulator gives, with that file in
// its artifact; overwriting it and requesting a reconcile stores a new
// artifact of the new revision.
func TestBucketProviders(t *testing.T) {
	requireEnv(t)
	t.Parallel()

	t.Run("gcp", func(t *testing.T) {
		t.Parallel()
		const name, bucket = "bucket-provider-gcp", "testbucket"
		srv := fakegcstest.New(t)
		srv.MakeBucket(t, bucket)
		etags := map[string]string{"TESTFILE.md": srv.Put(t, bucket, "TESTFILE.md", "11111")}
		// No secretRef: the fetcher finds no default credentials on this
		// machine and, the endpoint being the emulator's, reads it
		// anonymously (fake-gcs-server takes any request).
		createBucket(t, name, srv.Endpoint, bucket, func(b *sourcev1.Bucket) { b.Spec.Provider = sourcev1.BucketProviderGoogle })
		providerWalkthrough(t, name, etags, func(content string) map[string]string {
			return map[string]string{"TESTFILE.md": srv.Put(t, bucket, "TESTFILE.md", content)}
		})
	})

	t.Run("azure", func(t *testing.T) {
		t.Parallel()
		const name, bucket, secretName = "bucket-provider-azure", "testbucket", "bucket-provider-azure-key"
		srv := azuritetest.New(t)
		srv.MakeContainer(t, bucket)
		etags := map[string]string{"TESTFILE.md": srv.Put(t, bucket, "TESTFILE.md", "11111")}
		createSecret(t, secretName, map[string]string{"accountKey": srv.AccountKey})
		createBucket(t, name, srv.Endpoint, bucket, func(b *sourcev1.Bucket) {
			b.Spec.Provider = sourcev1.BucketProviderAzure
			b.Spec.SecretRef = &meta.LocalObjectReference{Name: secretName}
		})
		providerWalkthrough(t, name, etags, func(content string) map[string]string {
			return map[string]string{"TESTFILE.md": srv.Put(t, bucket, "TESTFILE.md", content)}
		})
	})

	t.Cleanup(func() { requireServicesRunning(t) })
}

// providerWalkthrough waits for the Bucket name to go Ready with the
// revision of etags and TESTFILE.md = 11111, then overwrites the file with
// 22222 (put returns the new ETags) and waits for the new artifact.
func providerWalkthrough(t *testing.T, name string, etags map[string]string, put func(content string) map[string]string) {
	t.Helper()
	rev1 := etagRevision(etags)
	obj := waitBucketArtifact(t, name, rev1)
	checkBucketStored(t, obj, rev1)
	checkBucketContent(t, obj, map[string]string{"TESTFILE.md": "11111"})

	rev2 := etagRevision(put("22222"))
	if rev2 == rev1 {
		t.Fatalf("overwriting the object kept the revision %s", rev1)
	}
	requestBucketReconcile(t, name)
	obj2 := waitBucketArtifact(t, name, rev2)
	checkBucketStored(t, obj2, rev2)
	checkBucketContent(t, obj2, map[string]string{"TESTFILE.md": "22222"})
}

// etagRevision is Flux's revision of a bucket whose objects have these
// ETags (as Flux records them): the SHA-256 of "<key> <etag>\n" per
// object in key order.
func etagRevision(etags map[string]string) string {
	var keys []string
	for k := range etags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %s\n", k, etags[k])
	}
	sum := sha256.Sum256([]byte(b.String()))
	return "sha256:" + hex.EncodeToString(sum[:])
}
