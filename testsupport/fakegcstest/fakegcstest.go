// Package fakegcstest runs fake-gcs-server, the Google Cloud Storage
// emulator the gcp Bucket provider is tested against. The binary is built
// from its Go module and cached by the Makefile (`make fake-gcs-server`),
// which exports its path as HEADWATER_FAKE_GCS_SERVER_BIN.
//
// Each server listens on a free 127.0.0.1 port over plain HTTP, keeps its
// objects in memory and serves the JSON API at /storage/v1/. It accepts any
// credentials (or none): tests of refused credentials need a token
// endpoint that refuses them.
package fakegcstest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/testsupport/process"
)

// BinEnv names the environment variable holding fake-gcs-server's path.
const BinEnv = "HEADWATER_FAKE_GCS_SERVER_BIN"

// Tool is fake-gcs-server the Makefile builds (`make fake-gcs-server`) and exports in BinEnv.
var Tool = process.Tool{Env: BinEnv, What: "fake-gcs-server", Target: "fake-gcs-server"}

const (
	// readyTimeout bounds the wait for a started server to become ready.
	readyTimeout = 30 * time.Second
	// startAttempts covers a free port being taken before the server binds it.
	startAttempts = 3
)

// Server is a running fake-gcs-server.
type Server struct {
	// Endpoint is host:port, what a gcp Bucket's spec.endpoint names
	// (with spec.insecure, as it is plain HTTP).
	Endpoint string

	proc *process.Process
}

// New starts a server for the test and stops it when the test ends. It
// fails the test when the binary is not available.
func New(tb testing.TB) *Server {
	tb.Helper()
	return process.ForTest(tb, Tool, start)
}

// Start starts a server for use outside tests (the e2e harness); the
// caller must Stop it. dir is unused: objects live in memory.
func Start(dir string) (*Server, error) {
	bin, err := process.Binary(Tool)
	if err != nil {
		return nil, fmt.Errorf("fakegcstest: %w", err)
	}
	return start(bin, dir)
}

// URL is the server's base URL, http://host:port.
func (s *Server) URL() string { return "http://" + s.Endpoint }

// MakeBucket creates a bucket, failing the test if it cannot.
func (s *Server) MakeBucket(tb testing.TB, name string) {
	tb.Helper()
	body, _ := json.Marshal(map[string]string{"name": name})
	if _, err := s.do(http.MethodPost, s.URL()+"/storage/v1/b?project=test-project", "application/json", body); err != nil {
		tb.Fatalf("fakegcstest: make bucket %q: %v", name, err)
	}
}

// Put stores an object and returns its ETag as listings give it, failing
// the test if it cannot.
func (s *Server) Put(tb testing.TB, bucket, key, content string) string {
	tb.Helper()
	upload := s.URL() + "/upload/storage/v1/b/" + url.PathEscape(bucket) + "/o?" + url.Values{"uploadType": {"media"}, "name": {key}}.Encode()
	if _, err := s.do(http.MethodPost, upload, "application/octet-stream", []byte(content)); err != nil {
		tb.Fatalf("fakegcstest: write %s/%s: %v", bucket, key, err)
	}
	data, err := s.do(http.MethodGet, s.objectURL(bucket, key), "", nil)
	if err != nil {
		tb.Fatalf("fakegcstest: attributes of %s/%s: %v", bucket, key, err)
	}
	var attrs struct {
		Etag string `json:"etag"`
	}
	if err := json.Unmarshal(data, &attrs); err != nil || attrs.Etag == "" {
		tb.Fatalf("fakegcstest: attributes of %s/%s: no etag in %s (%v)", bucket, key, data, err)
	}
	return attrs.Etag
}

// Get returns an object's content, failing the test if it cannot.
func (s *Server) Get(tb testing.TB, bucket, key string) string {
	tb.Helper()
	data, err := s.do(http.MethodGet, s.objectURL(bucket, key)+"?alt=media", "", nil)
	if err != nil {
		tb.Fatalf("fakegcstest: read %s/%s: %v", bucket, key, err)
	}
	return string(data)
}

// Delete removes an object, failing the test if it cannot.
func (s *Server) Delete(tb testing.TB, bucket, key string) {
	tb.Helper()
	if _, err := s.do(http.MethodDelete, s.objectURL(bucket, key), "", nil); err != nil {
		tb.Fatalf("fakegcstest: delete %s/%s: %v", bucket, key, err)
	}
}

// objectURL is the JSON API URL of an object (its name one escaped path
// segment).
func (s *Server) objectURL(bucket, key string) string {
	return s.URL() + "/storage/v1/b/" + url.PathEscape(bucket) + "/o/" + url.PathEscape(key)
}

// do sends a request to the server, without credentials, and returns the
// body of a 2xx answer.
func (s *Server) do(method, u, contentType string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: %s: %s", method, u, resp.Status, bytes.TrimSpace(data))
	}
	return data, nil
}

// Output is the tail of the server's combined output.
func (s *Server) Output() string { return s.proc.Output() }

// Stop terminates the server. It is safe to call more than once.
func (s *Server) Stop() error {
	return s.proc.Stop()
}

func start(bin, _ string) (*Server, error) {
	var err error
	for range startAttempts {
		var s *Server
		if s, err = startOnce(bin); err == nil {
			return s, nil
		}
		if !errors.Is(err, process.ErrExited) {
			return nil, err
		}
	}
	return nil, err
}

func startOnce(bin string) (*Server, error) {
	addr, err := process.FreeAddr()
	if err != nil {
		return nil, fmt.Errorf("fakegcstest: %w", err)
	}
	host, port, _ := strings.Cut(addr, ":")
	// -public-host makes the download and upload URLs it returns point
	// back at it.
	cmd := exec.Command(bin, "-scheme", "http", "-host", host, "-port", port, "-public-host", addr,
		"-external-url", "http://"+addr, "-backend", "memory", "-log-level", "warn")
	s := &Server{Endpoint: addr}
	if s.proc, err = process.Start("fakegcstest", cmd, nil); err != nil {
		return nil, err
	}
	if err := s.waitReady(); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

// waitReady polls the bucket listing until it answers 200.
func (s *Server) waitReady() error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(readyTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := client.Get(s.URL() + "/storage/v1/b")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("fakegcstest: server at %s not ready within %s:\n%s", s.Endpoint, readyTimeout, s.Output())
		}
		select {
		case <-s.proc.Exited():
			return s.proc.ExitError()
		case <-tick.C:
		}
	}
}
