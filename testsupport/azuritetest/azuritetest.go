// Package azuritetest runs Azurite's Blob service, the Azure Blob Storage
// emulator the azure Bucket provider is tested against. It is installed
// from the npm registry and cached by the Makefile (`make azurite`, which
// needs node), which exports its path as HEADWATER_AZURITE_BIN.
//
// Each server listens on a free 127.0.0.1 port over plain HTTP with one
// storage account of random name and key, keeps its data in its own
// directory, and is addressed path-style: http://127.0.0.1:<port>/<account>.
package azuritetest

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"

	"github.com/headwater-gitops/headwater/testsupport/process"
)

// BinEnv names the environment variable holding azurite-blob's path.
const BinEnv = "HEADWATER_AZURITE_BIN"

// Tool is azurite-blob the Makefile builds (`make azurite`) and exports in BinEnv.
var Tool = process.Tool{Env: BinEnv, What: "Azurite", Target: "azurite"}

const (
	// readyTimeout bounds the wait for a started server to become ready
	// (node takes a second or two to load Azurite).
	readyTimeout = 60 * time.Second
	// startAttempts covers a free port being taken before the server binds it.
	startAttempts = 3
)

// Server is a running Azurite Blob service.
type Server struct {
	// Endpoint is the account's blob service URL,
	// http://127.0.0.1:<port>/<account>: an azure Bucket's spec.endpoint.
	Endpoint string
	// Account and AccountKey are the storage account's name and key
	// (base64), what a Secret's accountKey holds.
	Account, AccountKey string
	// Client is a client of the account with its key.
	Client *azblob.Client
	// Dir holds the server's data.
	Dir string

	proc *process.Process
}

// New starts a server for the test, with its data in a temporary
// directory, and stops it when the test ends. It fails the test when
// Azurite is not available.
func New(tb testing.TB) *Server {
	tb.Helper()
	return process.ForTest(tb, Tool, start)
}

// Start starts a server with its data in dir (created if needed), for use
// outside tests; the caller must Stop it.
func Start(dir string) (*Server, error) {
	bin, err := process.Binary(Tool)
	if err != nil {
		return nil, fmt.Errorf("azuritetest: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("azuritetest: %w", err)
	}
	return start(bin, dir)
}

// MakeContainer creates a container, failing the test if it cannot.
func (s *Server) MakeContainer(tb testing.TB, name string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if _, err := s.Client.CreateContainer(ctx, name, nil); err != nil {
		tb.Fatalf("azuritetest: make container %q: %v", name, err)
	}
}

// Put stores a blob and returns its ETag as the service sends it in the
// ETag header (quoted), failing the test if it cannot.
func (s *Server) Put(tb testing.TB, container, key, content string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	resp, err := s.Client.UploadBuffer(ctx, container, key, []byte(content), nil)
	if err != nil {
		tb.Fatalf("azuritetest: upload %s/%s: %v", container, key, err)
	}
	return string(*resp.ETag)
}

// Output is the tail of the server's combined output.
func (s *Server) Output() string { return s.proc.Output() }

// Stop terminates the server. It is safe to call more than once.
func (s *Server) Stop() error { return s.proc.Stop() }

func start(bin, dir string) (*Server, error) {
	var err error
	for range startAttempts {
		var s *Server
		if s, err = startOnce(bin, dir); err == nil {
			return s, nil
		}
		if !errors.Is(err, process.ErrExited) {
			return nil, err
		}
	}
	return nil, err
}

func startOnce(bin, dir string) (*Server, error) {
	addr, err := process.FreeAddr()
	if err != nil {
		return nil, fmt.Errorf("azuritetest: %w", err)
	}
	host, port, _ := strings.Cut(addr, ":")
	key := make([]byte, 64)
	_, _ = rand.Read(key)
	account := make([]byte, 6)
	_, _ = rand.Read(account)
	s := &Server{
		Account:    "hw" + hex.EncodeToString(account),
		AccountKey: base64.StdEncoding.EncodeToString(key),
		Dir:        dir,
	}
	s.Endpoint = "http://" + addr + "/" + s.Account
	// --skipApiVersionCheck: the SDK may speak a newer API version than
	// this Azurite knows; --disableProductStyleUrl: the account is always
	// the first path element.
	cmd := exec.Command(bin, "--blobHost", host, "--blobPort", port, "--location", dir,
		"--skipApiVersionCheck", "--disableProductStyleUrl", "--disableTelemetry", "--silent")
	cmd.Env = append(environ(), "AZURITE_ACCOUNTS="+s.Account+":"+s.AccountKey)
	if s.proc, err = process.Start("azuritetest", cmd, nil); err != nil {
		return nil, err
	}
	cred, err := azblob.NewSharedKeyCredential(s.Account, s.AccountKey)
	if err == nil {
		s.Client, err = azblob.NewClientWithSharedKeyCredential(s.Endpoint, cred, nil)
	}
	if err != nil {
		_ = s.Stop()
		return nil, fmt.Errorf("azuritetest: client: %w", err)
	}
	if err := s.waitReady(); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

// waitReady polls the account's container listing until it answers.
func (s *Server) waitReady() error {
	deadline := time.Now().Add(readyTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := s.Client.NewListContainersPager(nil).NextPage(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("azuritetest: server at %s not ready within %s: %w:\n%s", s.Endpoint, readyTimeout, err, s.Output())
		}
		select {
		case <-s.proc.Exited():
			return s.proc.ExitError()
		case <-tick.C:
		}
	}
}

// environ is the process environment without AZURITE_* variables, so a
// developer's settings do not leak into the test server.
func environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AZURITE_") {
			env = append(env, kv)
		}
	}
	return env
}
