package e2e

import (
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/testsupport/ldapserver"
	"github.com/headwater-gitops/headwater/testsupport/miniotest/ldapminio"
)

// TestBucketSTSLDAP reads a generic Bucket through MinIO's STS, as Flux's
// spec.sts provider ldap: the fetcher exchanges the LDAP username and
// password of spec.sts.secretRef (AssumeRoleWithLDAPIdentity) for
// temporary credentials, which MinIO grants after binding to an LDAP
// directory as the user; the artifact is stored. With a wrong password
// the Bucket is Ready False with AuthenticationFailed and MinIO's reason,
// and the artifact stays. An STS provider that does not go with the
// Bucket's provider is refused by the API server with Flux's message.
func TestBucketSTSLDAP(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name, bucket = "bucket-sts-ldap", "ldapbucket"
	dir, err := ldapserver.Start(map[string]string{"bob": "builder"}, "lookup-secret")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dir.Stop() })
	srv, users := ldapminio.New(t, dir)
	srv.MakeBucket(t, bucket)
	putObject(t, srv, bucket, "manifests/app.yaml", "kind: ConfigMap\n")
	createSecret(t, "bucket-sts-ldap-user", map[string]string{"username": "bob", "password": "builder"})
	createBucket(t, name, srv.Endpoint, bucket, func(b *sourcev1.Bucket) {
		b.Spec.STS = &sourcev1.BucketSTSSpec{Provider: sourcev1.STSProviderLDAP, Endpoint: "http://" + srv.Endpoint,
			SecretRef: &meta.LocalObjectReference{Name: "bucket-sts-ldap-user"}}
	})
	rev := listingRevision(t, srv, bucket, "", nil)
	obj := waitBucketArtifact(t, name, rev)
	checkBucketContent(t, obj, map[string]string{"manifests/app.yaml": "kind: ConfigMap\n"})
	bob := ldapserver.UserDN("bob")
	if dir.Binds(bob) == 0 || users.RequestsAs(bob) == 0 {
		t.Errorf("binds as %s: %d, requests with its credentials: %d; want the bucket read as the LDAP user", bob, dir.Binds(bob), users.RequestsAs(bob))
	}

	// A wrong password: AuthenticationFailed, the artifact stays.
	patchSecret(t, "bucket-sts-ldap-user", map[string]string{"username": "bob", "password": "not-the-password"})
	putObject(t, srv, bucket, "manifests/new.yaml", "kind: Secret\n")
	requestBucketReconcile(t, name)
	obj = waitBucketCondition(t, name, meta.ReadyCondition, metav1.ConditionFalse, sourcev1.AuthenticationFailedReason)
	if c := bucketCondition(t, obj, meta.ReadyCondition); !strings.Contains(c.Message, "STS authentication failed: AssumeRoleWithLDAPIdentity") {
		t.Errorf("Ready message %q does not say the STS exchange failed", c.Message)
	}
	if obj.Status.Artifact == nil || obj.Status.Artifact.Revision != rev {
		t.Errorf("artifact after a failed exchange = %+v, want revision %s kept", obj.Status.Artifact, rev)
	}

	// The API server refuses an STS provider of another Bucket provider.
	bad := &sourcev1.Bucket{ObjectMeta: metav1.ObjectMeta{Name: "bucket-sts-mismatch", Namespace: namespace},
		Spec: sourcev1.BucketSpec{Provider: sourcev1.BucketProviderGeneric, BucketName: bucket, Endpoint: srv.Endpoint,
			Interval: metav1.Duration{Duration: 60e9},
			STS:      &sourcev1.BucketSTSSpec{Provider: sourcev1.STSProviderAmazon, Endpoint: "https://sts.amazonaws.com"}}}
	err = env.Client.Create(t.Context(), bad)
	if err == nil || !strings.Contains(err.Error(), "'ldap' is the only supported STS provider for the 'generic' Bucket provider") {
		t.Errorf("create a generic Bucket with STS provider aws: %v", err)
	}
	requireServicesRunning(t)
}
