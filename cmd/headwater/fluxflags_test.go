package main

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/fluxflags"
	artifactserver "github.com/headwater-gitops/headwater/services/artifact-server/role"
	dispatcher "github.com/headwater-gitops/headwater/services/dispatcher/role"
	fetcher "github.com/headwater-gitops/headwater/services/fetcher/role"
	httpsourcefetcher "github.com/headwater-gitops/headwater/services/httpsource-fetcher/role"
	packager "github.com/headwater-gitops/headwater/services/packager/role"
	receiver "github.com/headwater-gitops/headwater/services/receiver/role"
	watcher "github.com/headwater-gitops/headwater/services/watcher/role"
)

// roleFlags are the flags of each role that runs as a controller (setup
// is a Job with commands of its own), as the role parses them.
var roleFlags = []struct {
	name  string
	flags func() *flag.FlagSet
}{
	{"watcher", watcher.Flags},
	{"fetcher", fetcher.Flags},
	{"packager", packager.Flags},
	{"artifact-server", artifactserver.Flags},
	{"receiver", receiver.Flags},
	{"dispatcher", dispatcher.Flags},
	{"httpsource-fetcher", httpsourcefetcher.Flags},
}

// fluxArgs are the arguments of Flux's source-controller Deployment as
// `flux install` (Flux v2.7) writes them, then those of the
// vertical-scaling patch of Flux's documentation (whose memory and CPU
// limits are no flags), then that of the sharding patch of Flux's
// documentation (the selector of a shard).
var fluxArgs = []string{
	"--events-addr=http://notification-controller.flux-system.svc.cluster.local./",
	"--watch-all-namespaces=true",
	"--log-level=info",
	"--log-encoding=json",
	"--enable-leader-election",
	"--storage-path=/data",
	"--storage-adv-addr=source-controller.$(RUNTIME_NAMESPACE).svc.cluster.local.",
	// Vertical scaling.
	"--concurrent=20",
	"--kube-api-qps=500",
	"--kube-api-burst=1000",
	"--requeue-dependency=5s",
	// Sharding.
	"--watch-label-selector=sharding.fluxcd.io/key in (shard1)",
}

// TestFluxDeploymentArgs: every role accepts Flux's arguments, and each
// sets what Flux's flag of that name sets: the role's own flag, the one
// it is an alias of, or a flag with no effect holding the value.
func TestFluxDeploymentArgs(t *testing.T) {
	for _, r := range roleFlags {
		t.Run(r.name, func(t *testing.T) {
			fs := r.flags()
			var out bytes.Buffer
			fs.SetOutput(&out)
			if err := command.ParseArgs(fs, fluxArgs, io.Discard); err != nil {
				t.Fatalf("Flux's arguments refused: %v\n%s", err, out.String())
			}
			for _, arg := range fluxArgs {
				name, value, ok := strings.Cut(strings.TrimLeft(arg, "-"), "=")
				if !ok {
					value = "true"
				}
				if got := fs.Lookup(name).Value.String(); got != value {
					t.Errorf("--%s: %q, want %q (%s)", name, got, value, fluxflags.Meaning(fs, name))
				}
			}
		})
	}
}

// TestFluxArgsMeaning: where a role does what Flux's flag asks, the role's
// own option holds the value.
func TestFluxArgsMeaning(t *testing.T) {
	want := map[string]map[string]string{
		"watcher": {"concurrency": "20", "leader-elect": "true", "log-format": "json", "requeue-dependency": "5s",
			"kube-api-qps": "500", "kube-api-burst": "1000",
			"events-addr": "http://notification-controller.flux-system.svc.cluster.local./"},
		"fetcher":         {"concurrency": "20", "storage-path": "/data", "kube-api-qps": "500"},
		"packager":        {"concurrency": "20", "storage-path": "/data"},
		"artifact-server": {"storage-path": "/data", "storage-adv-addr": "source-controller.$(RUNTIME_NAMESPACE).svc.cluster.local."},
	}
	for _, r := range roleFlags {
		if want[r.name] == nil {
			continue
		}
		fs := r.flags()
		fs.SetOutput(io.Discard)
		if err := command.ParseArgs(fs, fluxArgs, io.Discard); err != nil {
			t.Fatal(err)
		}
		for name, v := range want[r.name] {
			if strings.HasPrefix(fluxflags.Meaning(fs, name), "no effect") {
				t.Errorf("%s: -%s has no effect", r.name, name)
			}
			if got := fs.Lookup(name).Value.String(); got != v {
				t.Errorf("%s: -%s = %q, want %q", r.name, name, got, v)
			}
		}
	}
}

// TestFluxBadArgs: in every role, a Flux flag with a bad value, an unknown
// gate or a bad log level or encoding is an error naming it.
func TestFluxBadArgs(t *testing.T) {
	tests := []struct{ arg, want string }{
		{"--concurrent=lots", "-concurrent"},
		{"--requeue-dependency=5", "-requeue-dependency"},
		{"--kube-api-qps=fast", "-kube-api-qps"},
		{"--enable-leader-election=sometimes", "-enable-leader-election"},
		{"--storage-adv-addr", "-storage-adv-addr"},
		{"--feature-gates=NoSuchGate=true", "NoSuchGate"},
		{"--log-level=verbose", "-log-level"},
		{"--log-encoding=yaml", "-log-encoding"},
		{"-log-format=yaml", "-log-format"},
	}
	for _, r := range roleFlags {
		for _, tt := range tests {
			t.Run(r.name+" "+tt.arg, func(t *testing.T) {
				fs := r.flags()
				var out bytes.Buffer
				fs.SetOutput(&out)
				err := command.ParseArgs(fs, []string{tt.arg}, io.Discard)
				if err == nil {
					t.Fatalf("%s accepted", tt.arg)
				}
				if !strings.Contains(err.Error(), tt.want) || !strings.Contains(out.String(), tt.want) {
					t.Errorf("error %q, output %q: want both to name %s", err, out.String(), tt.want)
				}
			})
		}
	}
}

var update = flag.Bool("update", false, "rewrite docs/flags.md")

// TestFlagsReference: docs/flags.md is what the roles' flags say; run
// with -update to rewrite it.
func TestFlagsReference(t *testing.T) {
	var roles []fluxflags.Role
	for _, r := range roleFlags {
		roles = append(roles, fluxflags.Role{Name: r.name, Flags: r.flags()})
	}
	got := fluxflags.Reference(roles)
	path := filepath.Join("..", "..", "docs", "flags.md")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != got {
		t.Errorf("docs/flags.md is not what the roles' flags say: run cd cmd/headwater && go test -run TestFlagsReference -update .")
	}
}
