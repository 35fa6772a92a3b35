// Package ratelimit is a test HTTP server that stands in front of a real
// one (a git http-backend, a Helm chart repository) as a host that paces
// its clients: it counts the requests it serves and answers 429 Too Many
// Requests with a Retry-After to every request above its rate, as GitHub,
// Docker Hub and S3 do. Tests read how many requests it served, refused,
// and the most it served within any window.
package ratelimit

import (
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"
)

// Options are the server's limit and what it answers above it.
type Options struct {
	// Rate is the requests per second served in the long run, Burst the
	// requests served at once after an idle spell.
	Rate  float64
	Burst int
	// RetryAfter is the Retry-After header of a 429 ("30", an HTTP date,
	// or a malformed value for the client to cope with); none when empty.
	RetryAfter string
	// RetryAfterFunc, when set, makes the header of each 429 instead,
	// from the time the request came in.
	RetryAfterFunc func(now time.Time) string
}

// Server is the pacing front of an upstream server.
type Server struct {
	o     Options
	srv   *http.Server
	ln    net.Listener
	proxy *httputil.ReverseProxy

	mu      sync.Mutex
	tat     time.Time
	served  []time.Time
	byPath  map[string]int
	refused int
}

// Start starts a server on a free loopback port in front of upstream.
func Start(upstream string, o Options) (*Server, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{o: o, ln: ln, proxy: httputil.NewSingleHostReverseProxy(u)}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// URL is the server's base URL.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops the server.
func (s *Server) Close() error { return s.srv.Close() }

// ServeHTTP serves a request within the limit, and answers 429 above it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	if !s.admit(now, r.URL.Path) {
		h := s.o.RetryAfter
		if s.o.RetryAfterFunc != nil {
			h = s.o.RetryAfterFunc(now)
		}
		if h != "" {
			w.Header().Set("Retry-After", h)
		}
		http.Error(w, "too many requests", http.StatusTooManyRequests)
		return
	}
	s.proxy.ServeHTTP(w, r)
}

// admit takes a slot of the server's token bucket (GCRA) at now for a
// request of path.
func (s *Server) admit(now time.Time, path string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	interval := time.Duration(float64(time.Second) / s.o.Rate)
	tat := s.tat
	if tat.Before(now) {
		tat = now
	}
	next := tat.Add(interval)
	if next.Sub(now) > time.Duration(s.o.Burst)*interval {
		s.refused++
		return false
	}
	s.tat = next
	s.served = append(s.served, now)
	if s.byPath == nil {
		s.byPath = map[string]int{}
	}
	s.byPath[path]++
	return true
}

// ServedContaining is how many of the requests served had a path
// containing part ("/info/refs" counts a git server's reference listings,
// "/git-upload-pack" its packs, "/manifests/" a registry's manifests).
func (s *Server) ServedContaining(part string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for p, c := range s.byPath {
		if strings.Contains(p, part) {
			n += c
		}
	}
	return n
}

// Served is how many requests the server passed on.
func (s *Server) Served() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.served)
}

// Refused is how many requests the server answered 429.
func (s *Server) Refused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

// MaxInWindow is the most requests served within any window of length w.
func (s *Server) MaxInWindow(w time.Duration) int {
	s.mu.Lock()
	ts := append([]time.Time(nil), s.served...)
	s.mu.Unlock()
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	best, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= w {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// Span is the time from the first to the last request served.
func (s *Server) Span() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.served) < 2 {
		return 0
	}
	return s.served[len(s.served)-1].Sub(s.served[0])
}
