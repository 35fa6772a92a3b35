package command

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

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
