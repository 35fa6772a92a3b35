// Package miniotest runs a real MinIO server, the S3 peer of Headwater's
// tests and of `make run` with S3 storage. The binary is built and cached by
// the Makefile (`make minio`), which exports its path as HEADWATER_MINIO_BIN.
//
// Each server listens on free 127.0.0.1 ports with random root credentials
// and its own data directory, so tests never share state.
package miniotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/testsupport/process"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// BinEnv names the environment variable holding the MinIO binary's path.
const BinEnv = "HEADWATER_MINIO_BIN"

// Tool is the MinIO binary the Makefile builds (`make minio`) and exports in BinEnv.
var Tool = process.Tool{Env: BinEnv, What: "MinIO", Target: "minio"}

const (
	// readyTimeout bounds the wait for a started server to become ready.
	readyTimeout = 30 * time.Second
	// startAttempts covers a free port being taken before MinIO binds it.
	startAttempts = 3
)

// Server is a running MinIO server.
type Server struct {
	// Endpoint is the S3 endpoint, host:port, served over plain HTTP.
	Endpoint string
	// AccessKey and SecretKey are the root credentials.
	AccessKey, SecretKey string
	// Client is a ready client with the root credentials.
	Client *minio.Client
	// Dir holds the server's data.
	Dir string

	proc     *process.Process
	homeDir  string
	env      []string // added to MinIO's environment
	stopOnce sync.Once
	stopErr  error
}

// New starts a server for the test, with data in a temporary directory, and
// stops it when the test ends. It fails the test when the MinIO binary is
// not available. It takes a testing.TB, so benchmarks and other modules'
// tests can use it.
func New(tb testing.TB) *Server {
	tb.Helper()
	return process.ForTest(tb, Tool, start)
}

// NewWithEnv starts a server as New does, with env ("KEY=value") added
// to MinIO's environment: an LDAP identity provider or an access policy
// plugin, say (MINIO_IDENTITY_LDAP_*, MINIO_POLICY_PLUGIN_URL).
func NewWithEnv(tb testing.TB, env ...string) *Server {
	tb.Helper()
	return process.ForTest(tb, Tool, func(bin, dir string) (*Server, error) { return startIP(bin, dir, "127.0.0.1", env...) })
}

// Start starts a server with its data in dir (created if needed), for use
// outside tests; the caller must Stop it.
func Start(dir string) (*Server, error) { return StartOn(dir, "127.0.0.1") }

// Binary returns the MinIO binary named by HEADWATER_MINIO_BIN.
func Binary() (string, error) {
	bin, err := process.Binary(Tool)
	if err != nil {
		return "", fmt.Errorf("miniotest: %w", err)
	}
	return bin, nil
}

// URL is the server's base URL, http://host:port.
func (s *Server) URL() string { return "http://" + s.Endpoint }

// MakeBucket creates a bucket, failing the test if it cannot.
func (s *Server) MakeBucket(tb testing.TB, name string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := s.Client.MakeBucket(ctx, name, minio.MakeBucketOptions{}); err != nil {
		tb.Fatalf("miniotest: make bucket %q: %v", name, err)
	}
}

// Output is the tail of the server's combined output.
func (s *Server) Output() string { return s.proc.Output() }

// Stop terminates the server: SIGTERM, then a kill if it has not exited
// within 10 seconds. It is safe to call more than once.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		s.stopErr = s.proc.Stop()
		_ = os.RemoveAll(s.homeDir)
	})
	return s.stopErr
}

// Halt stops the server (SIGTERM, as Stop) but keeps its address, data
// and credentials for Resume: S3 unreachable for a while. Stop still
// stops a resumed server.
func (s *Server) Halt() error {
	return s.proc.Stop()
}

// Resume starts the server Halt stopped again, on the same address with
// the same data and credentials, and waits until it serves.
func (s *Server) Resume() error {
	bin, err := Binary()
	if err != nil {
		return err
	}
	consoleAddr, err := process.FreeAddr()
	if err != nil {
		return fmt.Errorf("miniotest: %w", err)
	}
	cmd := exec.Command(bin, "server", "--address", s.Endpoint, "--console-address", consoleAddr, s.Dir)
	cmd.Env = append(environ(), "MINIO_ROOT_USER="+s.AccessKey, "MINIO_ROOT_PASSWORD="+s.SecretKey, "MINIO_UPDATE=off", "HOME="+s.homeDir)
	cmd.Env = append(cmd.Env, s.env...)
	if s.proc, err = process.Start("miniotest", cmd, nil); err != nil {
		return err
	}
	if err := s.waitReady(); err != nil {
		return err
	}
	return s.waitServing()
}

// StartOn starts a server as Start does, listening on ip instead of
// 127.0.0.1 (a test node's link, for clients in its pods).
func StartOn(dir, ip string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("miniotest: %w", err)
	}
	return startIP(bin, dir, ip)
}

func start(bin, dir string) (*Server, error) { return startIP(bin, dir, "127.0.0.1") }

func startIP(bin, dir, ip string, env ...string) (*Server, error) {
	user, password := "minio-"+randomHex(6), randomHex(16)
	var err error
	for range startAttempts {
		var s *Server
		s, err = startOnce(bin, dir, ip, user, password, env)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, process.ErrExited) {
			return nil, err
		}
	}
	return nil, err
}

func startOnce(bin, dir, ip, user, password string, env []string) (*Server, error) {
	addr, err := process.FreeAddrOn(ip)
	if err != nil {
		return nil, fmt.Errorf("miniotest: %w", err)
	}
	consoleAddr, err := process.FreeAddr()
	if err != nil {
		return nil, fmt.Errorf("miniotest: %w", err)
	}
	// A private home keeps MinIO's config directory out of $HOME/.minio.
	homeDir, err := os.MkdirTemp("", "miniotest-home-")
	if err != nil {
		return nil, fmt.Errorf("miniotest: %w", err)
	}
	s := &Server{
		Endpoint:  addr,
		AccessKey: user,
		SecretKey: password,
		Dir:       dir,
		homeDir:   homeDir,
		env:       env,
	}
	cmd := exec.Command(bin, "server", "--address", addr, "--console-address", consoleAddr, dir)
	cmd.Env = append(environ(), "MINIO_ROOT_USER="+user, "MINIO_ROOT_PASSWORD="+password, "MINIO_UPDATE=off", "HOME="+homeDir)
	cmd.Env = append(cmd.Env, env...)
	if s.proc, err = process.Start("miniotest", cmd, nil); err != nil {
		_ = os.RemoveAll(homeDir)
		return nil, err
	}
	if err := s.waitReady(); err != nil {
		_ = s.Stop()
		return nil, err
	}
	s.Client, err = minio.New(addr, &minio.Options{Creds: credentials.NewStaticV4(user, password, "")})
	if err != nil {
		_ = s.Stop()
		return nil, fmt.Errorf("miniotest: client: %w", err)
	}
	if err := s.waitServing(); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

// waitServing waits until the server answers S3 requests: its readiness
// probe answers before a restarted server has loaded what it stores, and
// until then requests fail with XMinioServerNotInitialized.
func (s *Server) waitServing() error {
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := s.Client.ListBuckets(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("miniotest: server at %s does not serve requests within %s: %w:\n%s", s.Endpoint, readyTimeout, err, s.Output())
		}
		select {
		case <-s.proc.Exited():
			return s.proc.ExitError()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitReady polls MinIO's readiness probe until it answers 200, the
// process exits or readyTimeout passes.
func (s *Server) waitReady() error {
	client := &http.Client{Timeout: time.Second}
	url := s.URL() + "/minio/health/ready"
	deadline := time.Now().Add(readyTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("miniotest: server at %s not ready within %s:\n%s", s.Endpoint, readyTimeout, s.Output())
		}
		select {
		case <-s.proc.Exited():
			return s.proc.ExitError()
		case <-tick.C:
		}
	}
}

// environ is the process environment without HOME and MINIO_* variables,
// so a developer's settings do not leak into the test server.
func environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MINIO_") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	return env
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
