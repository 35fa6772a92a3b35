package ratelimit

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestServerPaces checks that the server passes a burst on, then answers
// 429 with its Retry-After, and counts both.
func TestServerPaces(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	t.Cleanup(up.Close)
	s, err := Start(up.URL, Options{Rate: 0.001, Burst: 3, RetryAfter: "30"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	codes := map[int]int{}
	var retryAfter string
	for i := range 5 {
		path := "/repo.git/info/refs"
		if i%2 == 1 {
			path = "/repo.git/git-upload-pack"
		}
		resp, err := http.Get(s.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		codes[resp.StatusCode]++
		if resp.StatusCode == http.StatusTooManyRequests {
			retryAfter = resp.Header.Get("Retry-After")
		}
		resp.Body.Close()
	}
	if codes[200] != 3 || codes[429] != 2 || retryAfter != "30" {
		t.Errorf("answers %v, Retry-After %q; want 3 OK, 2 429 with 30", codes, retryAfter)
	}
	if s.Served() != 3 || s.Refused() != 2 || s.MaxInWindow(time.Hour) != 3 {
		t.Errorf("served %d, refused %d, most in an hour %d; want 3, 2, 3", s.Served(), s.Refused(), s.MaxInWindow(time.Hour))
	}
	// Requests 0 and 2 (listings) and 1 (a pack) were served.
	if l, p := s.ServedContaining("/info/refs"), s.ServedContaining("/git-upload-pack"); l != 2 || p != 1 {
		t.Errorf("served %d listings and %d packs; want 2 and 1", l, p)
	}
}
