package deployvalidate

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats-server/v2/server"
)

func TestCompose(t *testing.T) {
	root := repoRoot(t)
	home := t.TempDir()
	t.Setenv("HOME", home) // where ~ in the default kubeconfig path goes
	p, err := LoadCompose(context.Background(), root, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Every profile: the optional services are checked too.
	if p, err = p.WithProfiles([]string{"*"}); err != nil {
		t.Fatal(err)
	}
	flags, err := AllServiceFlags(root)
	if err != nil {
		t.Fatal(err)
	}

	nats, err := p.GetService("nats")
	if err != nil {
		t.Fatal(err)
	}
	// NATS runs the deployed configuration (deploy/base/nats), mounted:
	// parse it as the server does, with users' keys in its environment.
	config, _ := ArgValue(nats.Command, "config")
	dir := t.TempDir()
	for _, v := range nats.Volumes {
		if v.Type == types.VolumeTypeBind && filepath.Dir(v.Target) == filepath.Dir(config) {
			data, err := os.ReadFile(v.Source)
			if err != nil {
				t.Fatalf("nats: mounted %s: %v", v.Source, err)
			}
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(v.Target)), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	setNATSUserKeys(t)
	for k, v := range nats.Environment {
		if v != nil {
			t.Setenv(k, *v)
		}
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, filepath.Base(config)))
	if err != nil {
		t.Fatalf("nats: the server rejects the mounted configuration %s: %v", config, err)
	}
	if !opts.JetStream {
		t.Errorf("nats: JetStream is not enabled")
	}
	if !slices.ContainsFunc(nats.Volumes, func(v types.ServiceVolumeConfig) bool {
		return v.Type == types.VolumeTypeVolume && v.Target == opts.StoreDir
	}) {
		t.Errorf("nats: the JetStream store %q is not on a volume", opts.StoreDir)
	}
	if len(opts.Nkeys) != len(natsIdentities) || opts.NoAuthUser != "" {
		t.Errorf("nats: %d NKey users (no-auth user %q), want Headwater's identities only", len(opts.Nkeys), opts.NoAuthUser)
	}
	if nats.HealthCheck == nil || len(nats.HealthCheck.Test) == 0 {
		t.Errorf("nats: no healthcheck")
	}

	var artifactVolume string
	for _, name := range append(Services, OptionalServices...) {
		s, err := p.GetService(name)
		if err != nil {
			t.Errorf("no compose service %s: %v", name, err)
			continue
		}
		for _, problem := range CheckComposeService(s, name, flags[name]) {
			t.Error(problem)
		}
		// Its own bus identity, from the keys directory.
		if key := s.Environment["HEADWATER_NATS_NKEY"]; key == nil || !slices.ContainsFunc(s.Volumes, func(v types.ServiceVolumeConfig) bool {
			return v.Target == *key && filepath.Base(v.Source) == Identity(name)+".nk"
		}) {
			t.Errorf("%s: does not connect to NATS with its own key (%s.nk)", name, Identity(name))
		}
		if s.Build == nil {
			t.Errorf("%s: not built", name)
			continue
		}
		if s.Build.Context != root {
			t.Errorf("%s: build context %s, want the repository root %s", name, s.Build.Context, root)
		}
		dockerfile := s.Build.Dockerfile
		if dockerfile == "" {
			dockerfile = "Dockerfile"
		}
		if _, err := os.Stat(filepath.Join(s.Build.Context, dockerfile)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if s.Image != "headwater/headwater:dev" {
			t.Errorf("%s: image %q, want the one image headwater/headwater:dev", name, s.Image)
		}
		if s.User != "65532:65532" || !s.ReadOnly {
			t.Errorf("%s: user %q, read_only %v: want the image's non-root user and a read-only root", name, s.User, s.ReadOnly)
		}
		if dep, ok := s.DependsOn["nats"]; !ok || dep.Condition != types.ServiceConditionHealthy {
			t.Errorf("%s: does not wait for a healthy nats", name)
		}
		if u, ok := ComposeFlagValue(s, "nats-url"); !ok || u != "nats://nats:4222" {
			t.Errorf("%s: -nats-url %q, want nats://nats:4222", name, u)
		}
		if s.HealthCheck != nil && !s.HealthCheck.Disable {
			t.Errorf("%s: healthcheck %v cannot run in a distroless image", name, s.HealthCheck.Test)
		}
		if !slices.Contains(storageServices, name) {
			continue
		}
		i := slices.IndexFunc(s.Volumes, func(v types.ServiceVolumeConfig) bool { return v.Target == "/data" })
		if i < 0 || s.Volumes[i].Type != types.VolumeTypeVolume {
			t.Errorf("%s: no volume at /data", name)
			continue
		}
		if artifactVolume == "" {
			artifactVolume = s.Volumes[i].Source
		} else if s.Volumes[i].Source != artifactVolume {
			t.Errorf("%s: /data is volume %q, the others share %q", name, s.Volumes[i].Source, artifactVolume)
		}
		if v, ok := ComposeFlagValue(s, "storage-path"); ok && v != "/data" {
			t.Errorf("%s: -storage-path %q, want /data", name, v)
		}
	}
	if _, ok := p.Volumes[artifactVolume]; !ok || artifactVolume == "" {
		t.Errorf("the shared artifact volume %q is not declared", artifactVolume)
	}

	// The artifact-server is published on 9090 and advertises it.
	as, _ := p.GetService("artifact-server")
	if !slices.ContainsFunc(as.Ports, func(pc types.ServicePortConfig) bool { return pc.Target == 9090 && pc.Published == "9090" }) {
		t.Errorf("artifact-server: port 9090 is not published as 9090: %v", as.Ports)
	}
	if v, _ := ComposeFlagValue(as, "storage-adv-addr"); v != "localhost:9090" {
		t.Errorf("artifact-server: -storage-adv-addr %q, want localhost:9090", v)
	}
	if v, ok := ComposeFlagValue(as, "storage-addr"); ok && v != ":9090" {
		t.Errorf("artifact-server: -storage-addr %q, want :9090", v)
	}

	// The fetcher's /tmp is writable under a read-only root.
	fetcher, _ := p.GetService("fetcher")
	if !slices.Contains(fetcher.Tmpfs, "/tmp") {
		t.Errorf("fetcher: /tmp is no tmpfs")
	}

	// The watcher reads the kubeconfig it is given, read-only; the default
	// is ~/.kube/config.
	watcher, _ := p.GetService("watcher")
	checkKubeconfig(t, watcher, filepath.Join(home, ".kube", "config"))
	checkKubeconfig(t, fetcher, filepath.Join(home, ".kube", "config"))

	p, err = LoadCompose(context.Background(), root, []string{"KUBECONFIG=/etc/k/config"})
	if err != nil {
		t.Fatal(err)
	}
	watcher, _ = p.GetService("watcher")
	checkKubeconfig(t, watcher, "/etc/k/config")
}

// checkKubeconfig checks that -kubeconfig names a read-only bind mount of
// source.
func checkKubeconfig(t *testing.T, s types.ServiceConfig, source string) {
	t.Helper()
	path, ok := ComposeFlagValue(s, "kubeconfig")
	if !ok {
		t.Errorf("%s: -kubeconfig is not set", s.Name)
		return
	}
	i := slices.IndexFunc(s.Volumes, func(v types.ServiceVolumeConfig) bool { return v.Target == path })
	if i < 0 {
		t.Errorf("%s: -kubeconfig %s is not mounted", s.Name, path)
		return
	}
	v := s.Volumes[i]
	if v.Type != types.VolumeTypeBind || v.Source != source || !v.ReadOnly {
		t.Errorf("%s: %s is %s %s (read-only %v), want a read-only bind mount of %s", s.Name, path, v.Type, v.Source, v.ReadOnly, source)
	}
}

// TestDockerfile checks the Dockerfile against the workspace: every module
// of go.work is copied before `go mod download` (the workspace does not load
// otherwise), headwater is built (every service: -target picks one), the build information is
// stamped, and the image is static, non-root and built on the base files
// `make images` uses.
func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	work, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	useBlock := regexp.MustCompile(`(?s)use\s*\((.*?)\)`).FindSubmatch(work)
	if useBlock == nil {
		t.Fatal("go.work has no use ( ... ) block")
	}
	mods := strings.Fields(string(useBlock[1]))
	if len(mods) == 0 {
		t.Fatal("go.work uses no modules")
	}
	text := string(df)
	download := strings.Index(text, "go mod download")
	if download < 0 {
		t.Errorf("Dockerfile: no go mod download")
	}
	for _, m := range mods {
		m = strings.TrimPrefix(m, "./")
		line := "COPY " + m + "/go.mod " + m + "/go.sum " + m + "/"
		i := strings.Index(text, line)
		if i < 0 || (download >= 0 && i > download) {
			t.Errorf("Dockerfile: want %q before go mod download (module %s is in go.work)", line, m)
		}
	}
	for _, want := range []string{
		"CGO_ENABLED=0",
		"-trimpath",
		// One image: headwater, every service in one binary.
		"cd cmd/headwater",
		// The build information -version and headwater_build_info report.
		"ARG VERSION",
		"github.com/headwater-gitops/headwater/pkg/buildinfo",
		// The base `make images` builds (hack/imagebuild): CA roots,
		// passwd and group naming nonroot, /data and /tmp.
		"FROM scratch",
		"GOWORK=off go run . -base-dir /out/base",
		"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
		"org.opencontainers.image.revision",
		"USER 65532:65532",
		`ENTRYPOINT ["/headwater"]`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("Dockerfile: no %q", want)
		}
	}
	for _, s := range slices.Concat(Services, OptionalServices, Commands) {
		if !strings.Contains(text, s) {
			t.Errorf("Dockerfile: -target %s is not documented", s)
		}
	}

	ignore, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"bin/", ".run/", ".cache/"} {
		if !slices.Contains(strings.Fields(string(ignore)), want) {
			t.Errorf(".dockerignore: no %s", want)
		}
	}
}
