package fluxguard

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// eventually polls cond until it holds or ten seconds pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ptrTo(n int32) *int32 { return &n }

// sourceController is Flux's source-controller Deployment, as `flux
// install` makes it, with replicas.
func sourceController(ns string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": "source-controller"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: Name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptrTo(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{
					{Name: "manager", Image: "ghcr.io/fluxcd/source-controller:v1.9.1"},
				}},
			},
		},
	}
}

// TestGuard runs the guard against a real API server: it passes with no
// Flux, and with Flux's source-controller scaled to 0; it says where Flux's
// controller runs and what to do, on Check and on Ready, and Wait waits
// until it is scaled to 0; Start stops once it is scaled up again.
func TestGuard(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, which builds kube-apiserver and etcd")
	}
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop() // what started before the failure (a CRD that did not install)
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, ns := range []string{"flux-system", "tenant"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	g := &Guard{Reader: c, Namespaces: []string{"flux-system", "tenant"}, Interval: 50 * time.Millisecond, Log: testr.New(t)}

	if err := g.Check(ctx); err != nil {
		t.Fatalf("no Flux: %v", err)
	}
	// Scaled to 0 in one namespace is no problem.
	if err := c.Create(ctx, sourceController("tenant", 0)); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx); err != nil {
		t.Fatalf("Flux's source-controller scaled to 0: %v", err)
	}

	// Running in the other: Check and Ready say so, Wait waits.
	flux := sourceController("flux-system", 1)
	if err := c.Create(ctx, flux); err != nil {
		t.Fatal(err)
	}
	err = g.Check(ctx)
	var running *RunningError
	if !errors.As(err, &running) || running.Namespace != "flux-system" || running.Replicas != 1 {
		t.Fatalf("Flux's source-controller runs in flux-system: Check says %v", err)
	}
	const want = "Flux's source-controller Deployment is running in flux-system (1 replicas); scale it to 0"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("Check says %q, want it to say %q", err, want)
	}
	waited := make(chan error, 1)
	go func() { waited <- g.Wait(ctx) }()
	eventually(t, "Ready to report Flux's source-controller", func() bool {
		err := g.Ready()
		return err != nil && strings.Contains(err.Error(), want)
	})
	select {
	case err := <-waited:
		t.Fatalf("Wait returned while Flux's source-controller runs: %v", err)
	case <-time.After(200 * time.Millisecond):
	}

	// Scaled to 0: Wait returns, Ready passes.
	flux.Spec.Replicas = ptrTo(0)
	if err := c.Update(ctx, flux); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return once Flux's source-controller was scaled to 0")
	}
	if err := g.Ready(); err != nil {
		t.Errorf("Ready after the scale to 0: %v", err)
	}

	// Running again: Start returns the RunningError.
	started := make(chan error, 1)
	go func() { started <- g.Start(ctx) }()
	flux.Spec.Replicas = ptrTo(2)
	if err := c.Update(ctx, flux); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-started:
		if !errors.As(err, &running) || running.Replicas != 2 {
			t.Fatalf("Start returned %v, want Flux's source-controller with 2 replicas", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start did not stop when Flux's source-controller was scaled up")
	}

	// Off: no namespaces, nothing to find.
	if err := (&Guard{Reader: c}).Check(ctx); err != nil {
		t.Errorf("a guard with no namespaces: %v", err)
	}
}
