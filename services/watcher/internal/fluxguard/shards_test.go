package fluxguard

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

func selector(t *testing.T, s string) labels.Selector {
	t.Helper()
	sel, err := labels.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

// TestDisjoint: the selectors of Flux's sharding docs are told apart; what
// cannot be told apart is taken to overlap.
func TestDisjoint(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"!sharding.fluxcd.io/key", "sharding.fluxcd.io/key in (shard1)", true},
		{"!sharding.fluxcd.io/key", "sharding.fluxcd.io/key", true},
		{"sharding.fluxcd.io/key in (shard1)", "sharding.fluxcd.io/key in (shard2)", true},
		{"sharding.fluxcd.io/key=shard1", "sharding.fluxcd.io/key in (shard2, shard3)", true},
		{"sharding.fluxcd.io/key in (shard1)", "sharding.fluxcd.io/key notin (shard1, shard2)", true},
		{"sharding.fluxcd.io/key in (shard1, shard2)", "sharding.fluxcd.io/key in (shard2)", false},
		{"sharding.fluxcd.io/key in (shard1)", "sharding.fluxcd.io/key notin (shard2)", false},
		{"sharding.fluxcd.io/key in (shard1)", "team=a", false},
		{"", "sharding.fluxcd.io/key in (shard1)", false},
		{"!sharding.fluxcd.io/key", "sharding.fluxcd.io/key notin (shard1)", false},
	} {
		a, b := selector(t, tc.a), selector(t, tc.b)
		if got := Disjoint(a, b); got != tc.want {
			t.Errorf("Disjoint(%q, %q) = %t, want %t", tc.a, tc.b, got, tc.want)
		}
		if got := Disjoint(b, a); got != tc.want {
			t.Errorf("Disjoint(%q, %q) = %t, want %t", tc.b, tc.a, got, tc.want)
		}
	}
}

// shard is Flux's source-controller of a shard, as Flux's sharding docs
// patch it: named source-controller-<shard>, with its selector.
func shard(ns, name string, replicas int32, args ...string) *appsv1.Deployment {
	d := sourceController(ns, replicas)
	d.Name = name
	d.Spec.Template.Spec.Containers[0].Args = append([]string{"--events-addr=http://notification-controller./"}, args...)
	return d
}

// TestGuardSeesShards runs the guard against a real API server: a Flux
// shard (source-controller-shard1, or a renamed Deployment of Flux's
// image) that can select this watcher's sources stops it; one whose
// selector or namespace cannot does not; Headwater's own artifact-server,
// labelled app: source-controller by the drop-in, is not Flux's.
func TestGuardSeesShards(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, which builds kube-apiserver and etcd")
	}
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "flux-system"}}); err != nil {
		t.Fatal(err)
	}
	headwater := sourceController("flux-system", 2)
	headwater.Name = "artifact-server"
	headwater.Labels = map[string]string{partOf: "headwater"}
	headwater.Spec.Template.Spec.Containers[0].Image = "headwater/headwater:dev"
	for _, d := range []*appsv1.Deployment{
		sourceController("flux-system", 0),
		shard("flux-system", "source-controller-shard1", 1, "--watch-label-selector=sharding.fluxcd.io/key in (shard1)"),
		shard("flux-system", "source-controller-team-b", 1, "--watch-all-namespaces=false"),
		headwater,
	} {
		if err := c.Create(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	guard := func(sel, ns string) *Guard {
		return &Guard{Reader: c, Namespaces: []string{"flux-system"}, Selector: selector(t, sel), Namespace: ns, Log: testr.New(t)}
	}
	// The main shard (!key) in the tenant namespace: Flux's shard1 and
	// namespaced team-b select none of its sources.
	if err := guard("!sharding.fluxcd.io/key", "tenant").Check(ctx); err != nil {
		t.Errorf("main shard beside Flux's shard1: %v", err)
	}
	// Headwater's shard1 beside Flux's shard1: stopped, told which.
	var running *RunningError
	err = guard("sharding.fluxcd.io/key in (shard1)", "tenant").Check(ctx)
	if !errors.As(err, &running) || running.Name != "source-controller-shard1" ||
		!strings.Contains(err.Error(), `source-controller-shard1 (--watch-label-selector="sharding.fluxcd.io/key in (shard1)")`) {
		t.Errorf("shard1 beside Flux's shard1: %v", err)
	}
	// Watching flux-system, where Flux's team-b controller reconciles.
	err = guard("!sharding.fluxcd.io/key", "flux-system").Check(ctx)
	if !errors.As(err, &running) || running.Name != "source-controller-team-b" {
		t.Errorf("flux-system beside Flux's namespaced controller: %v", err)
	}
	// A renamed Deployment of Flux's image is Flux's too.
	renamed := sourceController("flux-system", 1)
	renamed.Name, renamed.Labels = "sc", nil
	renamed.Spec.Template.Spec.Containers[0].Args = []string{"--watch-label-selector", "sharding.fluxcd.io/key in (shard2)"}
	if err := c.Create(ctx, renamed); err != nil {
		t.Fatal(err)
	}
	err = guard("sharding.fluxcd.io/key in (shard2, shard3)", "tenant").Check(ctx)
	if !errors.As(err, &running) || running.Name != "sc" {
		t.Errorf("beside a renamed Flux shard2: %v", err)
	}
}
