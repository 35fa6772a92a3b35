package fluxflags

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/flagenv"
)

// role is a role's own flags: some under Headwater's names, one under
// Flux's.
type role struct {
	concurrency int
	leaderElect bool
	logFormat   string
	requeue     time.Duration
}

func newRole() (*role, *flag.FlagSet) {
	var r role
	fs := flag.NewFlagSet("role", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&r.concurrency, "concurrency", 4, "")
	fs.BoolVar(&r.leaderElect, "leader-elect", true, "")
	fs.StringVar(&r.logFormat, "log-format", "json", "")
	fs.DurationVar(&r.requeue, "requeue-dependency", time.Minute, "")
	Bind(fs)
	return &r, fs
}

func TestBindAliases(t *testing.T) {
	r, fs := newRole()
	if err := flagenv.Parse(fs, []string{"--concurrent=10", "--enable-leader-election=false", "--log-encoding", "console", "--requeue-dependency=5s"}); err != nil {
		t.Fatal(err)
	}
	if r.concurrency != 10 || r.leaderElect || r.logFormat != "console" || r.requeue != 5*time.Second {
		t.Errorf("role = %+v; want the aliases to set concurrency 10, leader-elect false, log-format console, and Flux's own flag 5s", *r)
	}
	// A boolean alias stands alone.
	r, fs = newRole()
	r.leaderElect = false
	if err := fs.Parse([]string{"--enable-leader-election"}); err != nil || !r.leaderElect {
		t.Errorf("--enable-leader-election alone: %v, leader-elect %v", err, r.leaderElect)
	}
}

// TestEveryFluxFlagBound: after Bind, every flag of Flux's is defined,
// and the role's own flags are not replaced.
func TestEveryFluxFlagBound(t *testing.T) {
	_, fs := newRole()
	for _, f := range SourceController {
		if fs.Lookup(f.Name) == nil {
			t.Errorf("--%s not bound", f.Name)
		}
	}
	if _, ok := fs.Lookup("requeue-dependency").Value.(*noEffect); ok {
		t.Error("the role's own -requeue-dependency was replaced")
	}
	// A role without the watcher's sharding flags takes Flux's with no
	// effect (the watcher's own are checked in cmd/headwater).
	for _, name := range []string{"watch-all-namespaces", "watch-label-selector"} {
		if _, ok := fs.Lookup(name).Value.(*noEffect); !ok {
			t.Errorf("--%s is not a flag with no effect in a role without it", name)
		}
	}
}

// TestBadValues: a Flux flag with a bad value, or an unknown feature gate,
// is an error naming the flag.
func TestBadValues(t *testing.T) {
	tests := []struct {
		arg, want string
	}{
		{"--concurrent=many", "-concurrent"},
		{"--enable-leader-election=maybe", "-enable-leader-election"},
		{"--storage-path", "-storage-path"}, // no value
		{"--kube-api-qps=fast", "-kube-api-qps"},
		{"--kube-api-burst=1.5", "-kube-api-burst"},
		{"--helm-cache-ttl=15", "-helm-cache-ttl"},
		{"--min-retry-delay=soon", "-min-retry-delay"},
		{"--interval-jitter-percentage=300", "-interval-jitter-percentage"},
		{"--leader-election-release-on-cancel=yes please", "-leader-election-release-on-cancel"},
		{"--feature-gates=NoSuchGate=true", "NoSuchGate"},
		{"--feature-gates=CacheSecretsAndConfigMaps", "CacheSecretsAndConfigMaps"},
		{"--feature-gates=ObjectLevelWorkloadIdentity=perhaps", "ObjectLevelWorkloadIdentity"},
		{"--no-such-flag=1", "no-such-flag"},
	}
	for _, tt := range tests {
		t.Run(tt.arg, func(t *testing.T) {
			_, fs := newRole()
			var out bytes.Buffer
			fs.SetOutput(&out)
			err := fs.Parse([]string{tt.arg})
			if err == nil {
				t.Fatalf("%s parsed", tt.arg)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not name %s", err, tt.want)
			}
		})
	}
}

// TestLogNoEffect: each flag given that has no effect, and each gate, is
// logged once with why; aliases and unset flags are not.
func TestLogNoEffect(t *testing.T) {
	_, fs := newRole()
	t.Setenv("HEADWATER_STORAGE_ADDR", ":9999")
	if err := flagenv.Parse(fs, []string{"--storage-path=/data", "--concurrent=3",
		"--feature-gates=CacheSecretsAndConfigMaps=true", "--feature-gates=ObjectLevelWorkloadIdentity=false"}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	LogNoEffect(fs, logr.FromSlogHandler(slog.NewJSONHandler(&buf, nil)))
	type line struct {
		Msg, Flag, Gate, Value, Reason string
	}
	var got []line
	for _, s := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var l line
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatal(err)
		}
		if l.Reason == "" {
			t.Errorf("no reason: %s", s)
		}
		got = append(got, line{Msg: l.Msg, Flag: l.Flag, Gate: l.Gate, Value: l.Value})
	}
	want := []line{
		{Msg: "feature gate has no effect in Headwater", Flag: "feature-gates", Gate: "CacheSecretsAndConfigMaps"},
		{Msg: "feature gate has no effect in Headwater", Flag: "feature-gates", Gate: "ObjectLevelWorkloadIdentity"},
		{Msg: "flag has no effect in Headwater", Flag: "storage-addr", Value: ":9999"},
		{Msg: "flag has no effect in Headwater", Flag: "storage-path", Value: "/data"},
	}
	if len(got) != len(want) {
		t.Fatalf("logged %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestGatesRepeat: -feature-gates given twice adds up, as Flux's.
func TestGatesRepeat(t *testing.T) {
	_, fs := newRole()
	if err := fs.Parse([]string{"--feature-gates=CacheSecretsAndConfigMaps=true", "--feature-gates", "ObjectLevelWorkloadIdentity=true"}); err != nil {
		t.Fatal(err)
	}
	if got := fs.Lookup("feature-gates").Value.String(); got != "CacheSecretsAndConfigMaps=true,ObjectLevelWorkloadIdentity=true" {
		t.Errorf("feature-gates = %q", got)
	}
}

// TestImplementedGate: a role that binds NewGates(ObjectLevelWorkloadIdentity)
// as -feature-gates sees the gate as set (off by default, as Flux) and
// logs only the gates it does not implement as having no effect.
func TestImplementedGate(t *testing.T) {
	fs := flag.NewFlagSet("role", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	g := NewGates(ObjectLevelWorkloadIdentity)
	fs.Var(g, "feature-gates", "")
	Bind(fs)
	if g.Enabled(ObjectLevelWorkloadIdentity) {
		t.Fatal("ObjectLevelWorkloadIdentity on by default")
	}
	if err := fs.Parse([]string{"--feature-gates=ObjectLevelWorkloadIdentity=true,CacheSecretsAndConfigMaps=true"}); err != nil {
		t.Fatal(err)
	}
	if !g.Enabled(ObjectLevelWorkloadIdentity) {
		t.Error("ObjectLevelWorkloadIdentity=true not enabled")
	}
	var buf bytes.Buffer
	LogNoEffect(fs, logr.FromSlogHandler(slog.NewJSONHandler(&buf, nil)))
	if got := buf.String(); strings.Contains(got, ObjectLevelWorkloadIdentity) || !strings.Contains(got, "CacheSecretsAndConfigMaps") {
		t.Errorf("logged %s, want CacheSecretsAndConfigMaps only", got)
	}
	if m := Meaning(fs, "feature-gates"); !strings.Contains(m, "implements "+ObjectLevelWorkloadIdentity) {
		t.Errorf("meaning %q", m)
	}
}
