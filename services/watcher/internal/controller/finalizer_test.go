package controller

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TestFinalizerPatchKeepsOthersFinalizers writes the source finalizer from
// a stale copy after another controller added its own: the write must
// conflict rather than drop the other finalizer, and succeed on a fresh read
// with both kept, for adding and for removing.
func TestFinalizerPatchKeepsOthersFinalizers(t *testing.T) {
	_, _, c := controlPlane(t)
	ctx := context.Background()
	const other = "example.com/other"

	repo := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default"},
		Spec: sourcev1.GitRepositorySpec{URL: "https://example.com/podinfo.git"}}
	if err := c.Create(ctx, repo); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name   string
		change func(client.Object, string) bool
		want   []string
	}{
		{"add", controllerutil.AddFinalizer, []string{other, sourcev1.SourceFinalizer}},
		{"remove", controllerutil.RemoveFinalizer, []string{other}},
	} {
		t.Run(step.name, func(t *testing.T) {
			stale := &sourcev1.GitRepository{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(repo), stale); err != nil {
				t.Fatal(err)
			}
			// Another controller changes the finalizers first.
			fresh := stale.DeepCopy()
			if step.name == "add" {
				controllerutil.AddFinalizer(fresh, other)
			} else {
				fresh.Annotations = map[string]string{"touched": "yes"}
			}
			if err := c.Update(ctx, fresh); err != nil {
				t.Fatal(err)
			}
			if err := patchFinalizers(ctx, c, stale, step.change); !apierrors.IsConflict(err) {
				t.Fatalf("patch from a stale copy: %v, want a conflict", err)
			}
			if err := c.Get(ctx, client.ObjectKeyFromObject(repo), stale); err != nil {
				t.Fatal(err)
			}
			if err := patchFinalizers(ctx, c, stale, step.change); err != nil {
				t.Fatalf("patch from a fresh copy: %v", err)
			}
			got := &sourcev1.GitRepository{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(repo), got); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Finalizers, step.want) {
				t.Errorf("finalizers = %q, want %q", got.Finalizers, step.want)
			}
		})
	}
}

// controlPlane starts kube-apiserver and etcd with the source CRDs for the
// test, stopped when it ends, and returns its config, a scheme with the
// source kinds and a client.
func controlPlane(t *testing.T) (*rest.Config, *runtime.Scheme, client.Client) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, which builds kube-apiserver and etcd")
	}
	testEnv := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "..", "..", "deploy", "crds")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := testEnv.Start()
	if err != nil {
		_ = testEnv.Stop() // what started before the failure (a CRD that did not install)
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() { _ = testEnv.Stop() })
	scheme := runtime.NewScheme()
	if err := sourcev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, scheme, c
}
