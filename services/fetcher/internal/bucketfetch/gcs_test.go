package bucketfetch

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/testsupport/fakegcstest"
)

// gcsFaults is a proxy in front of fake-gcs-server that answers the
// requests answer picks with an error of the JSON API, as Google Cloud
// Storage words them, and records every request it sees.
type gcsFaults struct {
	srv *httptest.Server

	mu       sync.Mutex
	answer   func(r *http.Request) int // the status for the request; 0 passes it on
	requests []*url.URL
}

func newGCSFaults(t *testing.T, target string) *gcsFaults {
	f := &gcsFaults{}
	u := &url.URL{Scheme: "http", Host: target}
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(u) },
		ErrorLog: log.New(io.Discard, "", 0)}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.requests = append(f.requests, r.URL)
		answer := f.answer
		f.mu.Unlock()
		if answer != nil {
			if code := answer(r); code != 0 {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(code)
				_, _ = io.WriteString(w, `{"error":{"code":`+strconv.Itoa(code)+`,"message":"injected `+http.StatusText(code)+`","errors":[]}}`)
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// gcsRequestKind names the four requests a gcp Bucket makes.
func gcsRequestKind(r *http.Request) string {
	switch {
	case r.URL.Query().Get("alt") == "media":
		return "media"
	case strings.HasSuffix(r.URL.Path, "/o"):
		return "list"
	case strings.Contains(r.URL.Path, "/o/"):
		return "metadata"
	default:
		return "bucket"
	}
}

func (f *gcsFaults) hostPort() string { return strings.TrimPrefix(f.srv.URL, "http://") }

// inject makes the proxy answer as answer says (nil: pass everything on),
// and forgets the requests seen so far.
func (f *gcsFaults) inject(answer func(*http.Request) int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer = answer
	f.requests = nil
}

// count returns the requests of a kind seen since inject.
func (f *gcsFaults) count(kind string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, u := range f.requests {
		if gcsRequestKind(&http.Request{URL: u}) == kind {
			n++
		}
	}
	return n
}

func TestGCSAnswers(t *testing.T) {
	srv := fakegcstest.New(t)
	srv.MakeBucket(t, "bkt")
	for i := range 3 {
		srv.Put(t, "bkt", "obj-"+strconv.Itoa(i)+".yaml", "content "+strconv.Itoa(i))
	}
	faults := newGCSFaults(t, srv.Endpoint)
	spec := sourcev1.BucketSpec{Provider: sourcev1.BucketProviderGoogle, BucketName: "bkt", Endpoint: faults.hostPort(), Insecure: true}
	// No credentials at all: the emulator is read anonymously.
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("CLOUDSDK_CONFIG", t.TempDir())

	cases := []struct {
		name       string
		maxRetries int
		answer     func(r *http.Request) int
		download   bool // the failure is the download's, not the listing's
		handling   failure.Handling
		message    string // "" when the fetch succeeds
		kind       string
		requests   int // of kind
	}{
		{name: "bucket refused", answer: only("bucket", http.StatusForbidden), handling: failure.Final,
			message: "failed to confirm existence of 'bkt' bucket: Google Cloud Storage answered 403 Forbidden: injected Forbidden",
			kind:    "bucket", requests: 1},
		{name: "listing unauthorized", answer: only("list", http.StatusUnauthorized), handling: failure.Final,
			message: "indexation of objects from bucket 'bkt' failed: listing objects from bucket 'bkt' failed: Google Cloud Storage answered 401 Unauthorized",
			kind:    "list", requests: 1},
		{name: "server errors retried", answer: firstN("list", 2, http.StatusServiceUnavailable), kind: "list", requests: 3},
		{name: "rate limit retried", answer: firstN("media", 1, http.StatusTooManyRequests), download: true, kind: "media", requests: 4},
		{name: "server errors until the attempts run out", maxRetries: 3, answer: only("list", http.StatusInternalServerError), handling: failure.Transient,
			message: "listing objects from bucket 'bkt' failed: Google Cloud Storage answered 500 Internal Server Error: injected Internal Server Error",
			kind:    "list", requests: 3},
		{name: "object replaced after its metadata was read", answer: only("media", http.StatusPreconditionFailed), download: true, handling: failure.Transient,
			message: "fetch from bucket 'bkt' failed: failed to get 'obj-0.yaml' object: Google Cloud Storage answered 412 Precondition Failed",
			kind:    "media", requests: 1},
		{name: "download refused", answer: only("metadata", http.StatusForbidden), download: true, handling: failure.Final,
			message: "failed to get 'obj-0.yaml' object: Google Cloud Storage answered 403 Forbidden", kind: "metadata", requests: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := &Source{MaxRetries: tc.maxRetries, Concurrency: 1, gcsBackoff: time.Millisecond}
			defer faults.inject(nil)
			if !tc.download {
				faults.inject(tc.answer)
			}
			res, err := src.Resolve(context.Background(), request(spec))
			if tc.download {
				must(t, err)
				faults.inject(tc.answer)
				_, err = res.Download(context.Background(), t.TempDir())
			}
			if tc.message == "" {
				must(t, err)
			} else {
				sourcetest.CheckFailure(t, err, sourcev1.BucketOperationFailedReason, tc.handling, tc.message)
			}
			if got := faults.count(tc.kind); got != tc.requests {
				t.Errorf("%d %s requests, want %d", got, tc.kind, tc.requests)
			}
		})
	}
}

// only answers code to every request of a kind.
func only(kind string, code int) func(*http.Request) int {
	return func(r *http.Request) int {
		if gcsRequestKind(r) == kind {
			return code
		}
		return 0
	}
}

// firstN answers code to the first n requests of a kind.
func firstN(kind string, n, code int) func(*http.Request) int {
	var mu sync.Mutex
	seen := 0
	return func(r *http.Request) int {
		if gcsRequestKind(r) != kind {
			return 0
		}
		mu.Lock()
		defer mu.Unlock()
		if seen++; seen <= n {
			return code
		}
		return 0
	}
}

func TestGCSObjectNames(t *testing.T) {
	srv := fakegcstest.New(t)
	srv.MakeBucket(t, "bkt")
	files := map[string]string{"dir/with space/a+b%2Fc.yaml": "a", "odd?#&=name.yaml": "b", "ünï/cödé.yaml": "c", "deep/er/still/x.yaml": "d"}
	for k, v := range files {
		srv.Put(t, "bkt", k, v)
	}
	faults := newGCSFaults(t, srv.Endpoint)
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
	_, _, got, err := sourcetest.Fetch(t, &Source{}, request(sourcev1.BucketSpec{Provider: sourcev1.BucketProviderGoogle, BucketName: "bkt",
		Endpoint: faults.hostPort(), Insecure: true}))
	must(t, err)
	if !reflect.DeepEqual(got, files) {
		t.Errorf("files = %v\nwant    %v", got, files)
	}
	// Each media request names the generation its metadata described.
	faults.mu.Lock()
	defer faults.mu.Unlock()
	media := 0
	for _, u := range faults.requests {
		if u.Query().Get("alt") != "media" {
			continue
		}
		media++
		if g, err := strconv.ParseInt(u.Query().Get("ifGenerationMatch"), 10, 64); err != nil || g <= 0 {
			t.Errorf("download %s without the generation its metadata described", u.EscapedPath())
		}
	}
	if media != len(files) {
		t.Errorf("%d downloads, want %d", media, len(files))
	}
}
