package deployvalidate

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// repoRoot is the repository the tests validate.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func TestEnvName(t *testing.T) {
	tests := []struct{ flag, want string }{
		{"nats-url", "HEADWATER_NATS_URL"},
		{"storage-s3-access-key", "HEADWATER_STORAGE_S3_ACCESS_KEY"},
		{"leader-elect", "HEADWATER_LEADER_ELECT"},
		{"a.b-c", "HEADWATER_A_B_C"},
	}
	for _, tt := range tests {
		if got := EnvName(tt.flag); got != tt.want {
			t.Errorf("EnvName(%q) = %q, want %q", tt.flag, got, tt.want)
		}
	}
}

// TestEnvNameMatchesFlagenv guards the copy of flagenv.EnvName above (this
// module is outside the workspace and cannot import it): the rule in
// pkg/flagenv must still be the one EnvName implements.
func TestEnvNameMatchesFlagenv(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(repoRoot(t), "pkg", "flagenv", "flagenv.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`const Prefix = "` + EnvPrefix + `"`,
		`Prefix + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(flagName))`,
	} {
		if !strings.Contains(string(src), want) {
			t.Errorf("pkg/flagenv/flagenv.go no longer contains %q: update EnvName", want)
		}
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name     string
		src      string
		want     []string
		wantBool []string
	}{
		{
			name: "typed Var forms",
			src: `fs.StringVar(&o.URL, "nats-url", nats.DefaultURL, "NATS.")
	fs.IntVar(&o.concurrency, "concurrency", 4, "Jobs.")
	fs.Uint64Var(&o.maxAttempts, "max-attempts", 5, "Attempts.")
	fs.Int64Var(&o.max, "max-file-size", 0, "Bytes.")
	fs.DurationVar(&o.ttl, "staging-ttl", time.Hour, "TTL.")
	fs.Float64Var(&o.j, "interval-jitter-percentage", 5, "Jitter.")
	fs.BoolVar(&o.le, "leader-elect", true, "Elect.")
	fs.TextVar(&o.level, "level", lvl, "Level.")`,
			want:     []string{"concurrency", "interval-jitter-percentage", "leader-elect", "level", "max-attempts", "max-file-size", "nats-url", "staging-ttl"},
			wantBool: []string{"leader-elect"},
		},
		{
			name: "generic Var and a call split over lines",
			src: `fs.Var(&o.sinks, "event-sink-url",
		"HTTP endpoint.")
	fs.StringVar(&o.ns, "leader-election-namespace", "",
		"Namespace.")`,
			want: []string{"event-sink-url", "leader-election-namespace"},
		},
		{
			name:     "value and func forms",
			src:      `u := fs.String("url", "", "URL."); fs.Bool("dry-run", false, ""); fs.Func("sink", "", f); fs.BoolFunc("v", "", g)`,
			want:     []string{"dry-run", "sink", "url", "v"},
			wantBool: []string{"dry-run", "v"},
		},
		{
			name: "not registrations",
			src:  `log.Info("starting", "concurrency", 4); x := strings.Fields("a b"); fs.StringVar(&o.x, name, "", ""); os.Getenv("HEADWATER_X")`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseFlags("x.go", tt.src)
			if names := got.Names(); !slices.Equal(names, tt.want) && (len(names) > 0 || len(tt.want) > 0) {
				t.Errorf("flags = %v, want %v", names, tt.want)
			}
			for _, n := range got.Names() {
				if got[n].Bool != slices.Contains(tt.wantBool, n) {
					t.Errorf("flag %s: Bool = %v", n, got[n].Bool)
				}
			}
		})
	}
}

// TestServiceFlags checks the discovery on the real services: flags bound in
// main, in pkg option structs and in a service's internal packages.
func TestServiceFlags(t *testing.T) {
	flags, err := AllServiceFlags(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"watcher":         {"nats-url", "telemetry-addr", "log-level", "kubeconfig", "health-addr", "leader-elect", "leader-election-namespace", "concurrency"},
		"artifact-server": {"nats-url", "telemetry-addr", "storage-backend", "storage-path", "storage-s3-access-key", "storage-addr", "storage-adv-addr", "event-sink-url"},
		"fetcher":         {"nats-url", "telemetry-addr", "storage-backend", "storage-path", "concurrency"},
		"packager":        {"nats-url", "telemetry-addr", "storage-backend", "storage-path", "concurrency"},
	}
	for service, names := range want {
		for _, n := range names {
			if _, ok := flags[service][n]; !ok {
				t.Errorf("%s: flag %s not found (found %v)", service, n, flags[service].Names())
			}
		}
	}
	// The watcher has no storage: it must not inherit another package's flags.
	if _, ok := flags["watcher"]["storage-path"]; ok {
		t.Errorf("watcher: storage-path found, but the watcher binds no storage flags")
	}
	if !flags["watcher"]["leader-elect"].Bool {
		t.Errorf("watcher: leader-elect is not recognised as a boolean flag")
	}
}

func TestCheckEnvAndArgs(t *testing.T) {
	flags := FlagSet{
		"nats-url":     {Name: "nats-url"},
		"leader-elect": {Name: "leader-elect", Bool: true},
		"concurrency":  {Name: "concurrency"},
	}
	tests := []struct {
		name     string
		env      []string
		args     []string
		problems int
	}{
		{name: "known", env: []string{"HEADWATER_NATS_URL", "POD_NAMESPACE", "HOME"}, args: []string{"-nats-url=nats://x:4222", "--concurrency", "2", "-leader-elect"}},
		{name: "unknown env", env: []string{"HEADWATER_NATS_URLS"}, problems: 1},
		{name: "unknown arg", args: []string{"--nats-urls=x"}, problems: 1},
		{name: "positional", args: []string{"serve"}, problems: 1},
		{name: "missing value", args: []string{"--concurrency"}, problems: 1},
		{name: "bool consumes no value", args: []string{"-leader-elect", "true"}, problems: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := append(CheckEnv("svc", flags, tt.env), CheckArgs("svc", flags, tt.args)...)
			if len(got) != tt.problems {
				t.Errorf("problems = %q, want %d", got, tt.problems)
			}
		})
	}
}

func TestArgValue(t *testing.T) {
	tests := []struct {
		args   []string
		want   string
		wantOK bool
	}{
		{args: []string{"-storage-addr=:9090"}, want: ":9090", wantOK: true},
		{args: []string{"--storage-addr", ":9091"}, want: ":9091", wantOK: true},
		{args: []string{"--storage-adv-addr=x", "-storage-addr=:1", "-storage-addr=:2"}, want: ":2", wantOK: true},
		{args: []string{"--storage-adv-addr=x"}},
	}
	for _, tt := range tests {
		got, ok := ArgValue(tt.args, "storage-addr")
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("ArgValue(%q) = %q, %v; want %q, %v", tt.args, got, ok, tt.want, tt.wantOK)
		}
	}
}
