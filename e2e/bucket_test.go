package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/minio/minio-go/v7"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
)

// The Bucket tests run on the package's Env (directory storage), each
// against a MinIO server of its own.

const bucketKind = sourcev1.BucketKind

// TestBucketWalkthrough is the Flux Bucket walkthrough of the issue: a
// bucket testbucket holding TESTFILE.md = 11111 becomes a Ready Bucket with
// an artifact holding that file; overwriting it with 22222 and requesting a
// reconcile stores a new artifact; a reconcile with nothing new stores
// nothing; wrong keys fail the reconcile and keep the last artifact served.
func TestBucketWalkthrough(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const (
		name       = "bucket-walkthrough"
		secretName = "bucket-walkthrough-credentials"
		bucket     = "testbucket"
	)
	srv := miniotest.New(t)
	srv.MakeBucket(t, bucket)
	putObject(t, srv, bucket, "TESTFILE.md", "11111")
	createSecret(t, secretName, map[string]string{"accesskey": srv.AccessKey, "secretkey": srv.SecretKey})
	createBucket(t, name, srv.Endpoint, bucket, func(b *sourcev1.Bucket) {
		b.Spec.SecretRef = &meta.LocalObjectReference{Name: secretName}
	})

	rev1 := listingRevision(t, srv, bucket, "", nil)
	obj := waitBucketArtifact(t, name, rev1)
	checkBucketStored(t, obj, rev1)
	checkBucketContent(t, obj, map[string]string{"TESTFILE.md": "11111"})
	storedEvent := fmt.Sprintf("stored artifact with 1 fetched files from '%s' bucket", bucket)

	t.Run("kubectl get bucket", func(t *testing.T) {
		out, err := env.Kubectl(t.Context(), "get", "bucket", name, "-n", namespace)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("kubectl get bucket %s:\n%s", name, out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || !strings.HasSuffix(lines[1], bucketStoredMessage(rev1)) {
			t.Errorf("kubectl get bucket printed %q, want one row ending in %q", out, bucketStoredMessage(rev1))
		}
	})

	t.Run("Events", func(t *testing.T) {
		e := waitKindEvent(t, bucketKind, name, corev1.EventTypeNormal, "NewArtifact", nil)
		if e.Message != storedEvent {
			t.Errorf("NewArtifact Event %q, want %q", e.Message, storedEvent)
		}
		ce := waitCloudEvent(t, recorder, bucketKind, name, events.TypeArtifactStored, func(o *events.Outcome) bool {
			return o.Artifact != nil && o.Artifact.Digest == obj.Status.Artifact.Digest
		})
		if o := ce.outcome(); o.Artifact.URL != obj.Status.Artifact.URL || o.Revision != rev1 {
			t.Errorf("CloudEvent artifact url %s revision %s, want %s %s", o.Artifact.URL, o.Revision, obj.Status.Artifact.URL, rev1)
		}
		if want := "bucket/default/" + name; ce.msg.Event.Subject() != want {
			t.Errorf("CloudEvent subject %q, want %q", ce.msg.Event.Subject(), want)
		}
	})

	// The object is overwritten and a reconcile requested: a new artifact.
	newArtifacts := kindEventCount(t, bucketKind, name, "NewArtifact")
	putObject(t, srv, bucket, "TESTFILE.md", "22222")
	rev2 := listingRevision(t, srv, bucket, "", nil)
	if rev2 == rev1 {
		t.Fatalf("overwriting the object kept the listing's revision %s", rev1)
	}
	token := requestBucketReconcile(t, name)
	obj2 := waitBucketArtifact(t, name, rev2)

	t.Run("overwritten object", func(t *testing.T) {
		checkBucketStored(t, obj2, rev2)
		if obj2.Status.LastHandledReconcileAt != token {
			t.Errorf("lastHandledReconcileAt %q, want %q", obj2.Status.LastHandledReconcileAt, token)
		}
		if obj2.Status.Artifact.Digest == obj.Status.Artifact.Digest {
			t.Errorf("new content kept digest %s", obj.Status.Artifact.Digest)
		}
		checkBucketContent(t, obj2, map[string]string{"TESTFILE.md": "22222"})
		waitCloudEvent(t, recorder, bucketKind, name, events.TypeArtifactStored, func(o *events.Outcome) bool {
			return o.Artifact != nil && o.Artifact.Digest == obj2.Status.Artifact.Digest
		})
		eventually(t, "a second NewArtifact Event", func() error {
			if n := kindEventCount(t, bucketKind, name, "NewArtifact"); n <= newArtifacts {
				return fmt.Errorf("%d NewArtifact Events, as before", n)
			}
			return nil
		})
	})

	// A reconcile request with nothing new: the same artifact, nothing
	// stored, Flux's ArtifactUpToDate message logged.
	t.Run("nothing new", func(t *testing.T) {
		before := storedBucketFiles(t, name)
		newArtifacts := kindEventCount(t, bucketKind, name, "NewArtifact")
		token := requestBucketReconcile(t, name)
		var obj3 *sourcev1.Bucket
		eventually(t, "lastHandledReconcileAt "+token, func() error {
			obj3 = getBucket(t, name)
			if obj3.Status.LastHandledReconcileAt != token {
				return fmt.Errorf("lastHandledReconcileAt %q", obj3.Status.LastHandledReconcileAt)
			}
			return nil
		})
		a, prev := obj3.Status.Artifact, obj2.Status.Artifact
		if a == nil || a.Digest != prev.Digest || a.Revision != prev.Revision || a.Path != prev.Path || !a.LastUpdateTime.Equal(&prev.LastUpdateTime) {
			t.Errorf("artifact changed on a reconcile with nothing new:\n got %+v\nwant %+v", a, prev)
		}
		ready := bucketCondition(t, obj3, meta.ReadyCondition)
		if ready.Status != metav1.ConditionTrue || ready.Message != bucketStoredMessage(rev2) {
			t.Errorf("Ready=%s %q, want True %q", ready.Status, ready.Message, bucketStoredMessage(rev2))
		}
		e := waitCloudEvent(t, recorder, bucketKind, name, events.TypeArtifactUnchanged, func(o *events.Outcome) bool {
			return o.Job.ReconcileToken == token
		})
		if o := e.outcome(); o.Artifact == nil || o.Artifact.Digest != prev.Digest || o.Artifact.URL != prev.URL {
			t.Errorf("unchanged CloudEvent carries artifact %+v, want the current one %+v", o.Artifact, prev)
		}
		upToDate := fmt.Sprintf("artifact up-to-date with remote revision: '%s'", rev2)
		eventually(t, "the watcher logs "+upToDate, func() error {
			if !strings.Contains(logs(t, env.Service(harness.Watcher)), upToDate) {
				return errors.New("not logged")
			}
			return nil
		})
		if after := storedBucketFiles(t, name); !mapsEqualTimes(before, after) {
			t.Errorf("storage changed on a reconcile with nothing new: before %v, after %v", before, after)
		}
		if n := kindEventCount(t, bucketKind, name, "NewArtifact"); n != newArtifacts {
			t.Errorf("%d NewArtifact Events after a reconcile with nothing new, want %d as before", n, newArtifacts)
		}
	})

	// Wrong keys: the reconcile fails in Flux's words, the last artifact
	// stays in status and is still served.
	t.Run("wrong secret key", func(t *testing.T) {
		const wrong = "not-the-secret-key"
		patchSecret(t, secretName, map[string]string{"accesskey": srv.AccessKey, "secretkey": wrong})
		requestBucketReconcile(t, name)
		obj := waitBucketCondition(t, name, meta.ReadyCondition, metav1.ConditionFalse, sourcev1.BucketOperationFailedReason)
		ready := bucketCondition(t, obj, meta.ReadyCondition)
		t.Logf("Ready=False %s: %s", ready.Reason, ready.Message)
		if !strings.Contains(ready.Message, bucket) {
			t.Errorf("Ready message %q does not name the bucket %q", ready.Message, bucket)
		}
		if strings.Contains(ready.Message, wrong) || strings.Contains(ready.Message, srv.SecretKey) {
			t.Errorf("Ready message %q shows a secret key", ready.Message)
		}
		failed := bucketCondition(t, obj, sourcev1.FetchFailedCondition)
		if failed.Status != metav1.ConditionTrue || failed.Reason != sourcev1.BucketOperationFailedReason || failed.Message != ready.Message {
			t.Errorf("FetchFailed=%s %s %q, want True %s %q", failed.Status, failed.Reason, failed.Message, sourcev1.BucketOperationFailedReason, ready.Message)
		}
		waitKindEvent(t, bucketKind, name, corev1.EventTypeWarning, sourcev1.BucketOperationFailedReason, func(msg string) bool {
			return strings.Contains(msg, bucket)
		})
		e := waitCloudEvent(t, recorder, bucketKind, name, events.TypeArtifactFailed, nil)
		if f := e.outcome().Failure; f == nil || f.Reason != sourcev1.BucketOperationFailedReason {
			t.Errorf("failed CloudEvent carries failure %+v, want reason %s", f, sourcev1.BucketOperationFailedReason)
		}
		a, prev := obj.Status.Artifact, obj2.Status.Artifact
		if a == nil || a.Digest != prev.Digest || a.Revision != prev.Revision || a.URL != prev.URL {
			t.Fatalf("artifact after the failure %+v, want the previous one %+v", a, prev)
		}
		if c := bucketCondition(t, obj, sourcev1.ArtifactInStorageCondition); c.Status != metav1.ConditionTrue {
			t.Errorf("ArtifactInStorage=%s %s, want True", c.Status, c.Message)
		}
		checkBucketContent(t, obj, map[string]string{"TESTFILE.md": "22222"})
	})

	t.Cleanup(func() { requireServicesRunning(t) })
}

// TestBucketPrefixIgnore checks spec.prefix, spec.ignore and a .sourceignore
// object: only the objects under the prefix that no rule ignores are in the
// artifact (with the .sourceignore object at its root, as in Flux), and
// changing spec.ignore brings a new artifact.
func TestBucketPrefixIgnore(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const (
		name   = "bucket-prefix-ignore"
		bucket = "prefixbucket"
	)
	srv := miniotest.New(t)
	srv.MakeBucket(t, bucket)
	objects := map[string]string{
		".sourceignore":       "*.bak\n",
		"manifests/app.yaml":  "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n",
		"manifests/notes.txt": "notes\n",
		"manifests/old.bak":   "old\n",
		"manifests/dir/":      "", // a directory marker, skipped
		"other/skip.yaml":     "skip\n",
	}
	for k, v := range objects {
		putObject(t, srv, bucket, k, v)
	}
	secretName := name + "-credentials"
	createSecret(t, secretName, map[string]string{"accesskey": srv.AccessKey, "secretkey": srv.SecretKey})
	createBucket(t, name, srv.Endpoint, bucket, func(b *sourcev1.Bucket) {
		b.Spec.SecretRef = &meta.LocalObjectReference{Name: secretName}
		b.Spec.Prefix = "manifests/"
		ignore := "*.txt"
		b.Spec.Ignore = &ignore
	})

	rev := listingRevision(t, srv, bucket, "manifests/", func(key string) bool { return key == "manifests/app.yaml" })
	obj := waitBucketArtifact(t, name, rev)
	checkBucketStored(t, obj, rev)
	checkBucketContent(t, obj, map[string]string{
		".sourceignore":      objects[".sourceignore"],
		"manifests/app.yaml": objects["manifests/app.yaml"],
	})
	waitKindEvent(t, bucketKind, name, corev1.EventTypeNormal, "NewArtifact", func(msg string) bool {
		return msg == fmt.Sprintf("stored artifact with 1 fetched files from '%s' bucket", bucket)
	})
	if obj.Status.ObservedIgnore == nil || *obj.Status.ObservedIgnore != "*.txt" {
		t.Errorf("status.observedIgnore %v, want *.txt", obj.Status.ObservedIgnore)
	}

	t.Run("ignore removed", func(t *testing.T) {
		patchBucket(t, name, func(b *sourcev1.Bucket) { b.Spec.Ignore = nil })
		rev2 := listingRevision(t, srv, bucket, "manifests/", func(key string) bool {
			return key == "manifests/app.yaml" || key == "manifests/notes.txt"
		})
		obj := waitBucketArtifact(t, name, rev2)
		checkBucketStored(t, obj, rev2)
		checkBucketContent(t, obj, map[string]string{
			".sourceignore":       objects[".sourceignore"],
			"manifests/app.yaml":  objects["manifests/app.yaml"],
			"manifests/notes.txt": objects["manifests/notes.txt"],
		})
		waitKindEvent(t, bucketKind, name, corev1.EventTypeNormal, "NewArtifact", func(msg string) bool {
			return msg == fmt.Sprintf("stored artifact with 2 fetched files from '%s' bucket", bucket)
		})
		if obj.Status.ObservedIgnore != nil {
			t.Errorf("status.observedIgnore %q, want none", *obj.Status.ObservedIgnore)
		}
	})
}

// checkBucketStored checks everything Flux shows for a Bucket that stored
// an artifact of revision rev.
func checkBucketStored(t *testing.T, obj *sourcev1.Bucket, rev string) {
	t.Helper()
	a := obj.Status.Artifact
	dir := fmt.Sprintf("bucket/%s/%s/", obj.Namespace, obj.Name)
	path := dir + strings.TrimPrefix(rev, "sha256:") + ".tar.gz"
	if !digestPattern.MatchString(rev) {
		t.Errorf("revision %q, want sha256:<hex>", rev)
	}
	if !digestPattern.MatchString(a.Digest) {
		t.Errorf("artifact digest %q, want sha256:<hex>", a.Digest)
	}
	if a.Revision != rev {
		t.Errorf("artifact revision %q, want %q", a.Revision, rev)
	}
	if a.Path != path {
		t.Errorf("artifact path %q, want %q", a.Path, path)
	}
	if want := env.ArtifactURL(path); a.URL != want {
		t.Errorf("artifact url %q, want %q", a.URL, want)
	}
	if want := env.ArtifactURL(dir + "latest.tar.gz"); obj.Status.URL != want {
		t.Errorf("status.url %q, want %q", obj.Status.URL, want)
	}
	if a.Size == nil || *a.Size <= 0 {
		t.Errorf("artifact size %v, want the size in bytes", a.Size)
	}
	if a.LastUpdateTime.IsZero() {
		t.Error("artifact lastUpdateTime is not set")
	}
	for _, typ := range []string{meta.ReadyCondition, sourcev1.ArtifactInStorageCondition} {
		c := bucketCondition(t, obj, typ)
		if c.Status != metav1.ConditionTrue || c.Reason != meta.SucceededReason || c.Message != bucketStoredMessage(rev) {
			t.Errorf("%s=%s %s %q, want True %s %q", typ, c.Status, c.Reason, c.Message, meta.SucceededReason, bucketStoredMessage(rev))
		}
	}
	if obj.Status.ObservedGeneration != obj.Generation {
		t.Errorf("status.observedGeneration %d, want %d", obj.Status.ObservedGeneration, obj.Generation)
	}
	if !slices.Contains(obj.Finalizers, sourcev1.SourceFinalizer) {
		t.Errorf("finalizers %v, want %s", obj.Finalizers, sourcev1.SourceFinalizer)
	}
}

// checkBucketContent downloads the Bucket's artifact and latest.tar.gz
// (status.url) and checks that both are the artifact in status, holding
// exactly files.
func checkBucketContent(t *testing.T, obj *sourcev1.Bucket, files map[string]string) {
	t.Helper()
	a := obj.Status.Artifact
	body := download(t, a.URL)
	if got := sha256Digest(body); got != a.Digest {
		t.Errorf("downloaded %s has digest %s, status says %s", a.URL, got, a.Digest)
	}
	if a.Size != nil && int64(len(body)) != *a.Size {
		t.Errorf("downloaded %d bytes, status says size %d", len(body), *a.Size)
	}
	if d := diffTrees(untarArtifact(t, body), files); d != "" {
		t.Errorf("artifact %s: %s", a.URL, d)
	}
	if got := sha256Digest(download(t, obj.Status.URL)); got != a.Digest {
		t.Errorf("%s has digest %s, want the artifact's %s", obj.Status.URL, got, a.Digest)
	}
}

// bucketStoredMessage is Flux's Ready message of a Bucket that stored an
// artifact.
func bucketStoredMessage(rev string) string {
	return fmt.Sprintf("stored artifact: revision '%s'", rev)
}

// listingRevision is Flux's revision of the objects under prefix that keep
// accepts (all when nil), computed here from a listing: the SHA-256 of one
// line "<key> <etag>\n" per object in key order. The .sourceignore object
// and directory markers are not part of it.
func listingRevision(t *testing.T, srv *miniotest.Server, bucket, prefix string, keep func(key string) bool) string {
	t.Helper()
	var keys []string
	etags := map[string]string{}
	for o := range srv.Client.ListObjects(t.Context(), bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			t.Fatalf("list bucket %s: %v", bucket, o.Err)
		}
		if o.Key == ".sourceignore" || strings.HasSuffix(o.Key, "/") || (keep != nil && !keep(o.Key)) {
			continue
		}
		keys = append(keys, o.Key)
		etags[o.Key] = o.ETag
	}
	if len(keys) == 0 {
		t.Fatalf("no objects under %q in bucket %s", prefix, bucket)
	}
	slices.Sort(keys)
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%s %s\n", k, etags[k])
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// putObject writes an object, replacing any of the same key.
func putObject(t *testing.T, srv *miniotest.Server, bucket, key, content string) {
	t.Helper()
	if _, err := srv.Client.PutObject(t.Context(), bucket, key, strings.NewReader(content), int64(len(content)), minio.PutObjectOptions{}); err != nil {
		t.Fatalf("put %s/%s: %v", bucket, key, err)
	}
}

// createSecret creates a Secret in the test namespace.
func createSecret(t *testing.T, name string, data map[string]string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, StringData: data}
	if err := env.Client.Create(t.Context(), s); err != nil {
		t.Fatalf("create secret %s: %v", name, err)
	}
}

// patchSecret replaces a Secret's data.
func patchSecret(t *testing.T, name string, data map[string]string) {
	t.Helper()
	var s corev1.Secret
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, &s); err != nil {
		t.Fatalf("get secret %s: %v", name, err)
	}
	s.Data = nil
	s.StringData = data
	if err := env.Client.Update(t.Context(), &s); err != nil {
		t.Fatalf("update secret %s: %v", name, err)
	}
}

// createBucket creates the Bucket name as the walkthrough does: provider
// generic, the endpoint over plain HTTP, an interval of a minute, and
// whatever the options set. It is deleted when the test ends, before its
// MinIO server stops.
func createBucket(t *testing.T, name, endpoint, bucket string, opts ...func(*sourcev1.Bucket)) {
	t.Helper()
	obj := &sourcev1.Bucket{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: sourcev1.BucketSpec{
			Provider:   sourcev1.BucketProviderGeneric,
			BucketName: bucket,
			Endpoint:   endpoint,
			Insecure:   true,
			Interval:   metav1.Duration{Duration: time.Minute},
		},
	}
	for _, o := range opts {
		o(obj)
	}
	if err := env.Client.Create(t.Context(), obj); err != nil {
		t.Fatalf("create bucket %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := env.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete bucket %s: %v", name, err)
		}
	})
}

// getBucket returns the Bucket name.
func getBucket(t *testing.T, name string) *sourcev1.Bucket {
	t.Helper()
	var obj sourcev1.Bucket
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, &obj); err != nil {
		t.Fatalf("get bucket %s: %v", name, err)
	}
	return &obj
}

// patchBucket applies mutate to the Bucket name with a merge patch.
func patchBucket(t *testing.T, name string, mutate func(*sourcev1.Bucket)) {
	t.Helper()
	obj := getBucket(t, name)
	base := client.MergeFrom(obj.DeepCopy())
	mutate(obj)
	if err := env.Client.Patch(t.Context(), obj, base); err != nil {
		t.Fatalf("patch bucket %s: %v", name, err)
	}
}

// requestBucketReconcile sets reconcile.fluxcd.io/requestedAt to now, as
// `flux reconcile source bucket` does, and returns the token.
func requestBucketReconcile(t *testing.T, name string) string {
	t.Helper()
	token := time.Now().UTC().Format(time.RFC3339Nano)
	patchBucket(t, name, func(o *sourcev1.Bucket) {
		if o.Annotations == nil {
			o.Annotations = map[string]string{}
		}
		o.Annotations[meta.ReconcileRequestAnnotation] = token
	})
	return token
}

// waitBucketArtifact waits until the Bucket name is Ready for its current
// generation with an artifact of revision rev, and returns it.
func waitBucketArtifact(t *testing.T, name, rev string) *sourcev1.Bucket {
	t.Helper()
	return waitReady(t, "bucket "+name, func() *sourcev1.Bucket { return getBucket(t, name) },
		func(o *sourcev1.Bucket) int64 { return o.Status.ObservedGeneration }, rev)
}

// waitBucketCondition waits until the Bucket name has a condition of type
// with status and reason, and returns the object.
func waitBucketCondition(t *testing.T, name, typ string, status metav1.ConditionStatus, reason string) *sourcev1.Bucket {
	t.Helper()
	return waitConditionOf(t, "bucket "+name, func() *sourcev1.Bucket { return getBucket(t, name) }, typ, status, reason)
}

// bucketCondition returns the condition of type, failing the test if there
// is none.
func bucketCondition(t *testing.T, obj *sourcev1.Bucket, typ string) metav1.Condition {
	t.Helper()
	return conditionOf(t, obj, typ)
}

// storedBucketFiles lists the files in a Bucket's storage directory with
// their modification times.
func storedBucketFiles(t *testing.T, name string) map[string]time.Time {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(env.StoragePath, "bucket", namespace, name))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]time.Time{}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = fi.ModTime()
	}
	return files
}

// waitCloudEvent waits for a public CloudEvent recorded by rec about the
// source kind/name of eventType that satisfies match, and returns it.
func waitCloudEvent(t *testing.T, rec *eventRecorder, kind, name, eventType string, match func(*events.Outcome) bool) recordedEvent {
	t.Helper()
	subject := events.EventSubject(kind, namespace, name)
	var found recordedEvent
	eventually(t, fmt.Sprintf("CloudEvent %s for %s %s", eventType, kind, name), func() error {
		rec.mu.Lock()
		recorded := slices.Clone(rec.events)
		rec.mu.Unlock()
		var seen []string
		for _, e := range recorded {
			if e.subject != subject {
				continue
			}
			if e.err != nil {
				return fmt.Errorf("an event on %s does not decode: %w", e.subject, e.err)
			}
			seen = append(seen, e.msg.Event.Type())
			if e.msg.Event.Type() == eventType && e.outcome() != nil && (match == nil || match(e.outcome())) {
				found = e
				return nil
			}
		}
		return fmt.Errorf("events seen: %v", seen)
	})
	return found
}
