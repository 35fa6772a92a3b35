package miniotest

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Requests counts the S3 requests of a client made by CountingClient, by
// kind: GET, HEAD, PUT, COPY (a PUT with x-amz-copy-source), DELETE,
// POST, and LIST (a GET of the bucket itself). Counts are deterministic
// where wall-clock times are not, so tests can assert them.
type Requests struct {
	next http.RoundTripper
	mu   sync.Mutex
	n    map[string]int
}

// RoundTrip counts req and sends it.
func (r *Requests) RoundTrip(req *http.Request) (*http.Response, error) {
	kind := req.Method
	switch {
	case req.Method == http.MethodPut && req.Header.Get("X-Amz-Copy-Source") != "":
		kind = "COPY"
	case req.Method == http.MethodGet && !strings.Contains(strings.Trim(req.URL.Path, "/"), "/"):
		kind = "LIST"
	}
	r.mu.Lock()
	r.n[kind]++
	r.mu.Unlock()
	return r.next.RoundTrip(req)
}

// Take returns the counts since the last Take (or since the client was
// made) as "COPY=1 GET=2", kinds in alphabetical order, and starts again.
func (r *Requests) Take() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(r.n)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r.n[k]))
	}
	r.n = map[string]int{}
	return strings.Join(parts, " ")
}

// CountingClient returns a client with the root credentials whose requests
// are counted. Its region is set, so it never asks for a bucket's location.
func (s *Server) CountingClient(tb testing.TB) (*minio.Client, *Requests) {
	tb.Helper()
	transport, err := minio.DefaultTransport(false)
	if err != nil {
		tb.Fatalf("miniotest: transport: %v", err)
	}
	r := &Requests{next: transport, n: map[string]int{}}
	client, err := minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		Region: "us-east-1", Transport: r})
	if err != nil {
		tb.Fatalf("miniotest: client: %v", err)
	}
	return client, r
}
