package role

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/pkg/command"
)

// TestLeaderElectionFlags: the election is timed as Flux's (a renewal, a
// write to the API server, every 5 s rather than controller-runtime's 2 s),
// and a zero option leaves controller-runtime's default.
func TestLeaderElectionFlags(t *testing.T) {
	var o options
	fs := flag.NewFlagSet("watcher", flag.ContinueOnError)
	o.bindFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if o.leaseDuration != 35*time.Second || o.renewDeadline != 30*time.Second || o.retryPeriod != 5*time.Second {
		t.Errorf("lease %s, renew deadline %s, retry period %s; want Flux's 35s, 30s, 5s", o.leaseDuration, o.renewDeadline, o.retryPeriod)
	}
	if err := fs.Parse([]string{"-leader-election-retry-period", "2s"}); err != nil || o.retryPeriod != 2*time.Second {
		t.Errorf("-leader-election-retry-period 2s: %s, %v", o.retryPeriod, err)
	}
	if d := positive(0); d != nil {
		t.Errorf("positive(0) = %v, want nil (controller-runtime's default)", *d)
	}
	if d := positive(time.Second); d == nil || *d != time.Second {
		t.Errorf("positive(1s) = %v", d)
	}
}

// TestIntervalJitterFlag: Flux's bounds, a bad value an error naming the
// flag.
func TestIntervalJitterFlag(t *testing.T) {
	for _, tt := range []struct {
		arg  string
		want float64
		ok   bool
	}{
		{"", 5, true},
		{"--interval-jitter-percentage=10", 10, true},
		{"--interval-jitter-percentage=0", 0, true},
		{"--interval-jitter-percentage=100", 0, false},
		{"--interval-jitter-percentage=-1", 0, false},
		{"--interval-jitter-percentage=lots", 0, false},
	} {
		var o options
		fs := flag.NewFlagSet("watcher", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.bindFlags(fs)
		var args []string
		if tt.arg != "" {
			args = []string{tt.arg}
		}
		err := fs.Parse(args)
		if !tt.ok {
			if err == nil || !strings.Contains(err.Error(), "-interval-jitter-percentage") {
				t.Errorf("%s: error %v, want one naming the flag", tt.arg, err)
			}
			continue
		}
		if err != nil || o.intervalJitter != tt.want {
			t.Errorf("%q: %v, jitter %v, want %v", tt.arg, err, o.intervalJitter, tt.want)
		}
	}
}

// TestNoCrossNamespaceRefsFlag: off by default, as Flux's.
func TestNoCrossNamespaceRefsFlag(t *testing.T) {
	var o options
	fs := flag.NewFlagSet("watcher", flag.ContinueOnError)
	o.bindFlags(fs)
	if err := fs.Parse(nil); err != nil || o.noCrossNamespaceRefs {
		t.Fatalf("default %v, %v; want off", o.noCrossNamespaceRefs, err)
	}
	if err := fs.Parse([]string{"-no-cross-namespace-refs"}); err != nil || !o.noCrossNamespaceRefs {
		t.Errorf("-no-cross-namespace-refs: %v, %v", o.noCrossNamespaceRefs, err)
	}
}

// TestBadSelectorIsABadFlag: a -watch-label-selector (or its environment
// variable) that does not parse stops the watcher at flag parsing, which
// exits 2, with a message naming the flag.
func TestBadSelectorIsABadFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{args: []string{"-watch-label-selector", "sharding.fluxcd.io/key in (shard1"}, want: "-watch-label-selector"},
		{env: "sharding.fluxcd.io/key in (shard1", want: "HEADWATER_WATCH_LABEL_SELECTOR"},
	} {
		t.Setenv("HEADWATER_WATCH_LABEL_SELECTOR", tc.env)
		var o options
		fs := flag.NewFlagSet(service, flag.ContinueOnError)
		var out strings.Builder
		fs.SetOutput(&out)
		o.bindFlags(fs)
		err := command.ParseArgs(fs, tc.args, io.Discard)
		if err == nil {
			t.Fatalf("%v, $HEADWATER_WATCH_LABEL_SELECTOR=%q: parsed", tc.args, tc.env)
		}
		if msg := out.String(); !strings.Contains(msg, tc.want) || !strings.Contains(msg, "does not parse") {
			t.Errorf("%v, $HEADWATER_WATCH_LABEL_SELECTOR=%q: says %q, want it to name %s", tc.args, tc.env, msg, tc.want)
		}
	}
}
