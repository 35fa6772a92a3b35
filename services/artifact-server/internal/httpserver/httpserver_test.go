package httpserver

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/headwater-gitops/headwater/pkg/storage"
)

const (
	artifactKey = "gitrepository/default/podinfo/0123abcd.tar.gz"
	secret      = "TOP-SECRET-OUTSIDE-THE-STORAGE-ROOT"
)

// fixture is a real directory storage served by a real listener, with a
// secret file beside the storage root that must never be served.
type fixture struct {
	store    *storage.Dir
	root     string // storage root
	srv      *httptest.Server
	reg      *prometheus.Registry
	artifact []byte
	info     storage.Info
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "storage")
	store, err := storage.NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := os.WriteFile(filepath.Join(base, "secret.txt"), []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	artifact := make([]byte, 4096)
	for i := range artifact {
		artifact[i] = byte(i * 7)
	}
	info, err := store.Put(ctx, artifactKey, bytes.NewReader(artifact))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(ctx, storage.StagingKey("job-1"), strings.NewReader("staged "+secret)); err != nil {
		t.Fatal(err)
	}
	// A hidden file inside a source directory, like the temporary file of
	// an atomic write.
	if err := os.WriteFile(filepath.Join(root, "gitrepository/default/podinfo/.0123abcd.tar.gz.tmp-1"), []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	// Symlinks planted to escape the root: a file and a directory.
	if err := os.Symlink("../../../../secret.txt", filepath.Join(root, "gitrepository/default/podinfo/evil.tar.gz")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../..", filepath.Join(root, "gitrepository/default/escape")); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv := httptest.NewServer(New(store, reg, logr.Discard()))
	t.Cleanup(srv.Close)
	return &fixture{store: store, root: root, srv: srv, reg: reg, artifact: artifact, info: info}
}

func (f *fixture) do(t *testing.T, method, target string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+target, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// raw sends a request line exactly as given, so no client cleans or
// re-encodes the target.
func (f *fixture) raw(t *testing.T, target string) (int, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: artifacts\r\nConnection: close\r\n\r\n", target); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

func TestServeArtifact(t *testing.T) {
	f := newFixture(t)
	lastModified := f.info.ModTime.UTC().Format(http.TimeFormat)
	tests := []struct {
		name     string
		method   string
		header   map[string]string
		wantCode int
		wantBody []byte
		wantHdr  map[string]string
	}{
		{
			name: "get", method: http.MethodGet, wantCode: http.StatusOK, wantBody: f.artifact,
			wantHdr: map[string]string{
				"Content-Type":   "application/gzip",
				"Content-Length": fmt.Sprint(len(f.artifact)),
				"ETag":           f.info.ETag,
				"Last-Modified":  lastModified,
				"Accept-Ranges":  "bytes",
			},
		},
		{
			name: "head", method: http.MethodHead, wantCode: http.StatusOK, wantBody: []byte{},
			wantHdr: map[string]string{
				"Content-Type":   "application/gzip",
				"Content-Length": fmt.Sprint(len(f.artifact)),
				"ETag":           f.info.ETag,
			},
		},
		{
			name: "range", method: http.MethodGet, header: map[string]string{"Range": "bytes=100-199"},
			wantCode: http.StatusPartialContent, wantBody: f.artifact[100:200],
			wantHdr: map[string]string{
				"Content-Range":  fmt.Sprintf("bytes 100-199/%d", len(f.artifact)),
				"Content-Length": "100",
			},
		},
		{
			name: "suffix range", method: http.MethodGet, header: map[string]string{"Range": "bytes=-10"},
			wantCode: http.StatusPartialContent, wantBody: f.artifact[len(f.artifact)-10:],
		},
		{
			name: "unsatisfiable range", method: http.MethodGet, header: map[string]string{"Range": "bytes=999999-"},
			wantCode: http.StatusRequestedRangeNotSatisfiable,
		},
		{
			name: "if-none-match", method: http.MethodGet, header: map[string]string{"If-None-Match": f.info.ETag},
			wantCode: http.StatusNotModified, wantBody: []byte{},
			wantHdr: map[string]string{"ETag": f.info.ETag},
		},
		{
			name: "if-none-match other etag", method: http.MethodGet, header: map[string]string{"If-None-Match": `"other"`},
			wantCode: http.StatusOK, wantBody: f.artifact,
		},
		{
			name: "if-modified-since", method: http.MethodGet, header: map[string]string{"If-Modified-Since": lastModified},
			wantCode: http.StatusNotModified, wantBody: []byte{},
		},
		{
			name: "if-range with stale etag sends everything", method: http.MethodGet,
			header:   map[string]string{"Range": "bytes=0-9", "If-Range": `"stale"`},
			wantCode: http.StatusOK, wantBody: f.artifact,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := f.do(t, tt.method, "/"+artifactKey, tt.header)
			if resp.StatusCode != tt.wantCode {
				t.Fatalf("status = %d, want %d (body %q)", resp.StatusCode, tt.wantCode, body)
			}
			if tt.wantBody != nil && !bytes.Equal(body, tt.wantBody) {
				t.Errorf("body = %d bytes, want %d bytes of the artifact", len(body), len(tt.wantBody))
			}
			for k, v := range tt.wantHdr {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestNotFound(t *testing.T) {
	f := newFixture(t)
	targets := []string{
		"/gitrepository/default/podinfo/missing.tar.gz",
		"/",
		"/gitrepository",
		"/gitrepository/default/podinfo",
		"/gitrepository/default/podinfo/",
		"/gitrepository/default/podinfo/0123abcd.tar.gz/x", // a file used as a directory
	}
	for _, target := range targets {
		t.Run(target, func(t *testing.T) {
			resp, body := f.do(t, http.MethodGet, target, nil)
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("status = %d, want 404 (body %q)", resp.StatusCode, body)
			}
			if bytes.Contains(body, []byte("0123abcd")) {
				t.Errorf("404 body lists directory content: %q", body)
			}
		})
	}
}

// TestNeverEscapes sends hostile request lines as they are and proves that
// none is served, in particular not the secret beside the storage root.
func TestNeverEscapes(t *testing.T) {
	f := newFixture(t)
	// The raw client reaches a real artifact, so a 404 below means refusal.
	if code, body := f.raw(t, "/"+artifactKey); code != http.StatusOK || !bytes.Equal(body, f.artifact) {
		t.Fatalf("raw GET of the artifact: status %d, %d bytes", code, len(body))
	}
	targets := []string{
		"/../secret.txt",
		"/../../etc/passwd",
		"/gitrepository/../../secret.txt",
		"/gitrepository/default/podinfo/../../../../secret.txt",
		"/%2e%2e/secret.txt",
		"/%2E%2E/%2e%2e/etc/passwd",
		"/..%2fsecret.txt",
		"/gitrepository/default/podinfo/%2e%2e/%2e%2e/%2e%2e/%2e%2e/secret.txt",
		"//etc/passwd",
		"//secret.txt",
		"/gitrepository//default/podinfo/0123abcd.tar.gz",
		"/gitrepository/./default/podinfo/0123abcd.tar.gz",
		"/a/./b",
		"/./" + artifactKey,
		"/" + storage.StagingKey("job-1"),
		"/.staging/x",
		"/.staging/",
		"/%2estaging/" + strings.TrimPrefix(storage.StagingKey("job-1"), ".staging/"),
		"/gitrepository/default/podinfo/.0123abcd.tar.gz.tmp-1",
		"/gitrepository/default/podinfo/evil.tar.gz", // symlink to the secret
		"/gitrepository/default/escape/secret.txt",   // symlinked directory
		"/gitrepository/default/podinfo/\\..\\..\\..\\..\\secret.txt",
		"/gitrepository/default/podinfo/%00",
	}
	for _, target := range targets {
		t.Run(target, func(t *testing.T) {
			code, body := f.raw(t, target)
			if code != http.StatusNotFound {
				t.Errorf("status = %d, want 404", code)
			}
			if bytes.Contains(body, []byte(secret)) || bytes.Contains(body, []byte("root:")) {
				t.Fatalf("served content from outside the storage: %q", body)
			}
		})
	}
}

func TestMethodNotAllowed(t *testing.T) {
	f := newFixture(t)
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
		t.Run(method, func(t *testing.T) {
			resp, _ := f.do(t, method, "/"+artifactKey, nil)
			if resp.StatusCode != http.StatusMethodNotAllowed {
				t.Fatalf("status = %d, want 405", resp.StatusCode)
			}
			if got := resp.Header.Get("Allow"); got != "GET, HEAD" {
				t.Errorf("Allow = %q", got)
			}
		})
	}
	// The artifact is still there: nothing was written or removed.
	if _, err := f.store.Stat(context.Background(), artifactKey); err != nil {
		t.Fatal(err)
	}
}

func TestLatest(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	latest := "gitrepository/default/podinfo/" + storage.LatestName
	if err := f.store.SetLatest(ctx, latest, artifactKey, time.Now()); err != nil {
		t.Fatal(err)
	}
	resp, body := f.do(t, http.MethodGet, "/"+latest, nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, f.artifact) {
		t.Fatalf("latest: status %d, %d bytes", resp.StatusCode, len(body))
	}
	if resp.Header.Get("ETag") != f.info.ETag || resp.Header.Get("Content-Type") != "application/gzip" {
		t.Errorf("latest headers: ETag %q Content-Type %q", resp.Header.Get("ETag"), resp.Header.Get("Content-Type"))
	}

	// Moving the pointer serves the new artifact under a new ETag.
	next := []byte("the next artifact")
	nextKey := "gitrepository/default/podinfo/4567ef.tar.gz"
	nextInfo, err := f.store.Put(ctx, nextKey, bytes.NewReader(next))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.SetLatest(ctx, latest, nextKey, time.Now()); err != nil {
		t.Fatal(err)
	}
	resp, body = f.do(t, http.MethodGet, "/"+latest, map[string]string{"If-None-Match": f.info.ETag})
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, next) {
		t.Fatalf("moved latest: status %d, body %q", resp.StatusCode, body)
	}
	if resp.Header.Get("ETag") != nextInfo.ETag {
		t.Errorf("moved latest ETag = %q, want %q", resp.Header.Get("ETag"), nextInfo.ETag)
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t)
	f.do(t, http.MethodGet, "/"+artifactKey, nil)
	f.do(t, http.MethodGet, "/"+artifactKey, map[string]string{"Range": "bytes=0-9"})
	f.do(t, http.MethodGet, "/missing", nil)
	f.do(t, http.MethodPost, "/"+artifactKey, nil)

	if got := testutil.ToFloat64(f.handler(t).m.requests.WithLabelValues("200", "GET")); got != 1 {
		t.Errorf("requests{200,GET} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(f.handler(t).m.requests.WithLabelValues("206", "GET")); got != 1 {
		t.Errorf("requests{206,GET} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(f.handler(t).m.requests.WithLabelValues("404", "GET")); got != 1 {
		t.Errorf("requests{404,GET} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(f.handler(t).m.requests.WithLabelValues("405", "other")); got != 1 {
		t.Errorf("requests{405,other} = %v, want 1", got)
	}
	// The bytes count includes the full artifact, the range and the small
	// error bodies.
	if got := testutil.ToFloat64(f.handler(t).m.bytes.WithLabelValues("GET")); got < float64(len(f.artifact)+10) {
		t.Errorf("response bytes{GET} = %v, want at least %d", got, len(f.artifact)+10)
	}
	if n, err := testutil.GatherAndCount(f.reg, "headwater_http_request_duration_seconds"); err != nil || n != 2 {
		t.Errorf("duration series = %d (%v), want 2 (GET, other)", n, err)
	}
}

func (f *fixture) handler(t *testing.T) *Handler {
	t.Helper()
	h, ok := f.srv.Config.Handler.(*Handler)
	if !ok {
		t.Fatalf("server handler is %T", f.srv.Config.Handler)
	}
	return h
}

func TestKey(t *testing.T) {
	tests := []struct {
		path string
		want string
		ok   bool
	}{
		{"/" + artifactKey, artifactKey, true},
		{"/helmchart/ns/name/chart-1.0.0.tgz", "helmchart/ns/name/chart-1.0.0.tgz", true},
		{"", "", false},
		{"/", "", false},
		{"relative", "", false},
		{"//x", "", false},
		{"/a//b", "", false},
		{"/a/./b", "", false},
		{"/a/../b", "", false},
		{"/../etc/passwd", "", false},
		{"/a/b/", "", false},
		{"/.staging/x.tar", "", false},
		{"/a/.hidden", "", false},
		{"/a\\b", "", false},
	}
	for _, tt := range tests {
		got, ok := Key(tt.path)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Key(%q) = %q, %v; want %q, %v", tt.path, got, ok, tt.want, tt.ok)
		}
	}
}

func TestContentType(t *testing.T) {
	tests := map[string]string{
		"a/b/c/x.tar.gz":      "application/gzip",
		"a/b/c/x-1.0.tgz":     "application/gzip",
		"a/b/c/latest.tar.gz": "application/gzip",
		"a/b/c/index.json":    "application/json",
		"a/b/c/blob":          "application/octet-stream",
	}
	for key, want := range tests {
		if got := ContentType(key); got != want {
			t.Errorf("ContentType(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestAdvertisedAddr(t *testing.T) {
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ listen, want string }{
		{":9090", "localhost:9090"},
		{"127.0.0.1:8080", "127.0.0.1:8080"},
		{"artifacts.example:80", "artifacts.example:80"},
		{"0.0.0.0:9090", net.JoinHostPort(hostname, "9090")},
		{"[::]:9090", net.JoinHostPort(hostname, "9090")},
		{"no-port", "no-port"},
	}
	for _, tt := range tests {
		if got := AdvertisedAddr(tt.listen); got != tt.want {
			t.Errorf("AdvertisedAddr(%q) = %q, want %q", tt.listen, got, tt.want)
		}
	}
}
