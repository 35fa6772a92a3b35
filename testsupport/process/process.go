// Package process runs the binary of a test server (MinIO, the OCI
// registry) as a child process: its output kept for failure messages, a
// graceful stop, and no process left behind when the test process dies.
package process

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// stopTimeout is how long Stop waits after SIGTERM before killing.
	stopTimeout = 10 * time.Second
	// outputLimit is how much of the server's output is kept, for failures.
	outputLimit = 64 << 10
)

// ErrExited marks a server that exited before it was ready, which a free
// port taken in the meantime explains: the caller may start it again.
var ErrExited = errors.New("server exited before it was ready")

// Process is a running server process.
type Process struct {
	name     string
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the process has exited
	output   *tailBuffer
	stopOnce sync.Once
	stopErr  error
}

// Start starts cmd; name prefixes its errors. The process's combined output
// is kept (its tail) and also written to tee when not nil.
func Start(name string, cmd *exec.Cmd, tee io.Writer) (*Process, error) {
	p := &Process{name: name, cmd: cmd, exited: make(chan struct{}), output: &tailBuffer{limit: outputLimit}}
	var out io.Writer = p.output
	if tee != nil {
		out = io.MultiWriter(p.output, tee)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", name, cmd.Path, err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitError is the error of a process that exited before it was ready,
// wrapping ErrExited, with its output.
func (p *Process) ExitError() error {
	return fmt.Errorf("%s: %w (%s):\n%s", p.name, ErrExited, p.cmd.ProcessState, p.Output())
}

// Output is the tail of the process's combined output.
func (p *Process) Output() string { return p.output.String() }

// Stop terminates the process: SIGTERM, then a kill if it has not exited
// within 10 seconds. It is safe to call more than once.
func (p *Process) Stop() error {
	p.stopOnce.Do(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			p.stopErr = fmt.Errorf("%s: stop: %w", p.name, err)
		}
		select {
		case <-p.exited:
		case <-time.After(stopTimeout):
			_ = p.cmd.Process.Kill()
			<-p.exited
			p.stopErr = fmt.Errorf("%s: server did not stop within %s of SIGTERM; killed", p.name, stopTimeout)
		}
	})
	return p.stopErr
}

// Kill kills the process at once (SIGKILL), as a machine that loses its
// power would, and waits for it to exit; Stop afterwards does nothing.
func (p *Process) Kill() {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
}

// FreeAddr returns a 127.0.0.1 address with a port that was free a moment
// ago.
func FreeAddr() (string, error) { return FreeAddrOn("127.0.0.1") }

// FreeAddrOn returns an address of ip with a port that was free a moment
// ago.
func FreeAddrOn(ip string) (string, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// tailBuffer keeps the last limit bytes written to it.
type tailBuffer struct {
	mu    sync.Mutex
	limit int
	buf   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.limit; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// Tool is a binary the tests start: the Makefile builds it with Target, a
// prerequisite of `make test`, and exports its path in Env.
type Tool struct {
	// Env is the environment variable holding the binary's path.
	Env string
	// What names the binary in messages ("MinIO").
	What string
	// Target is the make target that builds it ("minio").
	Target string
}

// Binary returns the path of the tool's binary, or an error naming the
// make target that builds it when the variable is unset or the file is
// missing.
func Binary(tool Tool) (string, error) {
	bin := os.Getenv(tool.Env)
	if bin == "" {
		return "", fmt.Errorf("%s is not set: run `make %s` (it builds %s; `make test` runs it first)", tool.Env, tool.Target, tool.What)
	}
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() {
		return "", fmt.Errorf("%s binary %s (from %s) is missing: run `make %s` (it builds %s; `make test` runs it first)", tool.What, bin, tool.Env, tool.Target, tool.What)
	}
	return bin, nil
}

// Server is a test server built on a Process.
type Server interface {
	Stop() error
	Output() string
}

// ForTest starts a server for tb with start, on the tool's binary and a
// temporary directory, and stops it when the test ends, logging the tail
// of its output if the test failed. It fails the test, naming the make
// target to run, when the binary is not available, and when the server
// does not start.
func ForTest[S Server](tb testing.TB, tool Tool, start func(bin, dir string) (S, error)) S {
	tb.Helper()
	bin, err := Binary(tool)
	if err != nil {
		tb.Fatal(err)
	}
	s, err := start(bin, tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Error(err)
		}
		if tb.Failed() {
			tb.Logf("%s output (tail):\n%s", tool.What, s.Output())
		}
	})
	return s
}
