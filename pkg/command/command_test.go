package command

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/headwater-gitops/headwater/pkg/buildinfo"
)

// TestParseArgsVersion: -version prints the service's build and stops.
func TestParseArgsVersion(t *testing.T) {
	fs := flag.NewFlagSet("svc", flag.ContinueOnError)
	var stdout bytes.Buffer
	if err := ParseArgs(fs, []string{"-version"}, &stdout); !errors.Is(err, ErrVersion) {
		t.Fatalf("ParseArgs = %v, want ErrVersion", err)
	}
	if want := "svc version " + buildinfo.Get().String() + "\n"; stdout.String() != want {
		t.Errorf("printed %q, want %q", stdout.String(), want)
	}
}

// TestParseArgsEnvironment: a flag the command line does not give comes
// from the environment, but -version never does.
func TestParseArgsEnvironment(t *testing.T) {
	t.Setenv("HEADWATER_ADDR", "from-env")
	t.Setenv("HEADWATER_VERSION", "v0.1.0") // an image tag, say
	fs := flag.NewFlagSet("svc", flag.ContinueOnError)
	addr := fs.String("addr", "default", "")
	var stdout bytes.Buffer
	if err := ParseArgs(fs, nil, &stdout); err != nil || *addr != "from-env" || stdout.Len() != 0 {
		t.Errorf("ParseArgs = %v, addr %q, printed %q; want addr from the environment and no version", err, *addr, stdout.String())
	}
}

func TestParseArgsReportsBadEnvironment(t *testing.T) {
	t.Setenv("HEADWATER_CONCURRENCY", "many")
	fs := flag.NewFlagSet("svc", flag.ContinueOnError)
	var out bytes.Buffer
	fs.SetOutput(&out)
	fs.Int("concurrency", 1, "")
	if err := ParseArgs(fs, nil, io.Discard); err == nil || !strings.Contains(out.String(), "HEADWATER_CONCURRENCY") {
		t.Fatalf("ParseArgs = %v, printed %q; want the bad variable reported", err, out.String())
	}
}

// TestExitReturns covers the ends that return to main (exit 0); the others
// exit the process.
func TestExitReturns(t *testing.T) {
	Exit(context.Background(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	Exit(ctx, errors.Join(errors.New("connect to nats"), context.Canceled))
}

func TestStartLogsBuildInfo(t *testing.T) {
	var lines []string
	log := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
	ctx, stop := Start(log)
	defer stop()
	if len(lines) != 1 || !strings.Contains(lines[0], `"msg"="starting"`) ||
		!strings.Contains(lines[0], `"version"="`+buildinfo.Get().Version+`"`) ||
		!strings.Contains(lines[0], `"revision"="`+buildinfo.Get().Revision+`"`) {
		t.Errorf("start logged %q, want one line with the version and revision", lines)
	}
	if _, err := logr.FromContext(ctx); err != nil {
		t.Error("the context does not carry the logger")
	}
}

// TestServeProfiles: -pprof-addr serves the runtime's profiles until the
// service stops, and an address in use fails at start-up.
func TestServeProfiles(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := ServeProfiles(ctx, ""); err != nil {
		t.Fatalf("empty address: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	if err := ServeProfiles(ctx, addr); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/debug/pprof/heap?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "heap profile") {
		t.Errorf("heap profile: %s %.200s", resp.Status, body)
	}
	if err := ServeProfiles(ctx, addr); err == nil {
		t.Error("a second server on the same address: no error")
	}
	cancel()
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := http.Get("http://" + addr + "/debug/pprof/"); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still serving after ctx ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServe serves until its context ends: a request in progress at that
// moment is answered before Serve returns, and a server that cannot serve
// returns its error at once.
func TestServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(started)
		<-release
		_, _ = w.Write([]byte("done"))
	})}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, srv, ln, 10*time.Second) }()

	answer := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String())
		if err != nil {
			answer <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answer <- string(b)
	}()
	<-started
	cancel()
	select {
	case err := <-served:
		t.Fatalf("Serve returned %v with a request in progress", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if got := <-answer; got != "done" {
		t.Errorf("the request in progress got %q, want it answered", got)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve after its context ended: %v", err)
	}

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = closed.Close()
	if err := Serve(context.Background(), &http.Server{}, closed, time.Second); err == nil {
		t.Error("Serve on a closed listener returned nil")
	}
}

// TestNewFlagSet: a service's flags are its own, Flux's that it lacks
// (an alias of its own where one means the same) and -pprof-addr.
func TestNewFlagSet(t *testing.T) {
	var concurrency int
	fs := NewFlagSet("svc", func(fs *flag.FlagSet) { fs.IntVar(&concurrency, "concurrency", 1, "") })
	fs.SetOutput(io.Discard)
	if err := ParseArgs(fs, []string{"--concurrent=6", "--storage-path=/data", "-pprof-addr=127.0.0.1:0"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if concurrency != 6 {
		t.Errorf("--concurrent=6 set concurrency to %d", concurrency)
	}
	if got := fs.Lookup(PprofFlag).Value.String(); got != "127.0.0.1:0" {
		t.Errorf("-pprof-addr = %q", got)
	}
}

// TestSteps: the steps run in order until one fails, whose error Steps
// returns; none runs after it.
func TestSteps(t *testing.T) {
	var ran []string
	step := func(name string, err error) func(context.Context) error {
		return func(context.Context) error { ran = append(ran, name); return err }
	}
	if err := Steps(context.Background(), step("a", nil), step("b", nil)); err != nil || !slices.Equal(ran, []string{"a", "b"}) {
		t.Fatalf("Steps = %v, ran %v; want nil, ran [a b]", err, ran)
	}
	ran = nil
	failed := errors.New("b failed")
	err := Steps(context.Background(), step("a", nil), step("b", fmt.Errorf("step b: %w", failed)), step("c", nil))
	if !errors.Is(err, failed) || !slices.Equal(ran, []string{"a", "b"}) {
		t.Fatalf("Steps = %v, ran %v; want b's error, ran [a b]", err, ran)
	}
}
