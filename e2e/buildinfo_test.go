package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/headwater-gitops/headwater/pkg/buildinfo"
)

// TestBuildInfo: every built service says which build it is, alike on
// -version and on its /metrics, and `make build` stamped that build.
func TestBuildInfo(t *testing.T) {
	requireEnv(t)
	for _, s := range env.Services() {
		service := filepath.Base(s.Path)
		out, err := exec.Command(s.Path, "-version").Output()
		if err != nil {
			t.Fatalf("%s -version: %v", s.Path, err)
		}
		// "<service> version <version> (revision <revision>, built ..., go1.x)"
		f := strings.Fields(string(out))
		if len(f) < 5 || f[0] != service || f[1] != "version" || f[3] != "(revision" {
			t.Fatalf("%s -version printed %q", service, out)
		}
		version, revision := f[2], strings.TrimRight(f[4], ",)")
		if version == buildinfo.Devel || revision == buildinfo.Unknown || !strings.Contains(string(out), "built ") {
			t.Errorf("%s -version printed %q: not stamped by make build", service, out)
		}
		n, err := metricSum(s.TelemetryAddr, "headwater_build_info",
			`service="`+service+`"`, `version="`+version+`"`, `revision="`+revision+`"`)
		if err != nil || n != 1 {
			t.Errorf("%s (%s): headwater_build_info for %s %s: %v, %v", s.Name, s.TelemetryAddr, version, revision, n, err)
		}
	}
}
