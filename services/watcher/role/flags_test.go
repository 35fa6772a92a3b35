package role

import (
	"flag"
	"testing"
	"time"
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
