package harness

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDefineServicesWatchers checks the watcher replicas defineServices
// builds: each after the first, with telemetry and health addresses and a
// log of its own, the same command line otherwise; alongside extra
// artifact-server replicas, every address is distinct.
func TestDefineServicesWatchers(t *testing.T) {
	tests := []struct {
		name            string
		watchers        int
		artifactServers int
		want            []string // service names in start order
	}{
		{name: "default", want: []string{ArtifactServer, Packager, Fetcher, Watcher}},
		{name: "one watcher", watchers: 1, want: []string{ArtifactServer, Packager, Fetcher, Watcher}},
		{name: "two watchers", watchers: 2,
			want: []string{ArtifactServer, Packager, Fetcher, Watcher, Watcher + "-2"}},
		{name: "three watchers, two artifact-servers", watchers: 3, artifactServers: 2,
			want: []string{ArtifactServer, ArtifactServer + "-2", Packager, Fetcher, Watcher, Watcher + "-2", Watcher + "-3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			e := &Env{
				Config: Config{Dir: dir, BinDir: "/bin", WatcherReplicas: tt.watchers, ArtifactServerReplicas: tt.artifactServers,
					ExtraArgs: map[string][]string{Watcher: {"-leader-elect=true"}}},
				NATSURL:     "nats://127.0.0.1:4222",
				Kubeconfig:  filepath.Join(dir, "kubeconfig"),
				StoragePath: filepath.Join(dir, "storage"),
			}
			if err := e.defineServices(); err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, s := range e.Services() {
				names = append(names, s.Name)
			}
			if !slices.Equal(names, tt.want) {
				t.Fatalf("services %v, want %v", names, tt.want)
			}

			watchers := e.Watchers()
			if len(watchers) != max(tt.watchers, 1) {
				t.Fatalf("%d watchers, want %d", len(watchers), max(tt.watchers, 1))
			}
			first := watchers[0]
			for _, s := range watchers {
				if s.Path != filepath.Join("/bin", Watcher) {
					t.Errorf("%s runs %s", s.Name, s.Path)
				}
				if got, want := s.LogPath, filepath.Join(dir, "logs", s.Name+".log"); got != want {
					t.Errorf("%s logs to %s, want %s", s.Name, got, want)
				}
				if got := flagValue(s.Args, "-telemetry-addr"); got != s.TelemetryAddr {
					t.Errorf("%s: -telemetry-addr %s, telemetry %s", s.Name, got, s.TelemetryAddr)
				}
				if got, want := s.ReadyURL, "http://"+flagValue(s.Args, "-health-addr")+"/readyz"; got != want {
					t.Errorf("%s: ready URL %s, want %s", s.Name, got, want)
				}
				if !slices.Contains(s.Args, "-leader-elect=true") {
					t.Errorf("%s lacks the extra arguments: %v", s.Name, s.Args)
				}
				if got, want := flagValue(s.Args, "-nats-url"), flagValue(first.Args, "-nats-url"); got != want {
					t.Errorf("%s: -nats-url %s, want %s", s.Name, got, want)
				}
				if !slices.Equal(withoutTempDir(s.Env), withoutTempDir(first.Env)) {
					t.Errorf("%s: environment differs from %s's", s.Name, first.Name)
				}
				if want := filepath.Join(dir, "tmp", s.Name); s.TempDir != want || !slices.Contains(s.Env, "TMPDIR="+want) {
					t.Errorf("%s: temporary directory %q, want %s as TMPDIR", s.Name, s.TempDir, want)
				}
			}

			seen := map[string]string{}
			use := func(who, addr string) {
				if other, ok := seen[addr]; ok {
					t.Errorf("%s and %s share address %s", who, other, addr)
				}
				seen[addr] = who
			}
			for _, s := range e.Services() {
				use(s.Name+" telemetry", s.TelemetryAddr)
				if a := flagValue(s.Args, "-health-addr"); a != "" {
					use(s.Name+" health", a)
				}
				if a := flagValue(s.Args, "-storage-addr"); a != "" {
					use(s.Name+" storage", a)
				}
			}
		})
	}
}

// withoutTempDir is env without its TMPDIR, which is every process's own.
func withoutTempDir(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "TMPDIR=") })
}

// TestDefineServicesWorkers checks the fetcher and packager replicas
// defineServices builds: each after the first of its service, with a
// telemetry address, a log and a temporary directory of its own.
func TestDefineServicesWorkers(t *testing.T) {
	dir := t.TempDir()
	e := &Env{
		Config:      Config{Dir: dir, BinDir: "/bin", FetcherReplicas: 3, PackagerReplicas: 2, ArtifactServerReplicas: 2},
		NATSURL:     "nats://127.0.0.1:4222",
		Kubeconfig:  filepath.Join(dir, "kubeconfig"),
		StoragePath: filepath.Join(dir, "storage"),
	}
	if err := e.defineServices(); err != nil {
		t.Fatal(err)
	}
	var names []string
	seen := map[string]string{}
	for _, s := range e.Services() {
		names = append(names, s.Name)
		if other, ok := seen[s.TelemetryAddr]; ok {
			t.Errorf("%s and %s share telemetry address %s", s.Name, other, s.TelemetryAddr)
		}
		seen[s.TelemetryAddr] = s.Name
		if got := flagValue(s.Args, "-telemetry-addr"); got != s.TelemetryAddr {
			t.Errorf("%s: -telemetry-addr %s, telemetry %s", s.Name, got, s.TelemetryAddr)
		}
		if s.TempDir != filepath.Join(dir, "tmp", s.Name) {
			t.Errorf("%s: temporary directory %s", s.Name, s.TempDir)
		}
	}
	want := []string{ArtifactServer, ArtifactServer + "-2", Packager, Packager + "-2", Fetcher, Fetcher + "-2", Fetcher + "-3", Watcher}
	if !slices.Equal(names, want) {
		t.Fatalf("services %v, want %v", names, want)
	}
	if got := len(e.Replicas(Fetcher)); got != 3 {
		t.Errorf("%d fetchers, want 3", got)
	}
}

// TestDefineServicesWatcherShards: WatcherArgs gives each watcher replica
// its own arguments, after the ones they share.
func TestDefineServicesWatcherShards(t *testing.T) {
	dir := t.TempDir()
	e := &Env{
		Config: Config{Dir: dir, BinDir: "/bin", WatcherReplicas: 2,
			ExtraArgs: map[string][]string{Watcher: {"-leader-elect=true"}},
			WatcherArgs: [][]string{
				{"-watch-label-selector", "!sharding.fluxcd.io/key"},
				{"-watch-label-selector", "sharding.fluxcd.io/key in (shard1)"},
			}},
		NATSURL:     "nats://127.0.0.1:4222",
		Kubeconfig:  filepath.Join(dir, "kubeconfig"),
		StoragePath: filepath.Join(dir, "storage"),
	}
	if err := e.defineServices(); err != nil {
		t.Fatal(err)
	}
	watchers := e.Watchers()
	if len(watchers) != 2 {
		t.Fatalf("%d watchers, want 2", len(watchers))
	}
	for i, want := range []string{"!sharding.fluxcd.io/key", "sharding.fluxcd.io/key in (shard1)"} {
		s := watchers[i]
		if got := flagValue(s.Args, "-watch-label-selector"); got != want {
			t.Errorf("%s: selector %q, want %q", s.Name, got, want)
		}
		if !slices.Contains(s.Args, "-leader-elect=true") {
			t.Errorf("%s lacks the shared arguments: %v", s.Name, s.Args)
		}
		if n := strings.Count(strings.Join(s.Args, "\n"), "-watch-label-selector"); n != 1 {
			t.Errorf("%s has %d selectors: %v", s.Name, n, s.Args)
		}
	}
}
