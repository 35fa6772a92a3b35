// Package controller holds the watcher's reconciler: one generic
// controller-runtime reconciler, instantiated per source kind, that turns
// objects and their intervals into fetch jobs on the bus. It does no
// fetching itself; outcomes come back through package results.
package controller

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	eventv1 "github.com/fluxcd/pkg/apis/event/v1beta1"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	"github.com/fluxcd/pkg/runtime/jitter"
	"github.com/fluxcd/pkg/runtime/predicates"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/tracing"
	"github.com/headwater-gitops/headwater/services/watcher/internal/fairshare"
	"github.com/headwater-gitops/headwater/services/watcher/internal/patch"
	"github.com/headwater-gitops/headwater/services/watcher/internal/seal"
	"github.com/headwater-gitops/headwater/services/watcher/internal/sourcekind"
	"github.com/headwater-gitops/headwater/services/watcher/internal/status"
)

// Publisher publishes jobs on the bus (a *bus.Publisher).
type Publisher interface {
	Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error
}

// Admission admits fetch jobs to the bus (a *fairshare.Queue): Publish
// publishes a job or holds it for later; Forget drops the jobs of a
// deleted object.
type Admission interface {
	Publisher
	Forget(kind, namespace, name string)
}

// Reconciler reconciles the objects of one source kind.
type Reconciler struct {
	// Client reads (from the informer cache) and writes the objects; for
	// a plug-in kind, a sourcekind.PluginClient.
	Client client.Client
	// Live reads objects from the API server, after a conflicting write.
	Live client.Reader
	// Kind is the source kind reconciled.
	Kind sourcekind.Kind
	// Jobs publishes fetch and delete jobs.
	Jobs Publisher
	// Admission, when set, publishes the fetch jobs that take the whole
	// path (not the quiet ones, whose outcome is not reported) in turn
	// with other namespaces' (package fairshare); nil publishes them
	// through Jobs at once.
	Admission Admission
	// NewQueue, when set, makes the controller's work queue (the fair
	// one of fairshare.Options.NewWorkQueue); nil keeps
	// controller-runtime's.
	NewQueue fairshare.NewQueueFunc
	// Seal seals every job published, so that only outcomes of jobs this
	// watcher (or another replica) issued are applied.
	Seal *seal.Key
	// Recorder records Kubernetes Events; it takes Flux's trace type
	// (eventv1.EventTypeTrace) as a notify.Recorder does.
	Recorder recorder.EventRecorder
	// RequeueDependency is how often a source waiting for another one (an
	// include without an artifact) looks again.
	RequeueDependency time.Duration
	// Now returns the current time; time.Now when nil.
	Now func() time.Time
	// Triggers, when set, are the reconciles webhooks ask for (see
	// Triggers); their jobs are fresh.
	Triggers *Triggers
	// Retries, when set, brings the reconcile of a source whose fetch
	// failed for a reason that passes forward from its next interval (see
	// Retries); the results consumer schedules them.
	Retries *Retries
	// Metrics, when set, records reconcile durations.
	Metrics *Metrics
	// Steady, when set, makes the jobs of steady sources quiet (see
	// Steady); nil makes none quiet.
	Steady *Steady
	// Fetchers, for a plug-in kind, tells whether its fetcher has joined
	// the bus; nil assumes it has.
	Fetchers *Fetchers
	// AlignRemotes schedules the sources that share a remote at the same
	// moments (untilSlot), so that one listing answers them all; false
	// applies Flux's interval jitter instead.
	AlignRemotes bool
}

// SetupWithManager registers the reconciler. It reacts to spec changes
// (generation) and reconcile requests (the requestedAt annotation) only, so
// the watcher's own status writes never trigger a reconcile.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, concurrency int) error {
	var watched client.Object = r.Kind.New()
	if reg := r.Kind.Plugin; reg != nil {
		// A plug-in kind has no Go type: the cache holds its objects
		// unstructured, and the client (sourcekind.PluginClient) converts.
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(reg.GVK)
		watched = u
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named(strings.ToLower(r.Kind.Name)).
		For(watched, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicates.ReconcileRequestedPredicate{}))).
		WithOptions(crcontroller.Options{MaxConcurrentReconciles: concurrency, NewQueue: r.NewQueue})
	if err := r.Kind.Setup(ctx, mgr, b); err != nil {
		return err
	}
	if r.Triggers != nil {
		b = b.WatchesRawSource(r.Triggers.Source())
	}
	if r.Retries != nil {
		b = b.WatchesRawSource(r.Retries.Source())
	}
	return b.Complete(r)
}

// Reconcile runs, in order: deletion (finalize), the finalizer, suspend,
// then publishes a fetch job and requeues after the jittered interval.
// Conditions: Reconciling when a new generation starts, with Ready Unknown
// unless the source is Ready with its stored artifact, which it stays (as
// Flux's ProgressiveStatus);
// FetchFailed and Ready=False (BusUnavailable) with Reconciling
// (ProgressingWithRetry) when the bus does not take the job (unpublished);
// everything else is written when the job's outcome arrives.
//
// Each reconcile is a span ("reconcile"), the root of the trace its job
// carries through the services to the status write.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	ctx, span := tracing.StartJob(ctx, tracer, "reconcile",
		events.Job{Object: events.ObjectRef{Kind: r.Kind.Name, Namespace: req.Namespace, Name: req.Name}})
	defer func() { tracing.End(span, err) }()
	start, gone := time.Now(), false
	defer func() { r.Metrics.observe(r.Kind.Name, req.NamespacedName, start, gone) }()
	obj := r.Kind.New()
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		gone = apierrors.IsNotFound(err)
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	logger := log.FromContext(ctx)

	if !obj.GetDeletionTimestamp().IsZero() {
		err := r.finalize(ctx, obj)
		gone = err == nil
		return ctrl.Result{}, err
	}
	if r.Kind.Static(obj) {
		return ctrl.Result{}, r.makeStatic(ctx, obj)
	}
	if !controllerutil.ContainsFinalizer(obj, sourcev1.SourceFinalizer) {
		if err := patchFinalizers(ctx, r.Client, obj, controllerutil.AddFinalizer); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}
	if r.Kind.Suspended(obj) {
		logger.Info("reconciliation is suspended for this object")
		return ctrl.Result{}, nil
	}

	if r.Kind.Plugin != nil {
		served, err := r.Fetchers.Serves(ctx, r.Kind.Name)
		if err != nil {
			logger.Error(err, "cannot tell whether the kind's fetcher is deployed; publishing the job")
		}
		if !served {
			return r.waiting(ctx, obj, r.noFetcher())
		}
	}

	fetch := &events.FetchRequested{Previous: obj.GetArtifact()}
	force, err := r.Kind.Request(ctx, r.Client, obj, fetch)
	if f := failure.As(err); f != nil {
		return r.waiting(ctx, obj, f)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	fetch.Force = force
	fetch.Fresh = r.Triggers.Fresh(req.NamespacedName)
	// Read before the progress mark below: a steady object's status is
	// what its last outcome left.
	fetch.Quiet = !force && !fetch.Fresh && r.Steady.Quiet(r.Kind, obj, r.now())
	retry := r.Retries.Attempt(req.NamespacedName)
	fetch.Job = r.job(obj, fetch, retry)
	job := fetch.Job

	// Mark a new generation of an object that has been reconciled before
	// as in progress, before the job exists, so its outcome, however fast,
	// always lands after this write. A brand-new object is left as it is:
	// kstatus already reads its observedGeneration of -1 as in progress,
	// and its outcome is usually a second away (one write saved per new
	// object). A source that was waiting for another one stops waiting.
	err = status.Patch(ctx, r.Client, r.Live, r.Kind, obj, func(o sourcekind.Object) bool {
		st := r.Kind.Status(o)
		if o.GetGeneration() != *st.ObservedGeneration && len(o.GetConditions()) > 0 {
			status.MarkProgressing(o, st)
		}
		conditions.Delete(o, sourcev1.IncludeUnavailableCondition)
		r.Kind.Progress(o, fetch)
		return true
	})
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("mark progressing: %w", err)
	}

	if err := r.fetchJobs(fetch).Publish(ctx, events.FetchSubject(r.Kind.Name), events.TypeFetchRequested, job, fetch); err != nil {
		// The bus does not take the job: the source says so, and the
		// reconcile is retried with controller-runtime's backoff.
		return r.unpublished(ctx, obj, err)
	}
	if fetch.Fresh {
		r.Triggers.Published(req.NamespacedName)
	}
	r.Retries.Published(req.NamespacedName, retry)
	logger.V(1).Info("fetch job published", "job", job.ID, "force", fetch.Force, "fresh", fetch.Fresh, "quiet", fetch.Quiet, "retry", retry)
	return ctrl.Result{RequeueAfter: r.requeueAfter(obj)}, nil
}

// fetchJobs is the publisher of fetch: Admission but for a quiet job,
// which reports no outcome that would free its slot (a steady source's
// check, one listing), and which a fetcher answers from its cache.
func (r *Reconciler) fetchJobs(fetch *events.FetchRequested) Publisher {
	if r.Admission == nil || fetch.Quiet {
		return r.Jobs
	}
	return r.Admission
}

// requeueAfter is when obj is due again: at the next slot of its remote
// (untilSlot) when AlignRemotes is set and the kind names remotes, after
// its jittered interval otherwise.
func (r *Reconciler) requeueAfter(obj sourcekind.Object) time.Duration {
	interval := obj.GetRequeueAfter()
	if r.AlignRemotes {
		if remote := r.Kind.Remote(obj); remote != "" {
			return untilSlot(r.now(), interval, remote)
		}
	}
	return jitter.JitteredIntervalDuration(interval)
}

// waiting records that no job can be made yet, as a failed job's outcome
// is recorded (status.MarkFailure): the failure's condition, Ready=False
// with its reason and message, an Event when that is news (a Warning, or
// Flux's trace for the waits Flux traces: fluxTraces), and a
// look again after its RetryAfter (RequeueDependency when unset), or only on
// a spec change when it stalls.
func (r *Reconciler) waiting(ctx context.Context, obj sourcekind.Object, f *failure.Error) (ctrl.Result, error) {
	var old *metav1.Condition
	err := status.Patch(ctx, r.Client, r.Live, r.Kind, obj, func(o sourcekind.Object) bool {
		old = conditions.Get(o, meta.ReadyCondition)
		status.MarkFailure(r.Kind, o, f)
		if f.Stalled() {
			conditions.Delete(o, meta.ReconcilingCondition)
			*r.Kind.Status(o).ObservedGeneration = o.GetGeneration()
		}
		if token, ok := meta.ReconcileAnnotationValue(o.GetAnnotations()); ok {
			*r.Kind.Status(o).LastHandledReconcileAt = token
		}
		return true
	})
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("record waiting: %w", err)
	}
	msg := f.Error()
	if r.Recorder != nil && (old == nil || old.Reason != f.Reason || old.Message != msg) {
		eventType := corev1.EventTypeWarning
		if fluxTraces[f.Reason] && !f.Stalled() {
			eventType = eventv1.EventTypeTrace
		}
		r.Recorder.Eventf(obj, nil, eventType, f.Reason, "Reconcile", "%s", msg)
	}
	log.FromContext(ctx).Info("waiting", "reason", f.Reason, "message", msg, "handling", f.Handling.String())
	if f.Stalled() {
		return ctrl.Result{}, nil
	}
	if f.RetryAfter > 0 {
		return ctrl.Result{RequeueAfter: f.RetryAfter}, nil
	}
	return ctrl.Result{RequeueAfter: r.RequeueDependency}, nil
}

// noFetcher is the failure of a plug-in kind's object whose fetcher has
// not joined the bus: FetchFailed, looked at again after RequeueDependency.
func (r *Reconciler) noFetcher() *failure.Error {
	f := failure.New(failure.Waiting, sourcev1.FetchFailedCondition, NoFetcherReason,
		"no fetcher serves kind '%s': deploy its fetcher (bus identity %s, consumer %s on %s)",
		r.Kind.Name, events.PluginIdentity(r.Kind.Name), events.PluginConsumer(r.Kind.Name), events.FetchStream)
	f.RetryAfter = r.RequeueDependency
	return f
}

// fluxTraces are the reasons of the waits Flux records as traces (a Normal
// Event, not posted to the notification-controller): a GitRepository's
// include not found or without an artifact (Flux's serror.Waiting), a
// HelmChart's source without an artifact. Every other failure is a
// Warning, posted.
var fluxTraces = map[string]bool{"NotFound": true, "NoArtifact": true, sourcekind.NoSourceArtifactReason: true}

// makeStatic turns an object of a kind Flux leaves alone (a HelmRepository
// of type oci) into what Flux makes of it: its artifacts deleted, no
// finalizer, an empty status. A suspended object is left as it is.
func (r *Reconciler) makeStatic(ctx context.Context, obj sourcekind.Object) error {
	if r.Kind.Suspended(obj) {
		return nil
	}
	if controllerutil.ContainsFinalizer(obj, sourcev1.SourceFinalizer) {
		// finalize deletes the artifacts and removes the finalizer.
		if err := r.finalize(ctx, obj); err != nil {
			return err
		}
	}
	if obj.GetArtifact() == nil && len(obj.GetConditions()) == 0 && *r.Kind.Status(obj).ObservedGeneration == 0 {
		return nil
	}
	if err := (patch.Writer{Client: r.Client}).ResetStatus(ctx, obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	log.FromContext(ctx).Info("static object: artifacts deleted, status reset")
	return nil
}

// finalize asks the packagers to remove the object's artifacts, then removes
// the finalizer. The deletion job is durable on the bus once Publish returns,
// so the object need not wait for it.
func (r *Reconciler) finalize(ctx context.Context, obj sourcekind.Object) error {
	if !controllerutil.ContainsFinalizer(obj, sourcev1.SourceFinalizer) {
		return nil
	}
	job := events.Job{
		ID:          events.DeletionJobID(string(obj.GetUID())),
		Object:      ref(r.Kind.Name, obj),
		RequestedAt: r.now(),
	}
	r.Seal.Seal(&job)
	if err := r.Jobs.Publish(ctx, events.PackageSubject(r.Kind.Name), events.TypeDeleteRequested, job,
		&events.DeleteRequested{Job: job}); err != nil {
		return err
	}
	if err := patchFinalizers(ctx, r.Client, obj, controllerutil.RemoveFinalizer); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("remove finalizer: %w", err))
	}
	r.Steady.Forget(obj.GetUID())
	if r.Admission != nil {
		r.Admission.Forget(r.Kind.Name, obj.GetNamespace(), obj.GetName())
	}
	log.FromContext(ctx).Info("artifacts scheduled for deletion; finalizer removed")
	return nil
}

// patchFinalizers adds or removes the source finalizer (change is
// controllerutil.AddFinalizer or RemoveFinalizer) through the watcher's
// writer, guarded by the object's resourceVersion (as patch.Writer's
// AddFinalizer): the patch replaces the whole finalizers list, so without
// the guard a finalizer another controller added since obj was read would
// be lost. A stale read conflicts, and the reconcile is retried on a fresh
// one.
func patchFinalizers(ctx context.Context, c client.Client, obj sourcekind.Object, change func(client.Object, string) bool) error {
	return patch.Writer{Client: c}.Object(ctx, obj, patch.Options{OnConflict: patch.ReturnConflict}, func() bool {
		return change(obj, sourcev1.SourceFinalizer)
	})
}

// job makes the fetch job for this reconcile. Its ID names the object,
// generation, reconcile request and second, and a hash of what the job is
// built from (the stored artifact, the included artifacts, the rebuild
// flag) and of the retry that asked for it (retry, see Retries.Attempt; 0
// for none): a reconcile repeated within a second with the same inputs is
// stored once, while one whose inputs changed (an included source's new
// artifact, say) or that retries a failed job (which may have been made
// in the same second: a host's hold can end a few milliseconds after the
// job met it) is a job of its own. The job is sealed.
func (r *Reconciler) job(obj sourcekind.Object, fetch *events.FetchRequested, retry uint64) events.Job {
	now := r.now()
	token, _ := meta.ReconcileAnnotationValue(obj.GetAnnotations())
	h := sha256.New()
	fmt.Fprintf(h, "force=%t\n", fetch.Force)
	if fetch.Fresh {
		// A webhook's job is one of its own, even within the second of
		// an interval's.
		h.Write([]byte("fresh\n"))
	}
	if fetch.Quiet {
		// A quiet job announces nothing: a job that would is not its
		// duplicate.
		h.Write([]byte("quiet\n"))
	}
	if retry > 0 {
		fmt.Fprintf(h, "retry=%d\n", retry)
	}
	if fetch.Previous != nil {
		fmt.Fprintf(h, "previous=%s\n", fetch.Previous.Digest)
	}
	for _, inc := range fetch.Includes {
		fmt.Fprintf(h, "include=%s:%s\n", inc.Name, inc.Artifact.Digest)
	}
	if cs := fetch.ChartSource; cs != nil {
		fmt.Fprintf(h, "source=%s/%s:%s\n", cs.Kind, cs.Name, cs.Artifact.Digest)
	}
	job := events.Job{
		ID:             fmt.Sprintf("%s/%d/%s/%d/%x", obj.GetUID(), obj.GetGeneration(), token, now.Unix(), h.Sum(nil)[:6]),
		Object:         ref(r.Kind.Name, obj),
		ReconcileToken: token,
		RequestedAt:    now,
	}
	r.Seal.Seal(&job)
	return job
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func ref(kind string, obj sourcekind.Object) events.ObjectRef {
	return events.ObjectRef{
		Kind:       kind,
		Namespace:  obj.GetNamespace(),
		Name:       obj.GetName(),
		UID:        string(obj.GetUID()),
		Generation: obj.GetGeneration(),
		Labels:     obj.GetLabels(),
	}
}
