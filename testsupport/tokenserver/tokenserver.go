// Package tokenserver serves the token endpoints a fetcher exchanges an
// identity at for access tokens, speaking the real protocols: the GitHub
// API's App installation endpoints (an RS256 JWT verified with the App's
// public key, an installation token with its expiry) and Microsoft Entra
// ID's OAuth 2.0 token endpoint (the client credentials grant with a
// client assertion), over HTTPS with a certificate authority of its own.
// It remembers every token it issued, so a git server can accept exactly
// those, until they expire.
package tokenserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/headwater-gitops/headwater/testsupport/testca"
)

// issued holds the tokens a server issued, with their expiry.
type issued struct {
	mu     sync.Mutex
	tokens map[string]time.Time
	minted int
}

// issue makes a new random token valid for ttl.
func (i *issued) issue(ttl time.Duration) (string, time.Time) {
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	token, expires := hex.EncodeToString(b), time.Now().Add(ttl)
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.tokens == nil {
		i.tokens = map[string]time.Time{}
	}
	i.tokens[token] = expires
	i.minted++
	return token, expires
}

// Valid reports whether token was issued by the server and has not
// expired.
func (i *issued) Valid(token string) bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	exp, ok := i.tokens[token]
	return ok && time.Now().Before(exp)
}

// Minted reports how many tokens the server issued.
func (i *issued) Minted() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.minted
}

// server is an HTTP or HTTPS listener.
type server struct {
	srv *http.Server
	url string
	ca  *testca.Authority
}

// start serves h on addr ("127.0.0.1:0" picks a free port), over HTTPS
// with a certificate of a new authority when tls is true.
func (s *server) start(addr string, h http.Handler, tls bool) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("token server: %w", err)
	}
	s.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	if !tls {
		s.url = "http://" + ln.Addr().String()
		go func() { _ = s.srv.Serve(ln) }()
		return nil
	}
	if s.ca, err = testca.New("tokenserver"); err != nil {
		_ = ln.Close()
		return err
	}
	if s.srv.TLSConfig, err = s.ca.ServerConfig("tokenserver", false); err != nil {
		_ = ln.Close()
		return err
	}
	s.url = "https://" + ln.Addr().String()
	go func() { _ = s.srv.ServeTLS(ln, "", "") }()
	return nil
}

// URL is the server's base URL, without a trailing slash.
func (s *server) URL() string { return s.url }

// Stop stops serving.
func (s *server) Stop() error {
	if s.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
