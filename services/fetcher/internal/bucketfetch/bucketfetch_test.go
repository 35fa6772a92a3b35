package bucketfetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/minio/minio-go/v7"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// put stores an object and returns its ETag.
func put(t *testing.T, srv *miniotest.Server, bucket, key, content string) string {
	t.Helper()
	info, err := srv.Client.PutObject(context.Background(), bucket, key, strings.NewReader(content), int64(len(content)), minio.PutObjectOptions{})
	must(t, err)
	return info.ETag
}

// kube returns a Secrets reader over Secrets in the default namespace.
func kube(t *testing.T, data map[string]map[string]string) secrets.Reader {
	t.Helper()
	scheme := runtime.NewScheme()
	must(t, corev1.AddToScheme(scheme))
	b := fake.NewClientBuilder().WithScheme(scheme)
	for name, kv := range data {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Data: map[string][]byte{}}
		for k, v := range kv {
			s.Data[k] = []byte(v)
		}
		b = b.WithObjects(s)
	}
	return secrets.NewKube(b.Build())
}

// credsSecret is the Secret with the server's keys.
func credsSecret(srv *miniotest.Server) map[string]string {
	return map[string]string{"accesskey": srv.AccessKey, "secretkey": srv.SecretKey}
}

// request is a fetch request for a Bucket with spec.
func request(spec sourcev1.BucketSpec) *events.FetchRequested {
	return &events.FetchRequested{
		Job: events.Job{ID: "job-1", RequestedAt: time.Now(),
			Object: events.ObjectRef{Kind: sourcev1.BucketKind, Namespace: "default", Name: "podinfo", UID: "uid-1", Generation: 1}},
		Bucket: &spec,
	}
}

func TestRevisionFormat(t *testing.T) {
	// Flux's index.Digester: "<key> <etag>\n" per key in byte order.
	sum := sha256.Sum256([]byte("a/b.yaml 9a0364b9e99bb480dd25e1f0284c8555\nc d41d8cd98f00b204e9800998ecf8427e\n"))
	want := "sha256:" + hex.EncodeToString(sum[:])
	listing := [][2]string{{"c", "d41d8cd98f00b204e9800998ecf8427e"}, {"a/b.yaml", "9a0364b9e99bb480dd25e1f0284c8555"}}
	for _, order := range [][]int{{0, 1}, {1, 0}} {
		m := map[string]string{}
		for _, i := range order {
			m[listing[i][0]] = listing[i][1]
		}
		if got := Revision(m); got != want {
			t.Errorf("Revision(%v) = %s, want %s", m, got, want)
		}
	}
	empty := sha256.Sum256(nil)
	if got := Revision(nil); got != "sha256:"+hex.EncodeToString(empty[:]) {
		t.Errorf("Revision of an empty bucket = %s", got)
	}
}

func TestFetch(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "podinfo")
	etags := map[string]string{
		"TESTFILE.md":         put(t, srv, "podinfo", "TESTFILE.md", "11111"),
		"deploy/app.yaml":     put(t, srv, "podinfo", "deploy/app.yaml", "kind: ConfigMap\n"),
		"deploy/logo.png":     put(t, srv, "podinfo", "deploy/logo.png", "png"),
		".github/ci.yaml":     put(t, srv, "podinfo", ".github/ci.yaml", "on: push\n"),
		"prefix/a.yaml":       put(t, srv, "podinfo", "prefix/a.yaml", "a"),
		"prefix/sub/b.yaml":   put(t, srv, "podinfo", "prefix/sub/b.yaml", "bkt"),
		"prefixed-sibling.md": put(t, srv, "podinfo", "prefixed-sibling.md", "s"),
	}
	put(t, srv, "podinfo", "empty-dir/", "") // a directory marker, never a file

	srv.MakeBucket(t, "rules")
	rules := "*.png\n/deploy/skip.yaml\n"
	ruleEtags := map[string]string{
		"deploy/app.yaml":  put(t, srv, "rules", "deploy/app.yaml", "kind: ConfigMap\n"),
		"deploy/skip.yaml": put(t, srv, "rules", "deploy/skip.yaml", "skip"),
		"deploy/logo.png":  put(t, srv, "rules", "deploy/logo.png", "png"),
	}
	put(t, srv, "rules", ".sourceignore", rules)

	src := &Source{Secrets: kube(t, map[string]map[string]string{"creds": credsSecret(srv)})}
	pick := func(from map[string]string, keys ...string) map[string]string {
		m := map[string]string{}
		for _, k := range keys {
			m[k] = from[k]
		}
		return m
	}
	cases := []struct {
		name   string
		bucket string
		prefix string
		ignore *string
		etags  map[string]string // the objects indexed
		files  map[string]string // the files downloaded
	}{
		{
			// No default exclusions, unlike Git sources: Flux indexes
			// every object of a bucket.
			name: "whole bucket", bucket: "podinfo", etags: etags,
			files: map[string]string{"TESTFILE.md": "11111", "deploy/app.yaml": "kind: ConfigMap\n", "deploy/logo.png": "png",
				".github/ci.yaml": "on: push\n", "prefix/a.yaml": "a", "prefix/sub/b.yaml": "bkt", "prefixed-sibling.md": "s"},
		},
		{
			name: "prefix", bucket: "podinfo", prefix: "prefix/",
			etags: pick(etags, "prefix/a.yaml", "prefix/sub/b.yaml"),
			files: map[string]string{"prefix/a.yaml": "a", "prefix/sub/b.yaml": "bkt"},
		},
		{
			name: "spec.ignore", bucket: "podinfo", ignore: new(string("*.png\n/prefix*\n.github/\n")),
			etags: pick(etags, "TESTFILE.md", "deploy/app.yaml"),
			files: map[string]string{"TESTFILE.md": "11111", "deploy/app.yaml": "kind: ConfigMap\n"},
		},
		{
			// The rules object is fetched, not indexed, and lands in the
			// artifact as in Flux.
			name: ".sourceignore", bucket: "rules",
			etags: pick(ruleEtags, "deploy/app.yaml"),
			files: map[string]string{"deploy/app.yaml": "kind: ConfigMap\n", ".sourceignore": rules},
		},
		{
			name: ".sourceignore at the root applies under a prefix", bucket: "rules", prefix: "deploy/",
			etags: pick(ruleEtags, "deploy/app.yaml"),
			files: map[string]string{"deploy/app.yaml": "kind: ConfigMap\n", ".sourceignore": rules},
		},
		{
			name: "spec.ignore after .sourceignore", bucket: "rules", ignore: new(string("!*.png\n")),
			etags: pick(ruleEtags, "deploy/app.yaml", "deploy/logo.png"),
			files: map[string]string{"deploy/app.yaml": "kind: ConfigMap\n", "deploy/logo.png": "png", ".sourceignore": rules},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := request(sourcev1.BucketSpec{Provider: sourcev1.BucketProviderGeneric, BucketName: tc.bucket, Endpoint: srv.Endpoint,
				Insecure: true, Prefix: tc.prefix, Ignore: tc.ignore, SecretRef: &meta.LocalObjectReference{Name: "creds"}})
			rev, content, got, err := sourcetest.Fetch(t, src, req)
			must(t, err)
			sum := digestHex(tc.etags)
			want := &source.Content{Root: content.Root, Revision: "sha256:" + sum, ArtifactName: sum + ".tar.gz",
				EventMessage: "stored artifact with " + strconv.Itoa(len(tc.etags)) + " fetched files from '" + tc.bucket + "' bucket"}
			if rev != want.Revision || !reflect.DeepEqual(content, want) {
				t.Errorf("resolved %s, content %+v\nwant %+v", rev, content, want)
			}
			if !reflect.DeepEqual(got, tc.files) {
				t.Errorf("files = %v\nwant    %v", got, tc.files)
			}
		})
	}
}

func TestRevisionFollowsTheBucket(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "testbucket")
	put(t, srv, "testbucket", "TESTFILE.md", "11111")
	put(t, srv, "testbucket", "other.md", "other")
	src := &Source{Secrets: kube(t, map[string]map[string]string{"creds": credsSecret(srv)})}
	req := request(sourcev1.BucketSpec{BucketName: "testbucket", Endpoint: srv.Endpoint, Insecure: true,
		SecretRef: &meta.LocalObjectReference{Name: "creds"}})
	resolve := func() string {
		t.Helper()
		res, err := src.Resolve(context.Background(), req)
		must(t, err)
		return res.Revision()
	}

	first := resolve()
	if again := resolve(); again != first {
		t.Errorf("revision changed with the bucket unchanged: %s, then %s", first, again)
	}
	put(t, srv, "testbucket", "TESTFILE.md", "22222")
	changed := resolve()
	if changed == first {
		t.Errorf("revision %s did not change when an object changed", first)
	}
	// Writing the same content again gives the same ETag, and revision.
	put(t, srv, "testbucket", "TESTFILE.md", "11111")
	if back := resolve(); back != first {
		t.Errorf("revision with the first content back = %s, want %s", back, first)
	}
}

func TestDownloadFollowsChangesAfterListing(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "bkt")
	put(t, srv, "bkt", "kept.md", "kept")
	put(t, srv, "bkt", "changed.md", "before")
	put(t, srv, "bkt", "deleted.md", "deleted")
	src := &Source{Secrets: kube(t, map[string]map[string]string{"creds": credsSecret(srv)})}
	req := request(sourcev1.BucketSpec{BucketName: "bkt", Endpoint: srv.Endpoint, Insecure: true,
		SecretRef: &meta.LocalObjectReference{Name: "creds"}})
	res, err := src.Resolve(context.Background(), req)
	must(t, err)
	listed := res.Revision()

	// Between the listing and the download, one object changes and one
	// disappears: as in Flux, the content and its revision follow.
	after := map[string]string{"kept.md": "", "changed.md": put(t, srv, "bkt", "changed.md", "after")}
	must(t, srv.Client.RemoveObject(context.Background(), "bkt", "deleted.md", minio.RemoveObjectOptions{}))
	info, err := srv.Client.StatObject(context.Background(), "bkt", "kept.md", minio.StatObjectOptions{})
	must(t, err)
	after["kept.md"] = info.ETag

	dir := t.TempDir()
	content, err := res.Download(context.Background(), dir)
	must(t, err)
	if want := Revision(after); content.Revision != want || content.Revision == listed {
		t.Errorf("content revision = %s, want %s (listed %s)", content.Revision, want, listed)
	}
	if want := map[string]string{"kept.md": "kept", "changed.md": "after"}; !reflect.DeepEqual(sourcetest.Files(t, dir, nil), want) {
		t.Errorf("files = %v, want %v", sourcetest.Files(t, dir, nil), want)
	}
	if !strings.HasPrefix(content.EventMessage, "stored artifact with 2 fetched files") {
		t.Errorf("event message = %q", content.EventMessage)
	}
}

func TestFailures(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "testbucket")
	put(t, srv, "testbucket", "small.md", "small")
	put(t, srv, "testbucket", "big.bin", strings.Repeat("x", 2048))
	closed := "127.0.0.1:1"
	src := &Source{
		Secrets: kube(t, map[string]map[string]string{
			"creds":   credsSecret(srv),
			"wrong":   {"accesskey": srv.AccessKey, "secretkey": "not-the-secret-key"},
			"unknown": {"accesskey": "nobody", "secretkey": "not-the-secret-key"},
			"partial": {"accesskey": srv.AccessKey},
			"proxy":   {"username": "u"},
		}),
		MaxFileSize: 1024,
		MaxRetries:  1,
	}
	creds := &meta.LocalObjectReference{Name: "creds"}
	cases := []struct {
		name     string
		spec     sourcev1.BucketSpec
		resolved bool // Resolve succeeds, Download fails
		reason   string
		handling failure.Handling
		message  string
	}{
		{
			name:   "wrong secret key",
			spec:   sourcev1.BucketSpec{SecretRef: &meta.LocalObjectReference{Name: "wrong"}},
			reason: sourcev1.BucketOperationFailedReason, handling: failure.Transient,
			message: "failed to confirm existence of 'testbucket' bucket: ",
		},
		{
			name:   "unknown access key",
			spec:   sourcev1.BucketSpec{SecretRef: &meta.LocalObjectReference{Name: "unknown"}},
			reason: sourcev1.BucketOperationFailedReason, handling: failure.Transient,
			message: "failed to confirm existence of 'testbucket' bucket: ",
		},
		{
			name:   "anonymous access to a private bucket",
			spec:   sourcev1.BucketSpec{},
			reason: sourcev1.BucketOperationFailedReason, handling: failure.Transient,
			message: "failed to confirm existence of 'testbucket' bucket: Access Denied",
		},
		{
			name:   "missing bucket",
			spec:   sourcev1.BucketSpec{BucketName: "nope", SecretRef: creds},
			reason: sourcev1.BucketOperationFailedReason, handling: failure.Transient,
			message: "bucket 'nope' not found",
		},
		{
			name:   "endpoint that does not answer",
			spec:   sourcev1.BucketSpec{Endpoint: closed, SecretRef: creds},
			reason: sourcev1.BucketOperationFailedReason, handling: failure.Transient,
			message: "failed to confirm existence of 'testbucket' bucket: ",
		},
		{
			name:   "missing secret",
			spec:   sourcev1.BucketSpec{SecretRef: &meta.LocalObjectReference{Name: "absent"}},
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient,
			message: `failed to get secret 'default/absent': secrets "absent" not found`,
		},
		{
			name:   "secret without both keys",
			spec:   sourcev1.BucketSpec{SecretRef: &meta.LocalObjectReference{Name: "partial"}},
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
			message: "invalid 'partial' secret data: required fields 'accesskey' and 'secretkey'",
		},
		{
			name:   "proxy secret without address",
			spec:   sourcev1.BucketSpec{SecretRef: creds, ProxySecretRef: &meta.LocalObjectReference{Name: "proxy"}},
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
			message: "failed to get proxy URL: secret 'default/proxy' has no 'address' key",
		},
		{
			name:   "sts provider of another bucket provider",
			spec:   sourcev1.BucketSpec{STS: &sourcev1.BucketSTSSpec{Provider: sourcev1.STSProviderAmazon, Endpoint: "https://sts.amazonaws.com"}},
			reason: sourcev1.InvalidSTSConfigurationReason, handling: failure.Stalling,
			message: "STS provider 'aws' is not supported for 'generic' bucket provider",
		},
		{
			name: "sts aws with a secret",
			spec: sourcev1.BucketSpec{Provider: sourcev1.BucketProviderAmazon, STS: &sourcev1.BucketSTSSpec{Provider: sourcev1.STSProviderAmazon,
				Endpoint: "https://sts.amazonaws.com", SecretRef: &meta.LocalObjectReference{Name: "partial"}}},
			reason: sourcev1.InvalidSTSConfigurationReason, handling: failure.Stalling,
			message: "spec.sts.secretRef is not required for the 'aws' STS provider",
		},
		{
			name: "sts aws endpoint not AWS's",
			spec: sourcev1.BucketSpec{Provider: sourcev1.BucketProviderAmazon, STS: &sourcev1.BucketSTSSpec{Provider: sourcev1.STSProviderAmazon,
				Endpoint: "https://sts.example.com"}},
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
			message: "AWS authentication failed: invalid STS endpoint: 'https://sts.example.com'. must match ^https://",
		},
		{
			name: "sts ldap secret without username",
			spec: sourcev1.BucketSpec{STS: &sourcev1.BucketSTSSpec{Provider: sourcev1.STSProviderLDAP, Endpoint: "https://sts.example.com",
				SecretRef: &meta.LocalObjectReference{Name: "partial"}}},
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient,
			message: "invalid 'partial' secret data for 'ldap' STS provider: required fields username, password",
		},
		{
			name:   "sts ldap endpoint that does not answer",
			spec:   sourcev1.BucketSpec{STS: &sourcev1.BucketSTSSpec{Provider: sourcev1.STSProviderLDAP, Endpoint: "http://" + closed}},
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient,
			message: "STS authentication failed: AssumeRoleWithLDAPIdentity at 'http://" + closed + "'",
		},
		{
			name:   "endpoint with a path",
			spec:   sourcev1.BucketSpec{Endpoint: "minio:9000/path", SecretRef: creds},
			reason: sourcev1.URLInvalidReason, handling: failure.Stalling,
			message: "invalid endpoint 'minio:9000/path': ",
		},
		{
			name:   "invalid bucket name",
			spec:   sourcev1.BucketSpec{BucketName: "ab", SecretRef: creds},
			reason: sourcev1.BucketOperationFailedReason, handling: failure.Stalling,
			message: "invalid bucket name 'ab': Bucket name cannot be shorter than 3 characters",
		},
		{
			name:     "object over the size limit",
			spec:     sourcev1.BucketSpec{SecretRef: creds},
			resolved: true,
			reason:   sourcev1.BucketOperationFailedReason, handling: failure.Final,
			message: "fetch from bucket 'testbucket' failed: file too large: object 'big.bin' is 2048 bytes, over the limit of 1024",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			if spec.BucketName == "" {
				spec.BucketName = "testbucket"
			}
			if spec.Endpoint == "" {
				spec.Endpoint = srv.Endpoint
			}
			spec.Insecure = true
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := src.Resolve(ctx, request(spec))
			if tc.resolved {
				must(t, err)
				dir := t.TempDir()
				_, err = res.Download(ctx, dir)
				if left := sourcetest.Files(t, dir, nil); len(left) != 0 {
					t.Errorf("a failed download left files: %v", left)
				}
			} else if err == nil {
				t.Fatal("resolve succeeded")
			}
			sourcetest.CheckFailure(t, err, tc.reason, tc.handling, tc.message)
			if strings.Contains(err.Error(), srv.SecretKey) || strings.Contains(err.Error(), "not-the-secret-key") {
				t.Errorf("message reveals a secret key: %s", err)
			}
		})
	}
}

func TestAWSProviderCredentialChain(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "testbucket")
	put(t, srv, "testbucket", "TESTFILE.md", "11111")
	// The first link of the chain: the AWS_* environment.
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	src := &Source{}
	req := request(sourcev1.BucketSpec{Provider: sourcev1.BucketProviderAmazon, BucketName: "testbucket", Endpoint: srv.Endpoint,
		Insecure: true, Region: "us-east-1"})
	_, content, got, err := sourcetest.Fetch(t, src, req)
	must(t, err)
	if want := map[string]string{"TESTFILE.md": "11111"}; !reflect.DeepEqual(got, want) {
		t.Errorf("files = %v, want %v", got, want)
	}
	if content.EventMessage != "stored artifact with 1 fetched files from 'testbucket' bucket" {
		t.Errorf("event message = %q", content.EventMessage)
	}

	// The same spec as generic is anonymous: the bucket is private.
	req.Bucket.Provider = sourcev1.BucketProviderGeneric
	_, _, _, err = sourcetest.Fetch(t, src, req)
	sourcetest.CheckFailure(t, err, sourcev1.BucketOperationFailedReason, failure.Transient, "Access Denied")
}

// TestUnsafeKeys checks the path of every key before anything is fetched.
// MinIO refuses to store keys with ".." elements, so the hostile listing is
// made by hand.
func TestUnsafeKeys(t *testing.T) {
	cases := []struct {
		key     string
		path    string // "" when refused
		message string
	}{
		{key: "a/b.yaml", path: "a/b.yaml"},
		{key: "a//b.yaml", path: "a/b.yaml"},
		{key: "./a.yaml", path: "a.yaml"},
		{key: "../x", message: "unsafe object key '../x': '..' element"},
		{key: "a/../../x", message: "unsafe object key 'a/../../x': '..' element"},
		{key: "a/..", message: "unsafe object key 'a/..': '..' element"},
		{key: "/etc/passwd", message: "unsafe object key '/etc/passwd': absolute path"},
		{key: ".", message: "unsafe object key '.': no file name"},
		{key: "a\x00b", message: "NUL character"},
	}
	for _, tc := range cases {
		got, err := objectPath(tc.key)
		if tc.path != "" {
			if err != nil || got != filepath.FromSlash(tc.path) {
				t.Errorf("objectPath(%q) = %q, %v; want %q", tc.key, got, err, tc.path)
			}
			continue
		}
		if err == nil || !errors.Is(err, errUnsafeKey) || !strings.Contains(err.Error(), tc.message) {
			t.Errorf("objectPath(%q) = %q, %v; want an error containing %q", tc.key, got, err, tc.message)
		}
	}

	// A listing with a hostile key fails before any object is fetched
	// (the client points nowhere) and writes nothing.
	client, err := minio.New("127.0.0.1:1", &minio.Options{})
	must(t, err)
	parent := t.TempDir()
	dir := filepath.Join(parent, "download")
	must(t, os.Mkdir(dir, 0o755))
	r := &resolved{src: &Source{}, store: &s3Store{client: client, bucket: "hostile"}, bucket: "hostile", objects: map[string]object{
		"fine.yaml": {etag: "1"}, "../escape.yaml": {etag: "2"},
	}}
	_, err = r.Download(context.Background(), dir)
	sourcetest.CheckFailure(t, err, sourcev1.BucketOperationFailedReason, failure.Final,
		"fetch from bucket 'hostile' failed: unsafe object key '../escape.yaml': '..' element")
	if left := sourcetest.Files(t, parent, nil); len(left) != 0 {
		t.Errorf("files written: %v", left)
	}
}

func TestMinIORefusesDotDotKeys(t *testing.T) {
	// The premise of TestUnsafeKeys: a real server does not hold such keys,
	// so the hostile listing cannot come from it.
	srv := miniotest.New(t)
	srv.MakeBucket(t, "bkt")
	for _, key := range []string{"../x", "a/../../x"} {
		_, err := srv.Client.PutObject(context.Background(), "bkt", key, strings.NewReader("x"), 1, minio.PutObjectOptions{})
		if err == nil {
			t.Errorf("MinIO stored key %q", key)
		}
	}
	var keys []string
	for o := range srv.Client.ListObjects(context.Background(), "bkt", minio.ListObjectsOptions{Recursive: true}) {
		must(t, o.Err)
		keys = append(keys, o.Key)
	}
	if len(keys) != 0 {
		t.Errorf("keys = %v", slices.Clip(keys))
	}
}

func TestClashingKeysAreFinal(t *testing.T) {
	// MinIO refuses to hold an object under another one ("a" and "a/b"),
	// but other servers may: writing the second fails for good.
	r := &resolved{bucket: "bkt"}
	for _, cause := range []error{syscall.ENOTDIR, syscall.EISDIR, fs.ErrExist} {
		err := r.fileError("a/b", &fs.PathError{Op: "openat", Path: "a/b", Err: cause})
		sourcetest.CheckFailure(t, err, sourcev1.BucketOperationFailedReason, failure.Final, "fetch from bucket 'bkt' failed: failed to write 'a/b' object: openat a/b: ")
	}
	sourcetest.CheckFailure(t, r.fileError("a", syscall.ENOSPC), sourcev1.BucketOperationFailedReason, failure.Transient, "no space left on device")
}

func TestNoCluster(t *testing.T) {
	src := &Source{Secrets: secrets.Unavailable{Err: errors.New("no kubeconfig")}}
	req := request(sourcev1.BucketSpec{BucketName: "bkt", Endpoint: "127.0.0.1:1", SecretRef: &meta.LocalObjectReference{Name: "creds"}})
	_, err := src.Resolve(context.Background(), req)
	sourcetest.CheckFailure(t, err, sourcev1.AuthenticationFailedReason, failure.Transient,
		"failed to get secret 'default/creds': no Kubernetes API server is configured: no kubeconfig")
	req.Bucket = nil
	_, err = src.Resolve(context.Background(), req)
	sourcetest.CheckFailure(t, err, source.InvalidSpecReason, failure.Stalling, "fetch request for Bucket 'default/podinfo' has no Bucket spec")
}

func TestTimeout(t *testing.T) {
	src := &Source{}
	req := request(sourcev1.BucketSpec{})
	if got := src.Timeout(req); got != source.DefaultTimeout {
		t.Errorf("default timeout = %s", got)
	}
	req.Bucket.Timeout = &metav1.Duration{Duration: 5 * time.Second}
	if got := src.Timeout(req); got != 5*time.Second {
		t.Errorf("timeout = %s, want 5s", got)
	}
}
