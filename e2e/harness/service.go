package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// StopTimeout is how long Stop waits after SIGTERM before it kills.
const StopTimeout = 20 * time.Second

// readyTimeout bounds how long Start waits for a service to become ready.
const readyTimeout = 60 * time.Second

// Service is one service process. Its output (stdout and stderr) is
// appended to LogPath, across restarts.
type Service struct {
	// Name is the service's name, e.g. "fetcher".
	Name string
	// Path is the binary.
	Path string
	// Args are the command-line arguments.
	Args []string
	// Env is the process environment.
	Env []string
	// LogPath is the file the process's output goes to.
	LogPath string
	// ReadyURL answers 200 once the service is ready.
	ReadyURL string
	// TelemetryAddr serves the service's /metrics, /healthz and /readyz.
	TelemetryAddr string
	// TempDir is the process's TMPDIR, its own; Start creates it.
	TempDir string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the process's exit error, valid once done is closed
}

// Start starts the process and waits until it is ready, it exits, or ctx
// ends. A service that is running already is left alone.
func (s *Service) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.cmd != nil && !isClosed(s.done) {
		s.mu.Unlock()
		return nil
	}
	if s.TempDir != "" {
		if err := os.MkdirAll(s.TempDir, 0o755); err != nil {
			s.mu.Unlock()
			return fmt.Errorf("start %s: %w", s.Name, err)
		}
	}
	logf, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("start %s: %w", s.Name, err)
	}
	fmt.Fprintf(logf, "=== harness: %s starting: %s %s\n", time.Now().Format(time.RFC3339Nano), s.Path, strings.Join(s.Args, " "))
	cmd := exec.Command(s.Path, s.Args...)
	cmd.Env = s.Env
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		s.mu.Unlock()
		return fmt.Errorf("start %s: %w", s.Name, err)
	}
	done := make(chan struct{})
	s.cmd, s.done, s.err = cmd, done, nil
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(logf, "=== harness: %s %s exited: %v\n", time.Now().Format(time.RFC3339Nano), s.Name, exitDescription(err))
		_ = logf.Close()
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(done)
	}()
	s.mu.Unlock()
	return s.waitReady(ctx, done)
}

// waitReady polls ReadyURL until it answers 200.
func (s *Service) waitReady(ctx context.Context, done <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := errors.New("not polled yet")
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.ReadyURL, nil)
		if err != nil {
			return fmt.Errorf("%s readiness: %w", s.Name, err)
		}
		if resp, err := client.Do(req); err != nil {
			last = err
		} else {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(body))
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited before it was ready (%s); see %s", s.Name, exitDescription(s.ExitErr()), s.LogPath)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w (last answer: %w); see %s", s.Name, s.ReadyURL, ctx.Err(), last, s.LogPath)
		case <-tick.C:
		}
	}
}

// Stop sends SIGTERM and waits for the process to exit, killing it after
// StopTimeout. It returns the exit error, nil for a clean exit; a process
// that is not running returns nil.
func (s *Service) Stop() error {
	cmd, done := s.current()
	if cmd == nil || isClosed(done) {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(StopTimeout):
		killGroup(cmd)
		<-done
		return fmt.Errorf("%s did not stop within %s after SIGTERM and was killed", s.Name, StopTimeout)
	}
	if err := s.ExitErr(); err != nil {
		return fmt.Errorf("%s: %s", s.Name, exitDescription(err))
	}
	return nil
}

// Kill kills the process (and anything it started) with SIGKILL, as a crash
// would, and waits for it to exit.
func (s *Service) Kill() {
	cmd, done := s.current()
	if cmd == nil || isClosed(done) {
		return
	}
	killGroup(cmd)
	<-done
}

// Restart stops the process gracefully and starts it again.
func (s *Service) Restart(ctx context.Context) error {
	if err := s.Stop(); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	return s.Start(ctx)
}

// Running reports whether the process has been started and has not exited.
func (s *Service) Running() bool {
	cmd, done := s.current()
	return cmd != nil && !isClosed(done)
}

// Done is closed when the current process exits; nil before the first Start.
func (s *Service) Done() <-chan struct{} {
	_, done := s.current()
	return done
}

// ExitErr is the last process's exit error: nil while it runs or after a
// clean exit.
func (s *Service) ExitErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Pid is the process ID of the current process, 0 before the first Start.
func (s *Service) Pid() int {
	cmd, _ := s.current()
	if cmd == nil || cmd.Process == nil {
		return 0
	}
	return cmd.Process.Pid
}

// Logs returns everything the service has written so far.
func (s *Service) Logs() (string, error) {
	b, err := os.ReadFile(s.LogPath)
	if err != nil {
		return "", fmt.Errorf("%s logs: %w", s.Name, err)
	}
	return string(b), nil
}

// LogTail returns the last n lines of the service's output.
func (s *Service) LogTail(n int) string {
	logs, err := s.Logs()
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(logs, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d earlier lines in %s)", len(lines)-n, s.LogPath)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

func (s *Service) current() (*exec.Cmd, chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd, s.done
}

func isClosed(c <-chan struct{}) bool {
	if c == nil {
		return false
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func exitDescription(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}
