package patch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// testOwner is the field manager of the writes the tests make themselves.
const testOwner = "patch-test"

// TestFieldOwnerOnEveryWrite makes each kind of write the Writer offers
// and checks that the API server recorded it under FieldOwner, on the
// status subresource for status writes and on the object for the others.
func TestFieldOwnerOnEveryWrite(t *testing.T) {
	c := controlPlane(t)
	ctx := context.Background()
	// Every write is also recorded as it is sent, for the reset, whose
	// empty status leaves no managedFields entry to look at.
	var managers []string
	record := func(opts []client.PatchOption) {
		po := &client.PatchOptions{}
		po.ApplyOptions(opts)
		managers = append(managers, po.FieldManager)
	}
	recorded := interceptor.NewClient(c, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			co := &client.CreateOptions{}
			co.ApplyOptions(opts)
			managers = append(managers, co.FieldManager)
			return c.Create(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			record(opts)
			return c.Patch(ctx, obj, p, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			po := &client.SubResourcePatchOptions{}
			po.ApplyOptions(opts)
			managers = append(managers, po.FieldManager)
			return c.SubResource(sub).Patch(ctx, obj, p, opts...)
		},
	})
	w := Writer{Client: recorded, Live: c}
	repo := newRepo("owned")
	for _, step := range []struct {
		name        string
		write       func() error
		subresource string
	}{
		{"create", func() error { return w.Create(ctx, repo) }, ""},
		{"add finalizer", func() error { return w.AddFinalizer(ctx, repo, sourcev1.SourceFinalizer) }, ""},
		{"status", func() error {
			return w.Status(ctx, repo, Options{OnConflict: Retry}, func() bool {
				conditions.MarkTrue(repo, meta.ReadyCondition, meta.SucceededReason, "stored")
				return true
			})
		}, "status"},
		{"object", func() error {
			return w.Object(ctx, repo, Options{}, func() bool {
				repo.Labels = map[string]string{"team": "a"}
				return true
			})
		}, ""},
	} {
		t.Run(step.name, func(t *testing.T) {
			if err := step.write(); err != nil {
				t.Fatal(err)
			}
			got := get(t, c, repo)
			if !managedBy(got, FieldOwner, step.subresource) {
				t.Errorf("managedFields = %+v, want an entry of %q on subresource %q", got.ManagedFields, FieldOwner, step.subresource)
			}
		})
	}

	t.Run("reset status", func(t *testing.T) {
		// Another manager writes status; the reset is the watcher's.
		other := get(t, c, repo)
		base := other.DeepCopy()
		conditions.MarkFalse(other, meta.ReadyCondition, "Other", "theirs")
		if err := c.Status().Patch(ctx, other, client.MergeFrom(base), client.FieldOwner(testOwner)); err != nil {
			t.Fatal(err)
		}
		if err := w.ResetStatus(ctx, repo); err != nil {
			t.Fatal(err)
		}
		if got := get(t, c, repo); len(got.Status.Conditions) != 0 {
			t.Errorf("conditions after reset = %v, want none", got.Status.Conditions)
		}
	})
	t.Run("remove finalizer", func(t *testing.T) {
		if err := w.RemoveFinalizer(ctx, repo, sourcev1.SourceFinalizer); err != nil {
			t.Fatal(err)
		}
		if got := get(t, c, repo); len(got.Finalizers) != 0 {
			t.Errorf("finalizers = %q, want none", got.Finalizers)
		}
	})
	// create, add finalizer, status, object, reset, remove finalizer.
	if len(managers) != 6 {
		t.Errorf("%d writes sent, want 6", len(managers))
	}
	for i, m := range managers {
		if m != FieldOwner {
			t.Errorf("write %d sent with field manager %q, want %q", i, m, FieldOwner)
		}
	}
}

// TestConflict writes status from a stale copy after another manager
// changed it, once for each OnConflict: Retry reads the object again and
// keeps both changes, ReturnConflict returns the conflict and writes
// nothing, Overwrite writes without looking.
func TestConflict(t *testing.T) {
	c := controlPlane(t)
	ctx := context.Background()
	w := Writer{Client: c, Live: c}
	for _, tc := range []struct {
		name         string
		onConflict   OnConflict
		wantConflict bool
		wantChanges  int
		wantTheirs   bool
	}{
		{"retry", Retry, false, 2, true},
		{"return", ReturnConflict, true, 1, true},
		{"overwrite", Overwrite, false, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := newRepo(tc.name)
			if err := c.Create(ctx, repo, client.FieldOwner(testOwner)); err != nil {
				t.Fatal(err)
			}
			stale := get(t, c, repo)
			theirs := stale.DeepCopy()
			conditions.MarkTrue(theirs, "Theirs", "Other", "another manager's")
			if err := c.Status().Update(ctx, theirs, client.FieldOwner(testOwner)); err != nil {
				t.Fatal(err)
			}

			changes := 0
			err := w.Status(ctx, stale, Options{OnConflict: tc.onConflict}, func() bool {
				changes++
				conditions.MarkTrue(stale, meta.ReadyCondition, meta.SucceededReason, "ours")
				return true
			})
			if apierrors.IsConflict(err) != tc.wantConflict {
				t.Fatalf("write from a stale copy: %v, want a conflict: %t", err, tc.wantConflict)
			}
			if !tc.wantConflict && err != nil {
				t.Fatal(err)
			}
			if changes != tc.wantChanges {
				t.Errorf("change ran %d times, want %d", changes, tc.wantChanges)
			}
			got := get(t, c, repo)
			if ours := conditions.IsTrue(got, meta.ReadyCondition); ours == tc.wantConflict {
				t.Errorf("our condition written: %t, want %t", ours, !tc.wantConflict)
			}
			if kept := conditions.Has(got, "Theirs"); kept != tc.wantTheirs {
				t.Errorf("their condition kept: %t, want %t", kept, tc.wantTheirs)
			}
		})
	}
}

// TestRetryBounded makes every attempt conflict (Live returns the stale
// copy again): the write gives up after MaxConflicts re-reads with the
// conflict.
func TestRetryBounded(t *testing.T) {
	c := controlPlane(t)
	ctx := context.Background()
	repo := newRepo("bounded")
	if err := c.Create(ctx, repo, client.FieldOwner(testOwner)); err != nil {
		t.Fatal(err)
	}
	stale := get(t, c, repo)
	touched := stale.DeepCopy()
	touched.Labels = map[string]string{"touched": "yes"}
	if err := c.Update(ctx, touched, client.FieldOwner(testOwner)); err != nil {
		t.Fatal(err)
	}
	w := Writer{Client: c, Live: staleReader{stale.DeepCopy()}}
	changes := 0
	err := w.Status(ctx, stale, Options{OnConflict: Retry}, func() bool {
		changes++
		conditions.MarkTrue(stale, meta.ReadyCondition, meta.SucceededReason, "ours")
		return true
	})
	if !apierrors.IsConflict(err) {
		t.Fatalf("write that always conflicts: %v, want a conflict", err)
	}
	if changes != MaxConflicts+1 {
		t.Errorf("change ran %d times, want %d", changes, MaxConflicts+1)
	}
}

// TestObservedGeneration checks that ObservedGeneration records the
// object's generation with the write, and that a write without it leaves
// the field alone.
func TestObservedGeneration(t *testing.T) {
	c := controlPlane(t)
	ctx := context.Background()
	w := Writer{Client: c, Live: c}
	repo := newRepo("observed")
	if err := c.Create(ctx, repo, client.FieldOwner(testOwner)); err != nil {
		t.Fatal(err)
	}
	initial := get(t, c, repo).Status.ObservedGeneration // the CRD's default
	mark := func(reason string) func() bool {
		return func() bool {
			conditions.MarkFalse(repo, meta.ReadyCondition, reason, "waiting")
			return true
		}
	}
	if err := w.Status(ctx, repo, Options{}, mark("First")); err != nil {
		t.Fatal(err)
	}
	if got := get(t, c, repo); got.Status.ObservedGeneration != initial {
		t.Errorf("observedGeneration without the option = %d, want it left at %d", got.Status.ObservedGeneration, initial)
	}
	if err := w.Status(ctx, repo, Options{OnConflict: Retry, ObservedGeneration: true}, mark("Second")); err != nil {
		t.Fatal(err)
	}
	got := get(t, c, repo)
	if got.Generation == 0 || got.Status.ObservedGeneration != got.Generation {
		t.Errorf("observedGeneration = %d, want the generation %d", got.Status.ObservedGeneration, got.Generation)
	}
}

// TestNoChangeNoWrite checks that a change that reports none, or changes
// nothing, writes nothing: the resourceVersion stays.
func TestNoChangeNoWrite(t *testing.T) {
	c := controlPlane(t)
	ctx := context.Background()
	w := Writer{Client: c, Live: c}
	repo := newRepo("unchanged")
	if err := c.Create(ctx, repo, client.FieldOwner(testOwner)); err != nil {
		t.Fatal(err)
	}
	rv := repo.ResourceVersion
	for name, change := range map[string]func() bool{
		"reported none": func() bool { conditions.MarkTrue(repo, "Unsent", "Unsent", "not reported"); return false },
		"made none":     func() bool { return true },
	} {
		if err := w.Status(ctx, repo, Options{}, change); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := get(t, c, repo); got.ResourceVersion != rv {
			t.Errorf("%s: resourceVersion %s, want %s (no write)", name, got.ResourceVersion, rv)
		}
	}
}

func newRepo(name string) *sourcev1.GitRepository {
	return &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: sourcev1.GitRepositorySpec{URL: "https://example.com/podinfo.git"}}
}

func get(t *testing.T, c client.Client, obj client.Object) *sourcev1.GitRepository {
	t.Helper()
	got := &sourcev1.GitRepository{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// managedBy tells whether obj's managedFields hold an entry of manager on
// subresource ("" for the object itself).
func managedBy(obj client.Object, manager, subresource string) bool {
	for _, e := range obj.GetManagedFields() {
		if e.Manager == manager && e.Subresource == subresource {
			return true
		}
	}
	return false
}

// staleReader answers every read with the same stale copy.
type staleReader struct{ obj *sourcev1.GitRepository }

func (r staleReader) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	r.obj.DeepCopyInto(obj.(*sourcev1.GitRepository))
	return nil
}

func (r staleReader) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// env is the control plane the tests share, started by the first that
// asks (controlPlane) and stopped by TestMain.
var env struct {
	once    sync.Once
	testEnv *envtest.Environment
	client  client.WithWatch
	err     error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if env.testEnv != nil {
		_ = env.testEnv.Stop()
	}
	os.Exit(code)
}

// controlPlane returns a client of a kube-apiserver with Headwater's CRDs,
// started for the package's tests on first use.
func controlPlane(t *testing.T) client.WithWatch {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, which builds kube-apiserver and etcd")
	}
	env.once.Do(func() {
		env.testEnv = &envtest.Environment{
			CRDDirectoryPaths:     []string{filepath.Join("..", "..", "..", "..", "deploy", "crds")},
			ErrorIfCRDPathMissing: true,
		}
		cfg, err := env.testEnv.Start()
		if err != nil {
			env.err = fmt.Errorf("start control plane: %w", err)
			return
		}
		scheme := runtime.NewScheme()
		if err := sourcev1.AddToScheme(scheme); err != nil {
			env.err = err
			return
		}
		env.client, env.err = client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	})
	if env.err != nil {
		t.Fatal(env.err)
	}
	return env.client
}
