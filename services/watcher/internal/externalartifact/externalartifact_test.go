package externalartifact

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// newClient starts a control plane with Headwater's CRDs for the test and
// returns a client for it.
func newClient(t *testing.T) client.Client {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, which builds kube-apiserver and etcd")
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "..", "..", "deploy", "crds")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, sourcev1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func artifact(rev, digest string) *meta.Artifact {
	size := int64(10)
	return &meta.Artifact{Path: "externalartifact/default/a/x.tar.gz", URL: "http://as/externalartifact/default/a/x.tar.gz",
		Revision: rev, Digest: digest, Size: &size, LastUpdateTime: metav1.NewTime(time.Unix(1700000000, 0))}
}

func TestWriter(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	// Any kind can produce: a ConfigMap stands in for a generator here.
	producer := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "gen"}}
	if err := c.Create(ctx, producer); err != nil {
		t.Fatal(err)
	}
	w := &Writer{Client: c, Metrics: NewMetrics(prometheus.NewRegistry())}

	a1 := artifact("latest@sha256:1", "sha256:1")
	ea, change, err := w.Write(ctx, producer, Output{Name: "a", Artifact: a1, Ready: Stored(a1), Labels: map[string]string{"l": "v"}})
	if err != nil || change != Created {
		t.Fatalf("first write: %v, %v", change, err)
	}
	got := &sourcev1.ExternalArtifact{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "a"}, got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.SourceRef == nil || got.Spec.SourceRef.Kind != "ConfigMap" || got.Spec.SourceRef.Name != "gen" || got.Spec.SourceRef.APIVersion != "v1" {
		t.Errorf("sourceRef = %+v", got.Spec.SourceRef)
	}
	if len(got.OwnerReferences) != 1 || got.OwnerReferences[0].UID != producer.UID || got.OwnerReferences[0].Controller == nil || !*got.OwnerReferences[0].Controller {
		t.Errorf("ownerReferences = %+v", got.OwnerReferences)
	}
	if got.Status.Artifact == nil || got.Status.Artifact.Revision != a1.Revision || got.Status.Artifact.URL != a1.URL {
		t.Errorf("status.artifact = %+v", got.Status.Artifact)
	}
	ready := apimeta.FindStatusCondition(got.Status.Conditions, meta.ReadyCondition)
	if ready == nil || ready.Status != metav1.ConditionTrue || ready.Reason != meta.SucceededReason ||
		ready.Message != "stored artifact for revision 'latest@sha256:1'" || ready.ObservedGeneration != got.Generation {
		t.Errorf("Ready = %+v", ready)
	}
	if got.Labels["l"] != "v" || ea.Name != "a" {
		t.Errorf("labels = %v", got.Labels)
	}

	// The same again writes nothing.
	if _, change, err := w.Write(ctx, producer, Output{Name: "a", Artifact: a1, Ready: Stored(a1), Labels: map[string]string{"l": "v"}}); err != nil || change != Unchanged {
		t.Fatalf("same write: %v, %v", change, err)
	}

	// A failure keeps the artifact and sets Ready False.
	if _, change, err := w.Write(ctx, producer, Output{Name: "a", Ready: Failed("ValidationFailed", "bad glob")}); err != nil || change != Updated {
		t.Fatalf("failed write: %v, %v", change, err)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "a"}, got); err != nil {
		t.Fatal(err)
	}
	ready = apimeta.FindStatusCondition(got.Status.Conditions, meta.ReadyCondition)
	if got.Status.Artifact == nil || got.Status.Artifact.Digest != "sha256:1" || ready.Status != metav1.ConditionFalse || ready.Reason != "ValidationFailed" {
		t.Errorf("after failure: artifact %+v, Ready %+v", got.Status.Artifact, ready)
	}

	// Another producer may neither take it over nor delete it.
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other"}}
	if err := c.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.Write(ctx, other, Output{Name: "a", Artifact: a1, Ready: Stored(a1)}); !errors.Is(err, ErrForeign) {
		t.Errorf("write by another producer: %v, want ErrForeign", err)
	}
	if err := w.Delete(ctx, other, "a"); !errors.Is(err, ErrForeign) {
		t.Errorf("delete by another producer: %v, want ErrForeign", err)
	}

	// Its producer deletes it; deleting it again is no error.
	if err := w.Delete(ctx, producer, "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "a"}, got); !apierrors.IsNotFound(err) {
		t.Errorf("after delete: %v", err)
	}
	if err := w.Delete(ctx, producer, "a"); err != nil {
		t.Errorf("second delete: %v", err)
	}
}
