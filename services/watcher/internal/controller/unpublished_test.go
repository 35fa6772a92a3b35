package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/services/watcher/internal/seal"
	"github.com/headwater-gitops/headwater/services/watcher/internal/sourcekind"
	"github.com/headwater-gitops/headwater/services/watcher/internal/status"
)

// eventLog is a recorder.EventRecorder that keeps what it is given.
type eventLog struct {
	mu     sync.Mutex
	events []string // "type reason: note"
}

func (l *eventLog) Eventf(_ runtime.Object, _ runtime.Object, eventtype, reason, _ string, note string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, eventtype+" "+reason+": "+fmt.Sprintf(note, args...))
}

func (l *eventLog) AnnotatedEventf(obj runtime.Object, related runtime.Object, _ map[string]string, eventtype, reason, action, note string, args ...any) {
	l.Eventf(obj, related, eventtype, reason, action, note, args...)
}

func (l *eventLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

// TestBusUnavailable reconciles a Ready source while the bus refuses its
// fetch job (JetStream's answer without a quorum): the source keeps its
// artifact and says why it is not fresh (FetchFailed and Ready=False
// BusUnavailable, Reconciling ProgressingWithRetry), with one Warning
// Event and one status write however often the reconcile is retried; a
// new reconcile request is recorded as handled; once the bus takes the
// job, its outcome clears all of it.
func TestBusUnavailable(t *testing.T) {
	_, _, c := controlPlane(t)
	ctx := context.Background()
	kind := sourcekind.GitRepository()
	art := &meta.Artifact{Path: "gitrepository/default/podinfo/abc.tar.gz", URL: "http://artifacts/gitrepository/default/podinfo/abc.tar.gz",
		Revision: "main@sha1:abc", Digest: "sha256:" + strings.Repeat("a", 64), LastUpdateTime: metav1.Now()}

	obj := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default", Finalizers: []string{sourcev1.SourceFinalizer}},
		Spec: sourcev1.GitRepositorySpec{URL: "https://example.com/podinfo.git", Interval: metav1.Duration{Duration: time.Minute}}}
	if err := c.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	obj.Status.Artifact = art.DeepCopy()
	obj.Status.ObservedGeneration = obj.Generation
	conditions.MarkTrue(obj, sourcev1.ArtifactInStorageCondition, meta.SucceededReason, "stored artifact for revision '%s'", art.Revision)
	conditions.MarkTrue(obj, meta.ReadyCondition, meta.SucceededReason, "stored artifact for revision '%s'", art.Revision)
	if err := c.Status().Update(ctx, obj); err != nil {
		t.Fatal(err)
	}

	var busDown sync.Mutex
	down := true
	var published []events.Job
	jobs := publisherFunc(func(_ context.Context, _, _ string, job events.Job, _ any) error {
		busDown.Lock()
		defer busDown.Unlock()
		if down {
			return fmt.Errorf("publish %s to %s: %w", events.TypeFetchRequested, events.FetchSubject(kind.Name), nats.ErrNoResponders)
		}
		published = append(published, job)
		return nil
	})
	key, err := seal.NewKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	rec := &eventLog{}
	r := &Reconciler{Client: c, Live: c, Kind: kind, Jobs: jobs, Seal: key, Recorder: rec, RequeueDependency: time.Second}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "podinfo"}}
	get := func() *sourcev1.GitRepository {
		t.Helper()
		var o sourcev1.GitRepository
		if err := c.Get(ctx, req.NamespacedName, &o); err != nil {
			t.Fatal(err)
		}
		return &o
	}

	// The first refused publish: the source says so.
	if res, err := r.Reconcile(ctx, req); err != nil || res.RequeueAfter <= 0 {
		t.Fatalf("reconcile while the bus refuses: %+v, %v, want a retry after a while", res, err)
	}
	got := get()
	if got.Status.Artifact == nil || got.Status.Artifact.Digest != art.Digest || got.Status.Artifact.Revision != art.Revision {
		t.Errorf("artifact %+v, want the one stored before (%s)", got.Status.Artifact, art.Revision)
	}
	for _, want := range []struct {
		typ    string
		status metav1.ConditionStatus
		reason string
	}{
		{sourcev1.FetchFailedCondition, metav1.ConditionTrue, BusUnavailableReason},
		{meta.ReadyCondition, metav1.ConditionFalse, BusUnavailableReason},
		{meta.ReconcilingCondition, metav1.ConditionTrue, meta.ProgressingWithRetryReason},
		{sourcev1.ArtifactInStorageCondition, metav1.ConditionTrue, meta.SucceededReason},
	} {
		c := conditions.Get(got, want.typ)
		if c == nil || c.Status != want.status || c.Reason != want.reason {
			t.Errorf("%s = %+v, want %s %s", want.typ, c, want.status, want.reason)
		}
	}
	msg := conditions.GetMessage(got, meta.ReadyCondition)
	for _, part := range []string{"NATS JetStream", events.FetchStream, nats.ErrNoResponders.Error(), "revision '" + art.Revision + "'", "/jsz", "headwater_bus_ready"} {
		if !strings.Contains(msg, part) {
			t.Errorf("Ready message %q does not say %q", msg, part)
		}
	}
	written := got.ResourceVersion

	// Retries write nothing and record no Event.
	for range 3 {
		if res, err := r.Reconcile(ctx, req); err != nil || res.RequeueAfter <= 0 {
			t.Fatalf("a retry while the bus refuses: %+v, %v", res, err)
		}
	}
	if got := get(); got.ResourceVersion != written {
		t.Errorf("retries wrote the status again (resourceVersion %s, then %s)", written, got.ResourceVersion)
	}
	if ev := rec.list(); len(ev) != 1 || !strings.HasPrefix(ev[0], corev1.EventTypeWarning+" "+BusUnavailableReason+": ") {
		t.Errorf("events %q, want one Warning %s", ev, BusUnavailableReason)
	}

	// A reconcile request (flux reconcile) is answered: handled, failed.
	o := get()
	base := client.MergeFrom(o.DeepCopy())
	o.Annotations = map[string]string{meta.ReconcileRequestAnnotation: "now"}
	if err := c.Patch(ctx, o, base); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatalf("a requested reconcile while the bus refuses: %v", err)
	}
	if got := get(); got.Status.LastHandledReconcileAt != "now" || conditions.GetReason(got, meta.ReadyCondition) != BusUnavailableReason {
		t.Errorf("after a reconcile request: lastHandledReconcileAt %q, Ready %s", got.Status.LastHandledReconcileAt, conditions.GetReason(got, meta.ReadyCondition))
	}
	if ev := rec.list(); len(ev) != 1 {
		t.Errorf("events %q, want still one", ev)
	}

	// The bus takes the job again; its outcome clears the failure.
	busDown.Lock()
	down = false
	busDown.Unlock()
	res, err := r.Reconcile(ctx, req)
	if err != nil || res.RequeueAfter <= 0 {
		t.Fatalf("reconcile with the bus back: %+v, %v", res, err)
	}
	if len(published) != 1 {
		t.Fatalf("%d jobs published, want 1", len(published))
	}
	job := published[0]
	newArt := art.DeepCopy()
	newArt.Revision, newArt.Digest, newArt.LastUpdateTime = "main@sha1:def", "sha256:"+strings.Repeat("b", 64), metav1.Now()
	live := get()
	var evs []status.Event
	err = status.Patch(ctx, c, c, kind, live, func(o sourcekind.Object) bool {
		evs = status.Apply(kind, o, events.TypeArtifactStored, &events.Outcome{Job: job, Revision: newArt.Revision, Artifact: newArt})
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	got = get()
	if c := conditions.Get(got, meta.ReadyCondition); c == nil || c.Status != metav1.ConditionTrue || got.Status.Artifact.Revision != newArt.Revision {
		t.Errorf("after the outcome: Ready %+v, artifact %+v", c, got.Status.Artifact)
	}
	for _, typ := range []string{sourcev1.FetchFailedCondition, meta.ReconcilingCondition} {
		if c := conditions.Get(got, typ); c != nil {
			t.Errorf("after the outcome: %s = %+v, want none", typ, c)
		}
	}
	if len(evs) != 1 || evs[0].Type != corev1.EventTypeNormal {
		t.Errorf("outcome events %+v, want one Normal (the new artifact)", evs)
	}
}
