package httpsource

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fluxcd/pkg/apis/acl"
	"github.com/fluxcd/pkg/apis/meta"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/sourcekit"
)

// tarball is a gzipped tarball of files (name to content).
func tarball(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, content := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// server serves body at every path with an ETag, answering a matching
// If-None-Match with 304, and counts the requests.
type server struct {
	body        atomic.Value // []byte
	contentType string
	etag        atomic.Value // string
	status      int
	requests    atomic.Int64
	conditional atomic.Int64
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	if s.status != 0 {
		w.WriteHeader(s.status)
		return
	}
	etag := s.etag.Load().(string)
	if inm := r.Header.Get("If-None-Match"); inm != "" {
		s.conditional.Add(1)
		if inm == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	w.Header().Set("ETag", etag)
	if s.contentType != "" {
		w.Header().Set("Content-Type", s.contentType)
	}
	_, _ = w.Write(s.body.Load().([]byte))
}

func newServer(t *testing.T, body []byte, contentType string) (*server, string) {
	s := &server{contentType: contentType}
	s.body.Store(body)
	s.etag.Store(`"v1"`)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts.URL
}

func fetch(t *testing.T, f *Fetcher, url string, prev *meta.Artifact) (*sourcekit.Result, error) {
	t.Helper()
	spec, _ := json.Marshal(map[string]any{"url": url, "interval": "1m"})
	return f.Fetch(context.Background(), &sourcekit.Request{Namespace: "ns", Name: "n", Spec: spec, Previous: prev, Dir: t.TempDir()})
}

func TestFetchTarballThenConditional(t *testing.T) {
	srv, url := newServer(t, tarball(t, map[string]string{"./a/b.yaml": "kind: X\n", "c.txt": "c"}), "application/octet-stream")
	f := &Fetcher{MaxSize: 1 << 20}
	res, err := fetch(t, f, url+"/bundle.tar.gz", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Revision, "sha256:") || res.Metadata[ETagKey] != `"v1"` {
		t.Fatalf("result %+v", res)
	}
	if b, err := os.ReadFile(filepath.Join(res.Dir, "a", "b.yaml")); err != nil || string(b) != "kind: X\n" {
		t.Fatalf("a/b.yaml: %q, %v", b, err)
	}
	prev := &meta.Artifact{Revision: res.Revision, Metadata: res.Metadata}
	res2, err := fetch(t, f, url+"/bundle.tar.gz", prev)
	if err != nil || !res2.Unchanged {
		t.Fatalf("second fetch: %+v, %v; want unchanged", res2, err)
	}
	if srv.requests.Load() != 2 || srv.conditional.Load() != 1 {
		t.Errorf("requests %d (conditional %d), want 2 (1)", srv.requests.Load(), srv.conditional.Load())
	}
	srv.body.Store(tarball(t, map[string]string{"c.txt": "changed"}))
	srv.etag.Store(`"v2"`)
	res3, err := fetch(t, f, url+"/bundle.tar.gz", prev)
	if err != nil || res3.Unchanged || res3.Revision == res.Revision {
		t.Fatalf("changed content: %+v, %v", res3, err)
	}
}

func TestFetchSingleFile(t *testing.T) {
	_, url := newServer(t, []byte("hello"), "text/plain")
	res, err := fetch(t, &Fetcher{MaxSize: 1 << 20}, url+"/dir/hello.txt", nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(res.Dir, "hello.txt")); err != nil || string(b) != "hello" {
		t.Fatalf("hello.txt: %q, %v", b, err)
	}
}

func TestFetchRefuses(t *testing.T) {
	escaping := tarball(t, map[string]string{"../../etc/passwd": "x"})
	absolute := tarball(t, map[string]string{"/etc/passwd": "x"})
	for _, tc := range []struct {
		name     string
		body     []byte
		ctype    string
		status   int
		path     string
		url      string
		reason   string
		handling failure.Handling
	}{
		{name: "path escaping", body: escaping, path: "/x.tar.gz", reason: sourcekit.InvalidArchiveReason, handling: failure.Final},
		{name: "absolute path", body: absolute, path: "/x.tgz", reason: sourcekit.InvalidArchiveReason, handling: failure.Final},
		{name: "not gzip", body: []byte("plain"), path: "/x.tar.gz", reason: sourcekit.InvalidArchiveReason, handling: failure.Final},
		{name: "oversized", body: bytes.Repeat([]byte("a"), 2048), path: "/big", reason: sourcekit.TooLargeReason, handling: failure.Final},
		{name: "oversized tarball", body: tarball(t, map[string]string{"a": strings.Repeat("a", 4096)}), path: "/t.tar.gz", reason: sourcekit.TooLargeReason, handling: failure.Final},
		{name: "html", body: []byte("<html>"), ctype: "text/html; charset=utf-8", path: "/x", reason: ContentTypeReason, handling: failure.Final},
		{name: "404", status: http.StatusNotFound, path: "/x", reason: "URLInvalid", handling: failure.Final},
		{name: "503", status: http.StatusServiceUnavailable, path: "/x", reason: "URLInvalid", handling: failure.Transient},
		{name: "401", status: http.StatusUnauthorized, path: "/x", reason: "AuthenticationFailed", handling: failure.Stalling},
		{name: "unreachable", url: "http://127.0.0.1:1/x", reason: "URLInvalid", handling: failure.Transient},
		{name: "credentials in the URL", url: "http://user:pw@example.com/x", reason: "URLInvalid", handling: failure.Stalling},
		{name: "not http", url: "ftp://example.com/x", reason: "URLInvalid", handling: failure.Stalling},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.url
			if url == "" {
				srv, base := newServer(t, tc.body, tc.ctype)
				srv.status = tc.status
				url = base + tc.path
			}
			_, err := fetch(t, &Fetcher{MaxSize: 1024}, url, nil)
			f := failure.As(err)
			if f == nil || f.Reason != tc.reason || f.Handling != tc.handling {
				t.Fatalf("err %v (%+v), want reason %s, handling %s", err, f, tc.reason, tc.handling)
			}
			if strings.Contains(err.Error(), "pw") {
				t.Errorf("the message holds the credentials: %s", err)
			}
		})
	}
}

// TestFetchAuthentication: the Secret of spec.secretRef gives a bearer
// token or basic credentials; a missing Secret stalls the source.
func TestFetchAuthentication(t *testing.T) {
	var got atomic.Value
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("Authorization"))
		_, _ = w.Write([]byte("x"))
	}))
	t.Cleanup(ts.Close)
	secrets := fake.NewClientBuilder().WithObjects(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "token"}, Data: map[string][]byte{"token": []byte("t0k")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "basic"}, Data: map[string][]byte{"username": []byte("u"), "password": []byte("p")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "empty"}},
	).Build()
	f := &Fetcher{MaxSize: 1024}
	for _, tc := range []struct {
		secret, want, reason string
	}{
		{secret: "token", want: "Bearer t0k"},
		{secret: "basic", want: "Basic dTpw"},
		{secret: "empty", reason: "AuthenticationFailed"},
		{secret: "missing", reason: "AuthenticationFailed"},
	} {
		got.Store("")
		spec, _ := json.Marshal(map[string]any{"url": ts.URL + "/f", "interval": "1m", "secretRef": map[string]string{"name": tc.secret}})
		_, err := f.Fetch(context.Background(), &sourcekit.Request{Namespace: "ns", Name: "n", Spec: spec, Dir: t.TempDir(), Secrets: secrets})
		if tc.reason != "" {
			if fe := failure.As(err); fe == nil || fe.Reason != tc.reason || fe.Handling != failure.Stalling {
				t.Errorf("secret %s: %v, want a stalled %s", tc.secret, err, tc.reason)
			}
			continue
		}
		if err != nil || got.Load() != tc.want {
			t.Errorf("secret %s: Authorization %q, %v; want %q", tc.secret, got.Load(), err, tc.want)
		}
	}
}

// TestFetchRefusedByTheEgressPolicy: with the policy installed, a URL at a
// refused address (loopback here) stalls with AccessDenied, the server
// sees no request, and the message names neither the address dialled nor
// what answered there.
func TestFetchRefusedByTheEgressPolicy(t *testing.T) {
	srv, url := newServer(t, []byte("secret"), "text/plain")
	egress.Install(&egress.Policy{})
	defer egress.Install(nil)
	_, err := fetch(t, &Fetcher{MaxSize: 1024, Client: &http.Client{Transport: egress.Transport()}}, url+"/x", nil)
	f := failure.As(err)
	if f == nil || f.Reason != acl.AccessDeniedReason || f.Handling != failure.Stalling {
		t.Fatalf("err %v (%+v), want AccessDenied, stalling", err, f)
	}
	if want := "failed to fetch " + url + "/x: " + egress.ErrRefused.Error(); err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
	if srv.requests.Load() != 0 {
		t.Errorf("the refused server got %d requests", srv.requests.Load())
	}
}
