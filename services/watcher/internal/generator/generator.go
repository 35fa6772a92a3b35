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
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/jitter"
	"github.com/fluxcd/pkg/runtime/predicates"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/headwater-gitops/headwater/pkg/compose"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/watcher/internal/externalartifact"
	"github.com/headwater-gitops/headwater/services/watcher/internal/seal"
	"github.com/headwater-gitops/headwater/services/watcher/internal/source"
)

// The watcher's permissions on ArtifactGenerators, generated into
// deploy/base/rbac/watcher by `make manifests`.

// +kubebuilder:rbac:groups=source.extensions.fluxcd.io,resources=artifactgenerators,verbs=get;list;watch;patch;update
// +kubebuilder:rbac:groups=source.extensions.fluxcd.io,resources=artifactgenerators/status;artifactgenerators/finalizers,verbs=get;patch;update

// Publisher publishes jobs on the bus (a *bus.Publisher).
type Publisher interface {
	Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error
}

// Conditions and reasons of an ArtifactGenerator, as source-watcher's.
// Ready is True once every output is published for the sources as they
// are; False with ValidationFailed (a spec that cannot be built: a path
// escaping its tree, two outputs of one name, a dependency cycle, an
// output name another producer's ExternalArtifact has), SourceFetchFailed
// (a source missing or without an artifact) or BuildFailed (a copy
// operation failing on the content); Unknown while a job is out.
// Reconciling is True while a job is out (positive polarity, removed when
// its outcome is applied); Stalled is True when only a spec change can
// help (ValidationFailed).
const (
	// reasonCycle is the message prefix of a dependency cycle.
	reasonCycle = "circular dependency"
	// cycleDepth bounds the generators followed looking for a cycle.
	cycleDepth = 32
)

// Interval is how often a generator is reconciled without a trigger (as
// source-watcher's GetRequeueAfter), jittered: a lost job is made again.
const Interval = time.Hour

// staleRead is how soon a reconcile that read a generator older than the
// API server's looks again.
const staleRead = time.Second

// sourceIndex is the field index of generators by source: one
// "<Kind>/<namespace>/<name>" entry per source.
const sourceIndex = ".spec.sources.ref"

// Reconciler reconciles ArtifactGenerators and applies their jobs'
// outcomes.
type Reconciler struct {
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
}

// sourceKinds are the kinds a generator may name, and how to read their
// artifact.
var sourceKinds = map[string]func() artifactObject{
	sourcev1.GitRepositoryKind:    func() artifactObject { return &sourcev1.GitRepository{} },
	sourcev1.OCIRepositoryKind:    func() artifactObject { return &sourcev1.OCIRepository{} },
	sourcev1.BucketKind:           func() artifactObject { return &sourcev1.Bucket{} },
	sourcev1.HelmChartKind:        func() artifactObject { return &sourcev1.HelmChart{} },
	sourcev1.ExternalArtifactKind: func() artifactObject { return &sourcev1.ExternalArtifact{} },
}

// artifactObject is a source object with an artifact in its status.
type artifactObject interface {
	client.Object
	GetArtifact() *meta.Artifact
}

// SetupWithManager registers the reconciler: it reacts to spec changes and
// reconcile requests of generators, to artifact changes of the objects
// they name, and to the deletion of their ExternalArtifacts.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, concurrency int) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &swv1beta1.ArtifactGenerator{}, sourceIndex, func(o client.Object) []string {
		g := o.(*swv1beta1.ArtifactGenerator)
		keys := make([]string, 0, len(g.Spec.Sources))
		for _, s := range g.Spec.Sources {
			keys = append(keys, sourceKey(s.Kind, namespaceOf(s, g), s.Name))
		}
		return keys
	}); err != nil {
		return fmt.Errorf("index generators by source: %w", err)
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("artifactgenerator").
		For(&swv1beta1.ArtifactGenerator{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicates.ReconcileRequestedPredicate{}))).
		Owns(&sourcev1.ExternalArtifact{}, builder.WithPredicates(deletedOnly{})).
		WithOptions(crcontroller.Options{MaxConcurrentReconciles: concurrency})
	for kind, newObj := range sourceKinds {
		b = b.Watches(newObj(), handler.EnqueueRequestsFromMapFunc(r.generatorsOf(kind)),
			builder.WithPredicates(source.ArtifactChanged{}))
	}
	return b.Complete(r)
}

// generatorsOf maps a source object of kind to the generators naming it.
func (r *Reconciler) generatorsOf(kind string) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		var list swv1beta1.ArtifactGeneratorList
		if err := r.Client.List(ctx, &list, client.MatchingFields{sourceIndex: sourceKey(kind, o.GetNamespace(), o.GetName())}); err != nil {
			logr.FromContextOrDiscard(ctx).Error(err, "listing the generators of a source", "kind", kind, "name", o.GetName())
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(list.Items))
		for _, g := range list.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: g.Namespace, Name: g.Name}})
		}
		return reqs
	}
}

// deletedOnly passes deletions: the watcher's own writes to the
// ExternalArtifacts it owns trigger nothing.
type deletedOnly struct{ predicate.Funcs }

func (deletedOnly) Create(event.CreateEvent) bool   { return false }
func (deletedOnly) Update(event.UpdateEvent) bool   { return false }
func (deletedOnly) Generic(event.GenericEvent) bool { return false }

func sourceKey(kind, namespace, name string) string { return kind + "/" + namespace + "/" + name }

func namespaceOf(s swv1beta1.SourceReference, g *swv1beta1.ArtifactGenerator) string {
	if s.Namespace != "" {
		return s.Namespace
	}
	return g.Namespace
}

// problem is why a generator cannot be built now: its Ready reason and
// message, and whether only a spec change helps (stalled).
type problem struct {
	reason, message string
	stalled         bool
}

func (p *problem) Error() string { return p.message }

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
		base := gen.DeepCopy()
		controllerutil.AddFinalizer(gen, swv1beta1.Finalizer)
		if err := r.Client.Patch(ctx, gen, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
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
	before := gen.DeepCopy()
	setCondition(gen, meta.ReconcilingCondition, metav1.ConditionTrue, meta.ProgressingReason, "building artifacts for sources "+srcs.digest)
	if c := apimeta.FindStatusCondition(gen.Status.Conditions, meta.ReadyCondition); c == nil || c.Status != metav1.ConditionFalse {
		setCondition(gen, meta.ReadyCondition, metav1.ConditionUnknown, meta.ProgressingReason, "building artifacts")
	}
	apimeta.RemoveStatusCondition(&gen.Status.Conditions, meta.StalledCondition)
	if !equality.Semantic.DeepEqual(before.Status, gen.Status) {
		err := r.Client.Status().Patch(ctx, gen, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
		if apierrors.IsConflict(err) {
			log.V(1).Info("generator changed since read: looking again")
			return ctrl.Result{RequeueAfter: staleRead}, nil
		}
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("patch status: %w", err)
		}
	}
	job := r.job(gen, srcs.digest, token, previous)
	req2 := &events.GenerateRequested{Job: job, Revision: srcs.digest, Sources: srcs.list,
		Artifacts: gen.Spec.OutputArtifacts, Previous: previous}
	if err := r.Jobs.Publish(ctx, events.PackageSubject(events.ArtifactGeneratorKind), events.TypeGenerateRequested, job, req2); err != nil {
		return ctrl.Result{}, fmt.Errorf("publish generate job: %w", err)
	}
	r.Metrics.count("published")
	log.Info("generate job published", "job", job.ID, "digest", srcs.digest, "outputs", len(gen.Spec.OutputArtifacts))
	return ctrl.Result{RequeueAfter: jitter.JitteredIntervalDuration(Interval)}, nil
}

// resolved are a generator's sources with their artifacts, and their
// digest (as source-watcher's observedSourcesDigest, with the generator's
// generation: a spec change is a new job).
type resolved struct {
	list   []events.GeneratorSource
	digest string
}

// resolve checks the spec, looks for a dependency cycle and reads every
// source's artifact. Its error is a *problem, or the API server's.
func (r *Reconciler) resolve(ctx context.Context, gen *swv1beta1.ArtifactGenerator) (*resolved, error) {
	if err := compose.Validate(&gen.Spec); err != nil {
		return nil, &problem{reason: swv1beta1.ValidationFailedReason, message: err.Error(), stalled: true}
	}
	if err := r.checkCycle(ctx, gen); err != nil {
		return nil, err
	}
	for _, a := range gen.Spec.OutputArtifacts {
		ea := &sourcev1.ExternalArtifact{}
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: gen.Namespace, Name: a.Name}, ea)
		if err == nil && !r.producedBy(ea, gen) {
			return nil, &problem{reason: swv1beta1.ValidationFailedReason, stalled: true,
				message: fmt.Sprintf("artifact %q: ExternalArtifact %s/%s belongs to another producer", a.Name, gen.Namespace, a.Name)}
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	res := &resolved{}
	observed := map[string]swv1beta1.ObservedSource{}
	for _, s := range gen.Spec.Sources {
		newObj, ok := sourceKinds[s.Kind]
		if !ok {
			return nil, &problem{reason: swv1beta1.ValidationFailedReason, stalled: true,
				message: fmt.Sprintf("source %q: unsupported kind %q", s.Alias, s.Kind)}
		}
		obj := newObj()
		key := types.NamespacedName{Namespace: namespaceOf(s, gen), Name: s.Name}
		if err := r.Client.Get(ctx, key, obj); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, &problem{reason: swv1beta1.SourceFetchFailedReason,
					message: fmt.Sprintf("source %q: %s %s not found", s.Alias, s.Kind, key)}
			}
			return nil, fmt.Errorf("get source %s %s: %w", s.Kind, key, err)
		}
		a := obj.GetArtifact()
		if a == nil || a.Path == "" {
			return nil, &problem{reason: swv1beta1.SourceFetchFailedReason,
				message: fmt.Sprintf("source %q: %s %s has no artifact yet", s.Alias, s.Kind, key)}
		}
		res.list = append(res.list, events.GeneratorSource{Alias: s.Alias, Kind: s.Kind, Namespace: key.Namespace, Name: key.Name, Artifact: *a.DeepCopy()})
		observed[s.Alias] = swv1beta1.ObservedSource{Digest: a.Digest, Revision: a.Revision, URL: a.URL,
			OriginRevision: a.Metadata[swv1beta1.ArtifactOriginRevisionAnnotation]}
	}
	h := sha256.Sum256(fmt.Appendf(nil, "%s|generation=%d", swv1beta1.HashObservedSources(observed), gen.Generation))
	res.digest = fmt.Sprintf("sha256:%x", h)
	return res, nil
}

// producedBy tells whether ea's spec.sourceRef names gen.
func (r *Reconciler) producedBy(ea *sourcev1.ExternalArtifact, gen *swv1beta1.ArtifactGenerator) bool {
	ref := ea.Spec.SourceRef
	if ref == nil {
		return false
	}
	ns := ref.Namespace
	if ns == "" {
		ns = ea.Namespace
	}
	return ref.Kind == swv1beta1.ArtifactGeneratorKind && ref.Name == gen.Name && ns == gen.Namespace
}

// checkCycle follows the generator's ExternalArtifact sources to the
// generators that produce them, and theirs, and fails when it comes back
// to gen: a generator whose output feeds itself would rebuild forever.
func (r *Reconciler) checkCycle(ctx context.Context, gen *swv1beta1.ArtifactGenerator) error {
	self := types.NamespacedName{Namespace: gen.Namespace, Name: gen.Name}
	seen := map[types.NamespacedName]bool{}
	var walk func(g *swv1beta1.ArtifactGenerator, path []string, depth int) error
	walk = func(g *swv1beta1.ArtifactGenerator, path []string, depth int) error {
		if depth > cycleDepth {
			return nil
		}
		for _, s := range g.Spec.Sources {
			if s.Kind != sourcev1.ExternalArtifactKind {
				continue
			}
			key := types.NamespacedName{Namespace: namespaceOf(s, g), Name: s.Name}
			via := append(slices.Clone(path), fmt.Sprintf("ExternalArtifact %s", key))
			// An output of the generator itself, published or not yet.
			if key.Namespace == gen.Namespace && slices.ContainsFunc(gen.Spec.OutputArtifacts,
				func(a swv1beta1.OutputArtifact) bool { return a.Name == key.Name }) {
				return &problem{reason: swv1beta1.ValidationFailedReason, stalled: true,
					message: fmt.Sprintf("%s: %s -> ArtifactGenerator %s", reasonCycle, strings.Join(via, " -> "), self)}
			}
			ea := &sourcev1.ExternalArtifact{}
			if err := r.Client.Get(ctx, key, ea); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return fmt.Errorf("get ExternalArtifact %s: %w", key, err)
			}
			ref := ea.Spec.SourceRef
			if ref == nil || ref.Kind != swv1beta1.ArtifactGeneratorKind {
				continue
			}
			producer := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
			if producer.Namespace == "" {
				producer.Namespace = ea.Namespace
			}
			via = append(via, fmt.Sprintf("ArtifactGenerator %s", producer))
			if producer == self {
				return &problem{reason: swv1beta1.ValidationFailedReason, stalled: true,
					message: fmt.Sprintf("%s: %s", reasonCycle, strings.Join(via, " -> "))}
			}
			if seen[producer] {
				continue
			}
			seen[producer] = true
			next := &swv1beta1.ArtifactGenerator{}
			if err := r.Client.Get(ctx, producer, next); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return fmt.Errorf("get ArtifactGenerator %s: %w", producer, err)
			}
			if err := walk(next, via, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(gen, []string{fmt.Sprintf("ArtifactGenerator %s", self)}, 0)
}

// published returns the outputs the generator's ExternalArtifacts hold now
// (the job's previous outputs), and whether every output of the spec is
// published by an ExternalArtifact of this generator.
func (r *Reconciler) published(ctx context.Context, gen *swv1beta1.ArtifactGenerator) ([]events.GeneratedOutput, bool) {
	complete := true
	want := map[string]bool{}
	for _, a := range gen.Spec.OutputArtifacts {
		want[a.Name] = true
	}
	var out []events.GeneratedOutput
	names := map[string]bool{}
	for _, ref := range gen.Status.Inventory {
		names[ref.Name] = true
	}
	for name := range want {
		names[name] = true
	}
	for _, name := range slices.Sorted(mapsKeys(names)) {
		ea := &sourcev1.ExternalArtifact{}
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: gen.Namespace, Name: name}, ea)
		if err != nil || !r.producedBy(ea, gen) || ea.Status.Artifact == nil {
			if want[name] {
				complete = false
			}
			if err == nil || !slices.ContainsFunc(gen.Status.Inventory, func(i swv1beta1.ExternalArtifactReference) bool { return i.Name == name }) {
				continue
			}
			// Its ExternalArtifact is gone but its files are stored: the
			// job removes them when the output is no longer wanted.
			out = append(out, events.GeneratedOutput{Name: name})
			continue
		}
		a := *ea.Status.Artifact.DeepCopy()
		a.URL = ""
		out = append(out, events.GeneratedOutput{Name: name, Artifact: a})
	}
	return out, complete
}

func mapsKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
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

// fail writes a problem into Ready (and Stalled), records a Warning Event
// when the problem is new, and waits: for a spec change when stalled, for
// a source's change (watched) otherwise.
func (r *Reconciler) fail(ctx context.Context, gen *swv1beta1.ArtifactGenerator, p *problem) (ctrl.Result, error) {
	old := apimeta.FindStatusCondition(gen.Status.Conditions, meta.ReadyCondition)
	isNew := old == nil || old.Status != metav1.ConditionFalse || old.Reason != p.reason || old.Message != p.message
	err := r.patchStatus(ctx, gen, func(g *swv1beta1.ArtifactGenerator) {
		setCondition(g, meta.ReadyCondition, metav1.ConditionFalse, p.reason, p.message)
		apimeta.RemoveStatusCondition(&g.Status.Conditions, meta.ReconcilingCondition)
		if p.stalled {
			setCondition(g, meta.StalledCondition, metav1.ConditionTrue, p.reason, p.message)
		} else {
			apimeta.RemoveStatusCondition(&g.Status.Conditions, meta.StalledCondition)
		}
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	if isNew {
		r.event(gen, corev1.EventTypeWarning, p.reason, p.message)
		logr.FromContextOrDiscard(ctx).Info("cannot generate artifacts", "reason", p.reason, "message", p.message)
	}
	if p.stalled {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: jitter.JitteredIntervalDuration(Interval)}, nil
}

// finalize asks the packagers to remove every stored output (a job with
// no artifacts and the inventory as previous), then removes the
// finalizer. The ExternalArtifacts are collected by Kubernetes with their
// owner.
func (r *Reconciler) finalize(ctx context.Context, gen *swv1beta1.ArtifactGenerator) error {
	if !controllerutil.ContainsFinalizer(gen, swv1beta1.Finalizer) {
		return nil
	}
	job := events.Job{ID: events.DeletionJobID(string(gen.UID)), Object: objectRef(gen), RequestedAt: r.now()}
	r.Seal.Seal(&job)
	var previous []events.GeneratedOutput
	for _, ref := range gen.Status.Inventory {
		previous = append(previous, events.GeneratedOutput{Name: ref.Name})
	}
	if len(previous) > 0 {
		if err := r.Jobs.Publish(ctx, events.PackageSubject(events.ArtifactGeneratorKind), events.TypeGenerateRequested, job,
			&events.GenerateRequested{Job: job, Revision: "deleted", Previous: previous}); err != nil {
			return err
		}
	}
	base := gen.DeepCopy()
	controllerutil.RemoveFinalizer(gen, swv1beta1.Finalizer)
	if err := r.Client.Patch(ctx, gen, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("remove finalizer: %w", err))
	}
	logr.FromContextOrDiscard(ctx).Info("stored artifacts scheduled for deletion; finalizer removed", "outputs", len(previous))
	return nil
}

// patchStatus changes gen's status with mutate and writes it with a merge
// patch guarded by its resourceVersion, re-reading it live and mutating
// again on a conflict. Nothing is written when nothing changed.
func (r *Reconciler) patchStatus(ctx context.Context, gen *swv1beta1.ArtifactGenerator, mutate func(*swv1beta1.ArtifactGenerator)) error {
	for attempt := 0; ; attempt++ {
		before := gen.DeepCopy()
		mutate(gen)
		if equality.Semantic.DeepEqual(before.Status, gen.Status) {
			return nil
		}
		err := r.Client.Status().Patch(ctx, gen, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) || attempt == 8 {
			return fmt.Errorf("patch status: %w", err)
		}
		if err := r.Live.Get(ctx, client.ObjectKeyFromObject(gen), gen); err != nil {
			return fmt.Errorf("patch status: re-read after conflict: %w", err)
		}
	}
}

// setCondition sets a condition for the generator's generation.
func setCondition(g *swv1beta1.ArtifactGenerator, typ string, status metav1.ConditionStatus, reason, message string) {
	apimeta.SetStatusCondition(&g.Status.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason,
		Message: message, ObservedGeneration: g.Generation})
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

// Metrics count the generators' jobs and outcomes:
// headwater_artifactgenerator_reconciles_total{result}.
type Metrics struct {
	results *prometheus.CounterVec
}

// NewMetrics registers the generator's families on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{results: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Name: "artifactgenerator_reconciles_total",
		Help: "ArtifactGenerator reconciles and outcomes, by result: published (a job), problem (a spec or source problem, no job), stored, failed, stale (an outcome for sources since changed, ignored).",
	}, []string{"result"})}
	reg.MustRegister(m.results)
	return m
}

func (m *Metrics) count(result string) {
	if m == nil {
		return
	}
	m.results.WithLabelValues(result).Inc()
}

// inventory is the status.inventory of outputs, sorted by name.
func inventory(ns string, outputs []events.GeneratedOutput) []swv1beta1.ExternalArtifactReference {
	out := make([]swv1beta1.ExternalArtifactReference, 0, len(outputs))
	for _, o := range outputs {
		file := o.Artifact.Path[strings.LastIndex(o.Artifact.Path, "/")+1:]
		out = append(out, swv1beta1.ExternalArtifactReference{Name: o.Name, Namespace: ns, Digest: o.Artifact.Digest, Filename: file})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
