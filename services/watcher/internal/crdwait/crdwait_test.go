package crdwait

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// fluxKinds are the kinds the watcher reconciles by default.
var fluxKinds = []schema.GroupVersionKind{
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "GitRepository"},
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "HelmRepository"},
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "HelmChart"},
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "Bucket"},
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "OCIRepository"},
}

// TestWaitForCRDs runs the waiter against a real API server that serves
// none of the kinds, then a part of them, then all: it names exactly the
// missing kinds and the hint on Check and Ready, and Wait returns once
// every one is served.
func TestWaitForCRDs(t *testing.T) {
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
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w := &Waiter{Discovery: disco, Kinds: fluxKinds, Hint: "kubectl apply -k deploy/crds", Interval: 50 * time.Millisecond, Log: testr.New(t)}

	// Nothing served: every kind is named, in order, with the hint.
	err = w.Check()
	var missing *MissingError
	if !errors.As(err, &missing) || len(missing.Kinds) != len(fluxKinds) {
		t.Fatalf("no CRD installed: Check says %v", err)
	}
	if want := "the API server does not serve Bucket (source.toolkit.fluxcd.io/v1, Flux 2.5 and later), " +
		"GitRepository (source.toolkit.fluxcd.io/v1, Flux 2.0 and later), HelmChart (source.toolkit.fluxcd.io/v1, Flux 2.3 and later), " +
		"HelmRepository (source.toolkit.fluxcd.io/v1, Flux 2.3 and later), OCIRepository (source.toolkit.fluxcd.io/v1, Flux 2.6 and later); " +
		"Headwater works with the CRDs of Flux 2.7 and later (an older Flux's CRDs lack these kinds): " +
		"kubectl apply -k deploy/crds"; err.Error() != want {
		t.Errorf("Check says\n  %s\nwant\n  %s", err, want)
	}
	if w.Ready() == nil {
		t.Error("Ready passes while no kind is served")
	}

	// One CRD: the group is served, the others are still named.
	crds := filepath.Join("..", "..", "..", "..", "deploy", "crds")
	install := func(files ...string) {
		t.Helper()
		var paths []string
		for _, f := range files {
			paths = append(paths, filepath.Join(crds, f))
		}
		if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: paths, ErrorIfPathMissing: true}); err != nil {
			t.Fatal(err)
		}
	}
	install("source.toolkit.fluxcd.io_gitrepositories.yaml")
	err = w.Check()
	if !errors.As(err, &missing) || len(missing.Kinds) != len(fluxKinds)-1 || strings.Contains(err.Error(), "GitRepository") {
		t.Fatalf("GitRepository installed: Check says %v", err)
	}

	// The rest while Wait waits: it returns, and Ready passes; Report is
	// told what was missing once.
	reports := make(chan *MissingError, 10)
	w.Report = func(m *MissingError) { reports <- m }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Wait(ctx) }()
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v with four kinds missing", err)
	default:
	}
	entries, err := os.ReadDir(crds)
	if err != nil {
		t.Fatal(err)
	}
	var rest []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "source.toolkit.fluxcd.io_") && e.Name() != "source.toolkit.fluxcd.io_gitrepositories.yaml" {
			rest = append(rest, e.Name())
		}
	}
	install(rest...)
	if err := <-done; err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if err := w.Ready(); err != nil {
		t.Errorf("Ready after Wait: %v", err)
	}
	close(reports)
	var got []*MissingError
	for m := range reports {
		got = append(got, m)
	}
	// Once per change: first the four kinds, then fewer as the CRDs
	// install, never the same twice in a row.
	if len(got) == 0 || len(got[0].Kinds) != len(fluxKinds)-1 {
		t.Fatalf("Report was told %v, want the four kinds missing first", got)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Error() == got[i-1].Error() || len(got[i].Kinds) >= len(got[i-1].Kinds) {
			t.Errorf("report %d (%v) does not follow a change from %v", i, got[i], got[i-1])
		}
	}
}

// TestMissingErrorNamesFluxRelease: a cluster on Flux 2.6 lacks the
// ExternalArtifact and ArtifactGenerator kinds; the message says which
// release brought them, and a plug-in kind gets no Flux release.
func TestMissingErrorNamesFluxRelease(t *testing.T) {
	err := &MissingError{Kinds: []schema.GroupVersionKind{
		{Group: "source.extensions.fluxcd.io", Version: "v1beta1", Kind: "ArtifactGenerator"},
		{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "ExternalArtifact"},
		{Group: "source.headwater.dev", Version: "v1alpha1", Kind: "HTTPSource"},
	}}
	want := "the API server does not serve ArtifactGenerator (source.extensions.fluxcd.io/v1beta1, Flux 2.7 and later), " +
		"ExternalArtifact (source.toolkit.fluxcd.io/v1, Flux 2.7 and later), HTTPSource (source.headwater.dev/v1alpha1); " +
		"Headwater works with the CRDs of Flux 2.7 and later (an older Flux's CRDs lack these kinds)"
	if err.Error() != want {
		t.Errorf("got\n  %s\nwant\n  %s", err, want)
	}
	plugin := &MissingError{Kinds: []schema.GroupVersionKind{{Group: "source.headwater.dev", Version: "v1alpha1", Kind: "HTTPSource"}}, Hint: "apply it"}
	if got := plugin.Error(); strings.Contains(got, "Flux") {
		t.Errorf("a plug-in kind alone names Flux: %s", got)
	}
}

// fakeDiscovery fails every call with err.
type fakeDiscovery struct{ err error }

func (f fakeDiscovery) ServerResourcesForGroupVersion(string) (*metav1.APIResourceList, error) {
	return nil, f.err
}

// TestCheckCannotTell reports an API server that cannot answer as such,
// not as missing kinds, and Wait keeps waiting on it until ctx ends.
func TestCheckCannotTell(t *testing.T) {
	w := &Waiter{Discovery: fakeDiscovery{err: errors.New("connection refused")}, Kinds: fluxKinds, Interval: 10 * time.Millisecond, Log: testr.New(t)}
	err := w.Check()
	var missing *MissingError
	if err == nil || errors.As(err, &missing) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Check says %v, want the discovery error", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := w.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait: %v, want the context's deadline", err)
	}
}
