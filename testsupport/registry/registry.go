// Package registry runs a real OCI registry, the CNCF distribution registry
// (`registry serve`), the peer of Headwater's OCIRepository tests. The
// binary is built and cached by the Makefile (`make registry`), which
// exports its path as HEADWATER_REGISTRY_BIN.
//
// Each server listens on a free 127.0.0.1 port with its own storage
// directory, optionally behind htpasswd (basic) authentication and over
// TLS with a certificate authority of its own, and records the requests it
// serves, so a test can count manifest and blob downloads.
package registry

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/crypto/bcrypt"

	"github.com/headwater-gitops/headwater/testsupport/process"
	"github.com/headwater-gitops/headwater/testsupport/testca"
)

// BinEnv names the environment variable holding the registry binary's path.
const BinEnv = "HEADWATER_REGISTRY_BIN"

// Tool is the distribution registry binary the Makefile builds (`make registry`) and exports in BinEnv.
var Tool = process.Tool{Env: BinEnv, What: "the registry", Target: "registry"}

const (
	// readyTimeout bounds the wait for a started server to become ready.
	readyTimeout = 30 * time.Second
	// startAttempts covers a free port being taken before the registry
	// binds it.
	startAttempts = 3
	// maxRecorded bounds the requests a server remembers.
	maxRecorded = 100000
)

// Options configure a server.
type Options struct {
	// Username and Password, when both set, make the registry require
	// them (htpasswd basic authentication) for every request.
	Username, Password string
	// TLS serves HTTPS with a certificate for 127.0.0.1 and localhost
	// issued by an authority of the server's own (see CACert); plain HTTP
	// otherwise.
	TLS bool
	// ListenIP is the address the registry listens on: 127.0.0.1 when
	// empty (another, such as a test node's link, for clients elsewhere).
	ListenIP string
}

// Server is a running registry.
type Server struct {
	// Host is host:port, the registry part of references.
	Host string
	// Dir is the storage root directory.
	Dir string
	// Options the server was started with.
	Options Options

	ca       *testca.Authority
	cfgDir   string
	proc     *process.Process
	requests *recorder
	settles  atomic.Int64
	stopOnce sync.Once
	stopErr  error
}

// Request is one request the registry served, from its access log.
type Request struct {
	Method, Path string
	Status       int
}

// New starts a server for the test, with storage in a temporary directory,
// and stops it when the test ends. It fails the test when the registry
// binary is not available.
func New(tb testing.TB, o Options) *Server {
	tb.Helper()
	return process.ForTest(tb, Tool, func(bin, dir string) (*Server, error) { return start(bin, dir, o) })
}

// Start starts a server with its storage in dir (created if needed), for
// use outside tests; the caller must Stop it.
func Start(dir string, o Options) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	return start(bin, dir, o)
}

// Binary returns the registry binary named by HEADWATER_REGISTRY_BIN.
func Binary() (string, error) {
	bin, err := process.Binary(Tool)
	if err != nil {
		return "", fmt.Errorf("registry: %w", err)
	}
	return bin, nil
}

// URL is the oci:// URL of a repository, as an OCIRepository's spec.url.
func (s *Server) URL(repo string) string { return "oci://" + s.Host + "/" + repo }

// Ref is the reference of a repository's tag, host:port/repo:tag.
func (s *Server) Ref(repo, tag string) string { return s.Host + "/" + repo + ":" + tag }

// Scheme is "https" with TLS, "http" without.
func (s *Server) Scheme() string {
	if s.Options.TLS {
		return "https"
	}
	return "http"
}

// CACert is the PEM certificate of the authority that issued the server's
// certificate, as a certSecretRef's ca.crt; nil without TLS.
func (s *Server) CACert() []byte {
	if s.ca == nil {
		return nil
	}
	return s.ca.CertPEM
}

// ClientCert issues a client certificate from the server's authority (PEM
// certificate and key, as tls.crt and tls.key); the registry does not ask
// for one, but a client may send it.
func (s *Server) ClientCert(commonName string) (certPEM, keyPEM []byte, err error) {
	if s.ca == nil {
		return nil, nil, errors.New("registry: no TLS")
	}
	c, err := s.ca.Issue(x509.ExtKeyUsageClientAuth, commonName, nil)
	if err != nil {
		return nil, nil, err
	}
	return c.CertPEM, c.KeyPEM, nil
}

// DockerConfigJSON is the .dockerconfigjson of a kubernetes.io/dockerconfigjson
// Secret holding username and password for this registry.
func (s *Server) DockerConfigJSON(username, password string) []byte {
	auth := base64.StdEncoding.EncodeToString([]byte(username + ":" + password))
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{
		s.Host: map[string]string{"username": username, "password": password, "auth": auth},
	}})
	return b
}

// RemoteOptions are go-containerregistry options that reach the server
// with its own credentials and trust its certificate.
func (s *Server) RemoteOptions() []remote.Option {
	opts := []remote.Option{remote.WithTransport(s.transport())}
	if s.Options.Username != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: s.Options.Username, Password: s.Options.Password}))
	}
	return opts
}

// transport reaches the server and trusts its certificate.
func (s *Server) transport() *http.Transport {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	if s.ca != nil {
		pool := x509.NewCertPool()
		pool.AddCert(s.ca.Cert)
		t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return t
}

// Requests returns the requests served so far, oldest first.
func (s *Server) Requests() []Request { return s.requests.list() }

// CountRequests counts the requests served so far with method whose path
// contains part (e.g. "GET", "/blobs/").
func (s *Server) CountRequests(method, part string) int {
	n := 0
	for _, r := range s.Requests() {
		if r.Method == method && strings.Contains(r.Path, part) {
			n++
		}
	}
	return n
}

// Settle returns the requests served so far once every request answered
// before the call is in the log, which the registry writes after each
// response: it sends a marker request of its own and waits for it. A test
// that checks what a client did NOT ask takes its window between two
// Settle calls. The markers (GET /v2/?settle=N) are in the list.
func (s *Server) Settle(tb testing.TB) []Request {
	tb.Helper()
	marker := fmt.Sprintf("/v2/?settle=%d", s.settles.Add(1))
	c := &http.Client{Transport: s.transport(), Timeout: 10 * time.Second}
	scheme := "http"
	if s.ca != nil {
		scheme = "https"
	}
	resp, err := c.Get(scheme + "://" + s.Host + marker)
	if err != nil {
		tb.Fatalf("registry: settle: %v", err)
	}
	_ = resp.Body.Close()
	if s.WaitRequests(http.MethodGet, marker, 1, 10*time.Second) == 0 {
		tb.Fatalf("registry: settle: %s not logged within 10s", marker)
	}
	return s.Requests()
}

// WaitRequests waits up to timeout until CountRequests(method, part) is at
// least n and returns it: the registry logs a request after its response.
func (s *Server) WaitRequests(method, part string, n int, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for {
		c := s.CountRequests(method, part)
		if c >= n || time.Now().After(deadline) {
			return c
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Output is the tail of the server's combined output.
func (s *Server) Output() string { return s.proc.Output() }

// Stop terminates the server: SIGTERM, then a kill if it has not exited
// within 10 seconds. It is safe to call more than once.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		s.stopErr = s.proc.Stop()
		_ = os.RemoveAll(s.cfgDir)
	})
	return s.stopErr
}

func start(bin, dir string, o Options) (*Server, error) {
	if (o.Username == "") != (o.Password == "") {
		return nil, errors.New("registry: set both Username and Password, or neither")
	}
	var ca *testca.Authority
	if o.TLS {
		var err error
		if ca, err = testca.New("registry"); err != nil {
			return nil, err
		}
	}
	var err error
	for range startAttempts {
		var s *Server
		s, err = startOnce(bin, dir, o, ca)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, process.ErrExited) {
			return nil, err
		}
	}
	return nil, err
}

func startOnce(bin, dir string, o Options, ca *testca.Authority) (*Server, error) {
	ip := o.ListenIP
	if ip == "" {
		ip = "127.0.0.1"
	}
	addr, err := process.FreeAddrOn(ip)
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	cfgDir, err := os.MkdirTemp("", "registry-config-")
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	s := &Server{Host: addr, Dir: dir, Options: o, ca: ca, cfgDir: cfgDir, requests: &recorder{}}
	cfg, err := s.writeConfig()
	if err != nil {
		_ = os.RemoveAll(cfgDir)
		return nil, err
	}
	cmd := exec.Command(bin, "serve", cfg)
	// No telemetry exporter: the registry would try to reach a collector.
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none", "OTEL_METRICS_EXPORTER=none", "OTEL_LOGS_EXPORTER=none", "OTEL_SDK_DISABLED=true")
	if s.proc, err = process.Start("registry", cmd, s.requests); err != nil {
		_ = os.RemoveAll(cfgDir)
		return nil, err
	}
	if err := s.waitReady(); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

// writeConfig writes the registry's configuration, and its htpasswd file
// and certificate when asked for, and returns the configuration's path.
func (s *Server) writeConfig() (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "version: 0.1\nlog:\n  level: warn\n  formatter: text\n")
	fmt.Fprintf(&b, "storage:\n  filesystem:\n    rootdirectory: %q\n  delete:\n    enabled: true\n", s.Dir)
	fmt.Fprintf(&b, "http:\n  addr: %q\n  secret: headwater-test\n", s.Host)
	if s.ca != nil {
		leaf, err := s.ca.Issue(x509.ExtKeyUsageServerAuth, "registry", testca.Loopback)
		if err != nil {
			return "", err
		}
		cert, key := filepath.Join(s.cfgDir, "tls.crt"), filepath.Join(s.cfgDir, "tls.key")
		if err := os.WriteFile(cert, leaf.CertPEM, 0o600); err != nil {
			return "", fmt.Errorf("registry: %w", err)
		}
		if err := os.WriteFile(key, leaf.KeyPEM, 0o600); err != nil {
			return "", fmt.Errorf("registry: %w", err)
		}
		fmt.Fprintf(&b, "  tls:\n    certificate: %q\n    key: %q\n", cert, key)
	}
	if s.Options.Username != "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(s.Options.Password), bcrypt.MinCost)
		if err != nil {
			return "", fmt.Errorf("registry: htpasswd: %w", err)
		}
		file := filepath.Join(s.cfgDir, "htpasswd")
		if err := os.WriteFile(file, []byte(s.Options.Username+":"+string(hash)+"\n"), 0o600); err != nil {
			return "", fmt.Errorf("registry: %w", err)
		}
		fmt.Fprintf(&b, "auth:\n  htpasswd:\n    realm: headwater\n    path: %q\n", file)
	}
	path := filepath.Join(s.cfgDir, "config.yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return "", fmt.Errorf("registry: %w", err)
	}
	return path, nil
}

// waitReady polls /v2/ until the registry answers (200, or 401 when it
// requires credentials), the process exits or readyTimeout passes.
func (s *Server) waitReady() error {
	t := &http.Transport{}
	if s.ca != nil {
		pool := x509.NewCertPool()
		pool.AddCert(s.ca.Cert)
		t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	defer t.CloseIdleConnections()
	client := &http.Client{Timeout: time.Second, Transport: t}
	url := s.Scheme() + "://" + s.Host + "/v2/"
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return nil
			}
		}
		select {
		case <-s.proc.Exited():
			return s.proc.ExitError()
		case <-ctx.Done():
			return fmt.Errorf("registry: server at %s not ready within %s:\n%s", s.Host, readyTimeout, s.Output())
		case <-tick.C:
		}
	}
}

// accessLine matches a request in the registry's access log (Apache
// combined format).
var accessLine = regexp.MustCompile(`"([A-Z]+) (\S+) HTTP/[0-9.]+" ([0-9]{3}) `)

// recorder parses the registry's output for the requests it served.
type recorder struct {
	mu      sync.Mutex
	partial []byte
	reqs    []Request
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.partial = append(r.partial, p...)
	for {
		i := bytes.IndexByte(r.partial, '\n')
		if i < 0 {
			break
		}
		if m := accessLine.FindSubmatch(r.partial[:i]); m != nil && len(r.reqs) < maxRecorded {
			status, _ := strconv.Atoi(string(m[3]))
			r.reqs = append(r.reqs, Request{Method: string(m[1]), Path: string(m[2]), Status: status})
		}
		r.partial = r.partial[i+1:]
	}
	if len(r.partial) > 1<<20 { // a line this long is no access log line
		r.partial = nil
	}
	return len(p), nil
}

func (r *recorder) list() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Request(nil), r.reqs...)
}
