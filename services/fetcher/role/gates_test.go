package role

import (
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/headwater-gitops/headwater/pkg/command"
)

// TestObjectLevelGate: -feature-gates=ObjectLevelWorkloadIdentity=true
// (or HEADWATER_FEATURE_GATES) turns object-level workload identity on,
// and -default-service-account without it is refused with Flux's words.
func TestObjectLevelGate(t *testing.T) {
	parse := func(args ...string) options {
		t.Helper()
		var o options
		fs := flag.NewFlagSet(service, flag.ContinueOnError)
		o.bindFlags(fs)
		if err := command.ParseArgs(fs, args, io.Discard); err != nil {
			t.Fatal(err)
		}
		return o
	}
	if o := parse(); o.objectLevelIdentity() {
		t.Error("object-level workload identity on by default")
	}
	if o := parse("--feature-gates=ObjectLevelWorkloadIdentity=true", "--default-service-account=tenant"); !o.objectLevelIdentity() || o.defaultServiceAccount != "tenant" {
		t.Errorf("gate %v, default %q", o.objectLevelIdentity(), o.defaultServiceAccount)
	} else if _, err := o.check(); err != nil {
		t.Errorf("check: %v", err)
	}
	t.Setenv("HEADWATER_FEATURE_GATES", "ObjectLevelWorkloadIdentity=true")
	if o := parse(); !o.objectLevelIdentity() {
		t.Error("HEADWATER_FEATURE_GATES does not turn the gate on")
	}
	t.Setenv("HEADWATER_FEATURE_GATES", "")
	o := parse("--default-service-account=tenant")
	_, err := o.check()
	if err == nil || !strings.Contains(err.Error(), "cannot set default service accounts when the feature gate ObjectLevelWorkloadIdentity is not enabled") {
		t.Errorf("check with a default service account and the gate off: %v", err)
	}
}
