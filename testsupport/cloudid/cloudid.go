// Package cloudid serves the clouds' identity endpoints a fetcher logs in
// to container registries with, speaking the real protocols and checking
// what the client sends:
//
//   - AWS: STS's AssumeRoleWithWebIdentity (the query protocol: the role
//     ARN and the web identity token checked) and ECR's
//     GetAuthorizationToken (JSON 1.1, its Signature Version 4 verified
//     against the credentials STS issued, its region checked);
//   - GCP: the metadata server's token endpoint (Metadata-Flavor and the
//     scopes checked) and GKE cluster attributes; STS's token exchange
//     (every field, the audience, and the subject token against the
//     pool's trust) and IAM Credentials' generateAccessToken (the
//     federated principal checked against the service account's
//     impersonators);
//   - Azure: ACR's /oauth2/exchange (the Entra ID access token checked
//     against the tokens a tokenserver.EntraID issued, and the registry
//     named as the service), on the Registry front.
//
// Registry fronts a real registry (testsupport/registry, with htpasswd
// authentication) and lets through only the logins these servers issued,
// forwarding them with the registry's own credentials, so a pull works
// only with the token the exchange produced.
//
// Each server can be made to answer an error status (FailWith) or to hang
// until the client gives up (Hang), and counts what it issued.
package cloudid

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
)

// faults are the failures a server can be told to answer with.
type faults struct {
	mu     sync.Mutex
	status int
	hang   bool
}

// FailWith makes every request answer status until called with 0.
func (f *faults) FailWith(status int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status = status
}

// Hang makes every request wait, unanswered, until the client gives up,
// until called with false.
func (f *faults) Hang(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hang = on
}

// fault answers the request with the configured failure and reports
// whether it did; fail writes the status in the protocol's words.
func (f *faults) fault(w http.ResponseWriter, r *http.Request, fail func(int)) bool {
	f.mu.Lock()
	status, hang := f.status, f.hang
	f.mu.Unlock()
	switch {
	case hang:
		<-r.Context().Done()
		return true
	case status != 0:
		fail(status)
		return true
	}
	return false
}

// issued are the secrets a server handed out, with their expiry.
type issued struct {
	mu      sync.Mutex
	secrets map[string]time.Time
	minted  int
}

// issue remembers secret as valid until expires.
func (i *issued) issue(secret string, expires time.Time) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.secrets == nil {
		i.secrets = map[string]time.Time{}
	}
	i.secrets[secret] = expires
	i.minted++
}

// valid reports whether secret was issued and has not expired.
func (i *issued) valid(secret string) bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	exp, ok := i.secrets[secret]
	return ok && time.Now().Before(exp)
}

// Minted reports how many tokens the server issued.
func (i *issued) Minted() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.minted
}

// random returns n random bytes in hex.
func random(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// server is an HTTP listener on a free loopback port.
type server struct {
	srv *http.Server
	ln  net.Listener
}

// listen starts serving h on 127.0.0.1, with TLS when serve is ServeTLS.
func (s *server) listen(h http.Handler) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("cloudid: %w", err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	return nil
}

// Addr is the server's host:port.
func (s *server) Addr() string { return s.ln.Addr().String() }

// Close stops the server; hanging requests are cut.
func (s *server) Close() error {
	if s.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		return s.srv.Close()
	}
	return nil
}
