package harness

import (
	"errors"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// fakeServiceEnv makes the test binary act as a service: serve /readyz on
// the address in the variable, exit 0 on SIGTERM.
const fakeServiceEnv = "HARNESS_TEST_FAKE_SERVICE_ADDR"

func TestMain(m *testing.M) {
	if addr := os.Getenv(fakeServiceEnv); addr != "" {
		fakeService(addr)
		return
	}
	os.Exit(m.Run())
}

func fakeService(addr string) {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		os.Exit(3)
	}
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	}()
	os.Stdout.WriteString("fake service ready\n")
	<-term
	os.Stdout.WriteString("fake service stopping\n")
	os.Exit(0)
}

func TestServiceLifecycle(t *testing.T) {
	ports, err := FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	s := &Service{
		Name:     "fake",
		Path:     os.Args[0],
		Env:      append(os.Environ(), fakeServiceEnv+"="+addr),
		LogPath:  filepath.Join(t.TempDir(), "fake.log"),
		ReadyURL: "http://" + addr + "/readyz",
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if !s.Running() || s.Pid() == 0 {
		t.Fatalf("after Start: running %v pid %d", s.Running(), s.Pid())
	}
	first := s.Pid()

	if err := s.Restart(t.Context()); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if !s.Running() || s.Pid() == first {
		t.Errorf("after Restart: running %v, pid %d (was %d)", s.Running(), s.Pid(), first)
	}

	s.Kill()
	if s.Running() {
		t.Error("running after Kill")
	}
	if s.ExitErr() == nil {
		t.Error("a killed process reports a clean exit")
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatalf("Start after Kill: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if s.Running() {
		t.Error("running after Stop")
	}

	logs, err := s.Logs()
	if err != nil {
		t.Fatal(err)
	}
	// Three starts, one output file.
	if n := strings.Count(logs, "fake service ready"); n != 3 {
		t.Errorf("log shows %d starts, want 3:\n%s", n, logs)
	}
	if !strings.Contains(logs, "fake service stopping") {
		t.Errorf("log does not show the SIGTERM stop:\n%s", logs)
	}
}

func TestServiceStartFailsWhenProcessExits(t *testing.T) {
	s := &Service{
		Name:     "exits",
		Path:     "/bin/sh",
		Args:     []string{"-c", "echo broken flag >&2; exit 2"},
		LogPath:  filepath.Join(t.TempDir(), "exits.log"),
		ReadyURL: "http://127.0.0.1:1/readyz",
	}
	err := s.Start(t.Context())
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") {
		t.Fatalf("Start of a process that exits: %v", err)
	}
	if logs, _ := s.Logs(); !strings.Contains(logs, "broken flag") {
		t.Errorf("the process's stderr is not in its log:\n%s", logs)
	}
}

func TestConfigCheck(t *testing.T) {
	full := t.TempDir()
	for _, name := range append(append([]string{}, controlPlaneBinaries...), ServiceNames...) {
		if err := os.WriteFile(filepath.Join(full, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	crds := t.TempDir()
	if err := os.WriteFile(filepath.Join(crds, "crd.yaml"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		cfg     Config
		missing string // "" for a config that passes
	}{
		{"complete", Config{Dir: t.TempDir(), BinDir: full, AssetsDir: full, CRDDir: crds}, ""},
		{"no assets", Config{Dir: t.TempDir(), BinDir: full, CRDDir: crds}, "KUBEBUILDER_ASSETS is not set (run `make kube-tools`)"},
		{"no services", Config{Dir: t.TempDir(), BinDir: t.TempDir(), AssetsDir: full, CRDDir: crds}, "watcher not found in "},
		{"no crds", Config{Dir: t.TempDir(), BinDir: full, AssetsDir: full, CRDDir: t.TempDir()}, "no CRD manifests"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Check()
			if tt.missing == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrNotBuilt) || !strings.Contains(err.Error(), tt.missing) {
				t.Errorf("Check: %v, want ErrNotBuilt naming %q", err, tt.missing)
			}
		})
	}
}

func TestSampleFiles(t *testing.T) {
	files, err := SampleFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "kustomize/kustomization.yaml", "kustomize/deployment.yaml"} {
		if files[want] == "" {
			t.Errorf("sample has no %s; it has %d files", want, len(files))
		}
	}
}
