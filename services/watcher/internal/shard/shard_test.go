package shard

import (
	"flag"
	"io"
	"strings"
	"testing"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// parse binds Options to a flag set and parses args as the command does.
func parse(t *testing.T, args ...string) (Options, error) {
	t.Helper()
	var o Options
	fs := flag.NewFlagSet("watcher", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.BindFlags(fs)
	return o, fs.Parse(args)
}

func repo(ns string, labels map[string]string) *sourcev1.GitRepository {
	return &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "podinfo", Labels: labels}}
}

// TestSelectorFlag: Flux's selectors parse and select as in Flux; one that
// does not parse is a bad flag whose error names the flag.
func TestSelectorFlag(t *testing.T) {
	shard1 := map[string]string{"sharding.fluxcd.io/key": "shard1"}
	shard2 := map[string]string{"sharding.fluxcd.io/key": "shard2"}
	none := map[string]string{"app": "podinfo"}
	for _, tc := range []struct {
		selector string
		owns     map[string]bool // by label value, "" for none
	}{
		{"", map[string]bool{"shard1": true, "shard2": true, "": true}},
		{"sharding.fluxcd.io/key in (shard1)", map[string]bool{"shard1": true}},
		{"sharding.fluxcd.io/key=shard1", map[string]bool{"shard1": true}},
		{"!sharding.fluxcd.io/key", map[string]bool{"": true}},
		{"sharding.fluxcd.io/key in (shard1, shard2)", map[string]bool{"shard1": true, "shard2": true}},
	} {
		o, err := parse(t, "-watch-label-selector", tc.selector)
		if err != nil {
			t.Fatalf("%q: %v", tc.selector, err)
		}
		s, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		for value, labels := range map[string]map[string]string{"shard1": shard1, "shard2": shard2, "": none} {
			if got := s.Owns(repo("default", labels)); got != tc.owns[value] {
				t.Errorf("%q owns a source labelled %v: %t, want %t", tc.selector, labels, got, tc.owns[value])
			}
		}
	}
	for _, bad := range []string{"sharding.fluxcd.io/key in (shard1", "sharding.fluxcd.io/key=in=x", "a b c"} {
		_, err := parse(t, "--watch-label-selector="+bad)
		if err == nil || !strings.Contains(err.Error(), "watch-label-selector") || !strings.Contains(err.Error(), "does not parse") {
			t.Errorf("selector %q: %v, want an error naming the flag", bad, err)
		}
	}
	if _, err := parse(t, "-fleet-selectors", "!sharding.fluxcd.io/key;sharding.fluxcd.io/key in (shard1"); err == nil ||
		!strings.Contains(err.Error(), FleetFlag) {
		t.Errorf("bad fleet selector: %v, want an error naming the flag", err)
	}
}

// TestLeaseName: the unsharded watcher keeps its lease; every shard has
// its own, the same for the same selector however it is spaced, another
// for another selector or namespace.
func TestLeaseName(t *testing.T) {
	lease := func(args ...string) string {
		t.Helper()
		o, err := parse(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		return s.LeaseName("headwater-watcher")
	}
	if got := lease(); got != "headwater-watcher" {
		t.Errorf("unsharded lease %q, want headwater-watcher", got)
	}
	seen := map[string]string{}
	for _, args := range [][]string{
		{"-watch-label-selector", "sharding.fluxcd.io/key in (shard1)"},
		{"-watch-label-selector", "sharding.fluxcd.io/key in (shard2)"},
		{"-watch-label-selector", "!sharding.fluxcd.io/key"},
		{"-watch-all-namespaces=false", "-watch-namespace", "team-a"},
		{"-watch-all-namespaces=false", "-watch-namespace", "team-a", "-watch-label-selector", "!sharding.fluxcd.io/key"},
	} {
		name := lease(args...)
		if !strings.HasPrefix(name, "headwater-watcher-") || len(name) != len("headwater-watcher-")+8 {
			t.Errorf("%q: lease %q, want headwater-watcher-<8 hex digits>", args, name)
		}
		if other, ok := seen[name]; ok {
			t.Errorf("%q and %q share the lease %q", args, other, name)
		}
		seen[name] = strings.Join(args, " ")
	}
	if a, b := lease("-watch-label-selector", "sharding.fluxcd.io/key in (shard1)"),
		lease("-watch-label-selector", "sharding.fluxcd.io/key in ( shard1 )"); a != b {
		t.Errorf("the same selector spaced otherwise has lease %q, not %q", b, a)
	}
}

// TestNamespace: -watch-all-namespaces=false watches -watch-namespace, else
// $RUNTIME_NAMESPACE as Flux, and refuses to guess.
func TestNamespace(t *testing.T) {
	t.Setenv(RuntimeNamespaceEnv, "")
	o, _ := parse(t, "-watch-all-namespaces=false")
	if _, err := New(o); err == nil || !strings.Contains(err.Error(), AllNamespacesFlag) {
		t.Errorf("no namespace: %v, want an error naming the flags", err)
	}
	t.Setenv(RuntimeNamespaceEnv, "flux-system")
	s, err := New(o)
	if err != nil || s.Namespace != "flux-system" {
		t.Fatalf("namespace %q, %v; want $RUNTIME_NAMESPACE", s.Namespace, err)
	}
	if s.Owns(repo("default", nil)) || !s.Owns(repo("flux-system", nil)) {
		t.Error("a namespaced shard owns sources of its namespace alone")
	}
	opts := s.CacheOptions(cache.Options{}, []client.Object{&sourcev1.GitRepository{}})
	if _, ok := opts.DefaultNamespaces["flux-system"]; !ok || len(opts.DefaultNamespaces) != 1 {
		t.Errorf("cache namespaces %v, want flux-system alone", opts.DefaultNamespaces)
	}
	o, _ = parse(t, "-watch-all-namespaces=false", "-watch-namespace", "team-a")
	if s, _ := New(o); s.Namespace != "team-a" {
		t.Errorf("namespace %q, want -watch-namespace's team-a", s.Namespace)
	}
}

// TestCacheOptions: the selector applies to the source kinds given, and
// to no other object.
func TestCacheOptions(t *testing.T) {
	o, _ := parse(t, "-watch-label-selector", "sharding.fluxcd.io/key in (shard1)")
	s, _ := New(o)
	git, chart := &sourcev1.GitRepository{}, &sourcev1.HelmChart{}
	opts := s.CacheOptions(cache.Options{}, []client.Object{git, chart})
	if len(opts.ByObject) != 2 || opts.DefaultNamespaces != nil {
		t.Fatalf("cache options %+v, want two kinds selected, every namespace", opts)
	}
	for _, obj := range []client.Object{git, chart} {
		if l := opts.ByObject[obj].Label; l == nil || l.String() != "sharding.fluxcd.io/key in (shard1)" {
			t.Errorf("%T selected by %v", obj, l)
		}
	}
	unsharded, _ := New(Options{})
	if opts := unsharded.CacheOptions(cache.Options{}, []client.Object{git}); opts.ByObject != nil {
		t.Errorf("the unsharded watcher selects %v", opts.ByObject)
	}
}

// TestFleetOwns: a source whose shard label has a typo matches no shard
// of a fleet configured as Flux's sharding docs.
func TestFleetOwns(t *testing.T) {
	o, err := parse(t, "-fleet-selectors", "!sharding.fluxcd.io/key; sharding.fluxcd.io/key in (shard1, shard2)")
	if err != nil {
		t.Fatal(err)
	}
	for labels, want := range map[string]bool{"": true, "shard1": true, "shard2": true, "shard-1": false, "shard3": false} {
		l := map[string]string{}
		if labels != "" {
			l["sharding.fluxcd.io/key"] = labels
		}
		if got := o.Fleet.Owns(l); got != want {
			t.Errorf("fleet owns %v: %t, want %t", l, got, want)
		}
	}
}

// TestReporter: a source whose shard label has a typo is reported unowned
// (gauge and a log line naming it) until its label is fixed or it is
// deleted; the sources the fleet's shards select are not.
func TestReporter(t *testing.T) {
	var fleet Fleet
	if err := fleet.Set("!sharding.fluxcd.io/key;sharding.fluxcd.io/key in (shard1)"); err != nil {
		t.Fatal(err)
	}
	var logged []string
	r := &Reporter{Fleet: fleet, Unowned: NewUnownedGauge(prometheus.NewRegistry()),
		Log: funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{})}
	unowned := func() float64 { return testutil.ToFloat64(r.Unowned.WithLabelValues("GitRepository")) }

	owned := repo("default", map[string]string{"sharding.fluxcd.io/key": "shard1"})
	typo := repo("default", map[string]string{"sharding.fluxcd.io/key": "shard-1"})
	typo.Name = "typo"
	r.Observe("GitRepository", owned)
	r.Observe("GitRepository", repo("default", nil))
	if got := unowned(); got != 0 || len(logged) != 0 {
		t.Fatalf("owned sources: gauge %v, logged %q", got, logged)
	}
	r.Observe("GitRepository", typo)
	r.Observe("GitRepository", typo) // an update: logged once
	if got := unowned(); got != 1 {
		t.Errorf("gauge %v with a typo, want 1", got)
	}
	if len(logged) != 1 || !strings.Contains(logged[0], `"name"="typo"`) || !strings.Contains(logged[0], "shard-1") {
		t.Errorf("logged %q, want one line naming the source and its label", logged)
	}
	fixed := typo.DeepCopy()
	fixed.Labels["sharding.fluxcd.io/key"] = "shard1"
	r.Observe("GitRepository", fixed)
	if got := unowned(); got != 0 {
		t.Errorf("gauge %v once fixed, want 0", got)
	}
	r.Observe("GitRepository", typo)
	r.Forget("GitRepository", toolscache.DeletedFinalStateUnknown{Key: "default/typo", Obj: typo})
	if got := unowned(); got != 0 {
		t.Errorf("gauge %v once deleted, want 0", got)
	}
}
