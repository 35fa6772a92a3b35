// Package generator reconciles Flux's ArtifactGenerators
// (source.extensions.fluxcd.io/v1beta1, as source-watcher): it checks a
// generator's spec, resolves its sources to the artifacts they have now,
// and publishes a sealed GenerateRequested job for the packagers, which
// compose the outputs from shared storage. When the job's outcome comes
// back through the artifact-server (HandleOutcome, called by the results
// consumer), it publishes each output as an ExternalArtifact (package
// externalartifact), deletes the ExternalArtifacts of outputs the spec no
// longer has, and writes the generator's status: inventory,
// observedSourcesDigest, Ready.
//
// A generator is reconciled when its spec changes, when a reconcile is
// requested, when one of its sources' artifact changes, when one of its
// ExternalArtifacts is deleted, and every hour. A reconcile that finds its
// sources as the last applied outcome saw them, and every output
// published, makes no job.
package generator

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/jitter"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/services/watcher/internal/externalartifact"
	"github.com/headwater-gitops/headwater/services/watcher/internal/fairshare"
	"github.com/headwater-gitops/headwater/services/watcher/internal/patch"
	"github.com/headwater-gitops/headwater/services/watcher/internal/seal"
)

// The watcher's permissions on ArtifactGenerators, generated into
// deploy/base/rbac/watcher by `make manifests`.

// +kubebuilder:rbac:groups=source.extensions.fluxcd.io,resources=artifactgenerators,verbs=get;list;watch;patch;update
// +kubebuilder:rbac:groups=source.extensions.fluxcd.io,resources=artifactgenerators/status;artifactgenerators/finalizers,verbs=get;patch;update

// Publisher publishes jobs on the bus (a *bus.Publisher).
type Publisher interface {
	Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error
}

// Interval is how often a generator is reconciled without a trigger (as
// source-watcher's GetRequeueAfter), jittered: a lost job is made again.
const Interval = time.Hour

// staleRead is how soon a reconcile that read a generator older than the
// API server's looks again.
const staleRead = time.Second

// Reconciler reconciles ArtifactGenerators and applies their jobs'
// outcomes.
type Reconciler struct {
	// NewQueue, when set, makes the controller's work queue (the fair
	// one of fairshare.Options.NewWorkQueue); nil keeps
	// controller-runtime's.
	NewQueue fairshare.NewQueueFunc
	// Client reads from the informer cache and writes objects.
	Client client.Client
	// Live reads objects from the API server, after a conflicting write.
	Live client.Reader
	// Owns, when set, reports whether an ArtifactGenerator belongs to
	// this watcher's shard (shard.Shard.Owns); the outcomes of the others
	// are left to their shard. Nil owns every one.
	Owns func(client.Object) bool
	// Jobs publishes the jobs.
	Jobs Publisher
	// Seal seals every job, and checks the jobs of outcomes.
	Seal *seal.Key
	// Writer writes the outputs' ExternalArtifacts.
	Writer *externalartifact.Writer
	// Recorder records Kubernetes Events on the generators.
	Recorder recorder.EventRecorder
	// Metrics, when set, counts jobs and outcomes.
	Metrics *Metrics
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// NoCrossNamespaceRefs refuses sources in another namespace than the
	// generator's (Flux's --no-cross-namespace-refs): Ready False,
	// AccessDenied, stalled, and no job, as source-watcher.
	NoCrossNamespaceRefs bool
}

// Reconcile runs, in order: deletion (the stored outputs are removed, the
// ExternalArtifacts go with their owner), the finalizer, the
// reconciliation-disabled annotation, the spec's checks (ValidationFailed,
// stalled), the dependency cycle check (ValidationFailed, stalled), the
// sources' artifacts (SourceFetchFailed), then the job, unless the last
// applied outcome is for the sources as they are and every output is
// published. Conditions: Ready False on a problem (with an Event when it is
// new); Reconciling True and Ready Unknown when a job is published.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logr.FromContextOrDiscard(ctx)
	gen := &swv1beta1.ArtifactGenerator{}
	if err := r.Client.Get(ctx, req.NamespacedName, gen); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !gen.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, gen)
	}
	if !controllerutil.ContainsFinalizer(gen, swv1beta1.Finalizer) {
		if err := r.writer().AddFinalizer(ctx, gen, swv1beta1.Finalizer); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}
	if gen.IsDisabled() {
		log.V(1).Info("reconciliation disabled")
		return ctrl.Result{}, nil
	}

	srcs, err := r.resolve(ctx, gen)
	var p *problem
	if errors.As(err, &p) {
		r.Metrics.count("problem")
		return r.fail(ctx, gen, p)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	previous, complete := r.published(ctx, gen)
	token, _ := meta.ReconcileAnnotationValue(gen.GetAnnotations())
	ready := apimeta.FindStatusCondition(gen.Status.Conditions, meta.ReadyCondition)
	if gen.Status.ObservedSourcesDigest == srcs.digest && complete && token == gen.Status.LastHandledReconcileAt &&
		ready != nil && ready.Status == metav1.ConditionTrue && ready.ObservedGeneration == gen.Generation {
		log.V(1).Info("artifacts up to date", "digest", srcs.digest)
		return ctrl.Result{RequeueAfter: jitter.JitteredIntervalDuration(Interval)}, nil
	}

	// The status says a build is out before the job is: its outcome,
	// which may come back at once, is then always written after it. The
	// write is guarded by the resourceVersion read: a conflict means the
	// generator changed since (an outcome applied), so the job may not be
	// needed, and the reconcile looks again on a fresher read instead.
	err = r.writer().Status(ctx, gen, patch.Options{OnConflict: patch.ReturnConflict}, func() bool {
		setCondition(gen, meta.ReconcilingCondition, metav1.ConditionTrue, meta.ProgressingReason, "building artifacts for sources "+srcs.digest)
		if c := apimeta.FindStatusCondition(gen.Status.Conditions, meta.ReadyCondition); c == nil || c.Status != metav1.ConditionFalse {
			setCondition(gen, meta.ReadyCondition, metav1.ConditionUnknown, meta.ProgressingReason, "building artifacts")
		}
		apimeta.RemoveStatusCondition(&gen.Status.Conditions, meta.StalledCondition)
		return true
	})
	if apierrors.IsConflict(err) {
		log.V(1).Info("generator changed since read: looking again")
		return ctrl.Result{RequeueAfter: staleRead}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	foreign, err := r.foreign(ctx, gen)
	if err != nil {
		return ctrl.Result{}, err
	}
	job := r.job(gen, srcs.digest, token, previous)
	req2 := &events.GenerateRequested{Job: job, Revision: srcs.digest, Sources: srcs.list,
		Artifacts: gen.Spec.OutputArtifacts, PathPattern: gen.Spec.PathPattern, Foreign: foreign, Previous: previous}
	if err := r.Jobs.Publish(ctx, events.PackageSubject(events.ArtifactGeneratorKind), events.TypeGenerateRequested, job, req2); err != nil {
		return ctrl.Result{}, fmt.Errorf("publish generate job: %w", err)
	}
	r.Metrics.count("published")
	log.Info("generate job published", "job", job.ID, "digest", srcs.digest, "outputs", len(gen.Spec.OutputArtifacts))
	return ctrl.Result{RequeueAfter: jitter.JitteredIntervalDuration(Interval)}, nil
}

// job makes the job of a reconcile: its ID names the generator, its
// generation, the digest of its sources, what is published now and the
// reconcile request, so a reconcile repeated with the same inputs is
// stored once. It is sealed.
func (r *Reconciler) job(gen *swv1beta1.ArtifactGenerator, digest, token string, previous []events.GeneratedOutput) events.Job {
	h := sha256.New()
	fmt.Fprintf(h, "sources=%s\n", digest)
	for _, p := range previous {
		fmt.Fprintf(h, "previous=%s:%s\n", p.Name, p.Artifact.Digest)
	}
	job := events.Job{
		ID:             fmt.Sprintf("%s/%d/%s/%x", gen.UID, gen.Generation, token, h.Sum(nil)[:8]),
		Object:         objectRef(gen),
		ReconcileToken: token,
		RequestedAt:    r.now(),
	}
	r.Seal.Seal(&job)
	return job
}

func objectRef(gen *swv1beta1.ArtifactGenerator) events.ObjectRef {
	return events.ObjectRef{Kind: events.ArtifactGeneratorKind, Namespace: gen.Namespace, Name: gen.Name,
		UID: string(gen.UID), Generation: gen.Generation, Labels: gen.Labels}
}

// event records a Kubernetes Event about gen.
func (r *Reconciler) event(gen *swv1beta1.ArtifactGenerator, eventType, reason, message string) {
	if r.Recorder == nil {
		return
	}
	r.Recorder.Eventf(gen, nil, eventType, reason, "Reconcile", "%s", message)
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}
