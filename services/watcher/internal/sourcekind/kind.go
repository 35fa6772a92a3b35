package sourcekind

import (
	"context"
	"fmt"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// Object is a Flux source object the watcher manages.
type Object interface {
	client.Object
	conditions.Setter
	GetArtifact() *meta.Artifact
	GetRequeueAfter() time.Duration
}

// Status points at the status fields every source kind has, so one piece of
// code can write them for any kind.
type Status struct {
	ObservedGeneration     *int64
	Artifact               **meta.Artifact
	LastHandledReconcileAt *string
}

// Kind is one source kind as the watcher's generic code sees it: the
// reconciler (package controller) makes its jobs with it, package status
// writes its outcomes with it. Its fields say, as data, how Flux names,
// words and orders the kind's status; its Adapter does the kind's own
// work on its objects.
type Kind struct {
	// Name is the Kubernetes kind, e.g. "GitRepository".
	Name string
	// Plugin is the registration of a plug-in kind (see Plugin); nil for
	// the built-in kinds.
	Plugin *Registration
	// ReadyFormat formats Flux's Ready and ArtifactInStorage message for a
	// stored revision (one %s), which differs between kinds.
	ReadyFormat string
	// UpToDateReason is the reason Flux logs when nothing changed upstream.
	UpToDateReason string
	// TracesVerification is set for the kinds whose successful signature
	// check Flux records as a trace Event (a GitRepository's "verified
	// signature of ..."); the others only set SourceVerified.
	TracesVerification bool
	// Conditions are the kind's own conditions besides Ready, Reconciling,
	// Stalled and ArtifactInStorage, in the order in which they decide
	// Ready: the first failing one (a negative-polarity one that is True,
	// a normal-polarity one that is False; see NegativePolarity) gives
	// Ready=False its reason and message. A failure sets one of the
	// negative ones, a success clears them.
	Conditions []string
	// Adapter does the kind's work on its objects (Adapt makes one).
	Adapter
}

// ReadyMessage is Flux's Ready and ArtifactInStorage message for a stored
// revision.
func (k Kind) ReadyMessage(revision string) string { return fmt.Sprintf(k.ReadyFormat, revision) }

// Adapter is what the watcher asks of a kind's objects. The first group
// serves the reconciler, the second the outcome writer. Adapt makes one
// from functions written for the kind's Go type.
type Adapter interface {
	// New returns an empty object of the kind.
	New() Object
	// Status returns the object's common status fields.
	Status(Object) Status
	// Suspended reports spec.suspend.
	Suspended(Object) bool
	// Static reports an object Flux leaves alone: no artifact, no
	// finalizer, an empty status (a HelmRepository of type oci). Its
	// artifacts, if it had any, are deleted.
	Static(Object) bool
	// Remote names what an object's check asks of its upstream: the URL
	// and everything the fetcher authenticates and connects with. Objects
	// with the same remote are answered by one listing (a Git remote's
	// references, a Helm index), so the watcher checks them together. An
	// empty name leaves the object on its own schedule.
	Remote(Object) string
	// Request copies the spec into a fetch request, resolving references
	// to other objects with r, and reports whether the content-affecting
	// part of the spec differs from what the stored artifact was built with
	// (so the artifact must be rebuilt even if the upstream revision is
	// unchanged). A *failure.Error (Waiting or Stalling) means the job
	// cannot be made yet: the reconciler writes it as it writes a failed
	// job's outcome.
	Request(ctx context.Context, r client.Reader, obj Object, req *events.FetchRequested) (force bool, err error)
	// Progress records what a new job is made from in status before the
	// job is published (a HelmChart's observedSourceArtifactRevision,
	// which Flux records before building).
	Progress(obj Object, req *events.FetchRequested)
	// Setup adds kind-specific watches to the kind's controller, e.g. a
	// GitRepository's reaction to the artifacts it includes changing.
	Setup(ctx context.Context, mgr ctrl.Manager, b *builder.Builder) error

	// Observe records, once the artifact for the object's current spec is
	// in status, the spec fields status reports as observed (and any field
	// derived from the artifact, such as a Bucket's status.url).
	Observe(Object)
	// Record writes the kind-specific parts of an outcome into status
	// (e.g. a GitRepository's includedArtifacts and SourceVerified).
	Record(obj Object, eventType string, o *events.Outcome)
	// StoredCondition gives the reason and message of ArtifactInStorage
	// (and so of Ready) for an outcome with an artifact, and of the Event
	// for a new one, where they are not Succeeded, ReadyFormat and
	// NewArtifact (a HelmChart's ChartPullSucceeded "pulled '<chart>'
	// chart with version '<version>'"); an empty reason where they are.
	StoredCondition(obj Object, o *events.Outcome) (reason, message string)
	// Recovered gives Flux's message of the Event for a recovery that
	// kept the stored artifact (reason Succeeded): the new artifact's
	// message as Flux words it without a fresh fetch (a GitRepository's
	// "stored artifact for commit '<revision>'"); empty for the Ready
	// message.
	Recovered(obj Object, art *meta.Artifact) string
	// Outdated decides ArtifactOutdated for a failed job that had
	// resolved revision (empty if it resolved none), given the stored
	// artifact prev (nil if none): its reason and message, and whether to
	// set it (Flux's default is NewRevisionOutdated; a HelmChart's
	// differs: NewChart).
	Outdated(obj Object, prev *meta.Artifact, revision string) (reason, message string, outdated bool)
}

// Funcs are a kind's functions written for the Go type T of its objects.
// New, Status, Suspended and Request are required; every other may be
// nil, which does nothing (Static reports false, Remote names none,
// StoredCondition and Recovered leave Flux's defaults, Outdated is
// NewRevisionOutdated). Each function documents itself on Adapter.
type Funcs[T Object] struct {
	New             func() T
	Status          func(T) Status
	Suspended       func(T) bool
	Static          func(T) bool
	Remote          func(T) string
	Request         func(ctx context.Context, r client.Reader, obj T, req *events.FetchRequested) (bool, error)
	Progress        func(obj T, req *events.FetchRequested)
	Setup           func(ctx context.Context, mgr ctrl.Manager, b *builder.Builder) error
	Observe         func(T)
	Record          func(obj T, eventType string, o *events.Outcome)
	StoredCondition func(obj T, o *events.Outcome) (reason, message string)
	Recovered       func(obj T, art *meta.Artifact) string
	Outdated        func(obj T, prev *meta.Artifact, revision string) (reason, message string, outdated bool)
}

// Adapt returns f as an Adapter: the one place where an Object is taken
// for the kind's Go type.
func Adapt[T Object](f Funcs[T]) Adapter { return adapter[T]{f} }

type adapter[T Object] struct{ f Funcs[T] }

func (a adapter[T]) New() Object             { return a.f.New() }
func (a adapter[T]) Status(o Object) Status  { return a.f.Status(o.(T)) }
func (a adapter[T]) Suspended(o Object) bool { return a.f.Suspended(o.(T)) }
func (a adapter[T]) Static(o Object) bool    { return a.f.Static != nil && a.f.Static(o.(T)) }
func (a adapter[T]) Observe(o Object)        { call(a.f.Observe, o) }
func (a adapter[T]) Remote(o Object) string {
	if a.f.Remote == nil {
		return ""
	}
	return a.f.Remote(o.(T))
}

func (a adapter[T]) Request(ctx context.Context, r client.Reader, o Object, req *events.FetchRequested) (bool, error) {
	return a.f.Request(ctx, r, o.(T), req)
}

func (a adapter[T]) Progress(o Object, req *events.FetchRequested) {
	if a.f.Progress != nil {
		a.f.Progress(o.(T), req)
	}
}

func (a adapter[T]) Setup(ctx context.Context, mgr ctrl.Manager, b *builder.Builder) error {
	if a.f.Setup == nil {
		return nil
	}
	return a.f.Setup(ctx, mgr, b)
}

func (a adapter[T]) Record(o Object, eventType string, out *events.Outcome) {
	if a.f.Record != nil {
		a.f.Record(o.(T), eventType, out)
	}
}

func (a adapter[T]) StoredCondition(o Object, out *events.Outcome) (string, string) {
	if a.f.StoredCondition == nil {
		return "", ""
	}
	return a.f.StoredCondition(o.(T), out)
}

func (a adapter[T]) Recovered(o Object, art *meta.Artifact) string {
	if a.f.Recovered == nil {
		return ""
	}
	return a.f.Recovered(o.(T), art)
}

func (a adapter[T]) Outdated(o Object, prev *meta.Artifact, revision string) (string, string, bool) {
	if a.f.Outdated == nil {
		return NewRevisionOutdated(o, prev, revision)
	}
	return a.f.Outdated(o.(T), prev, revision)
}

func call[T Object](f func(T), o Object) {
	if f != nil {
		f(o.(T))
	}
}

// NewRevisionReason is the reason of ArtifactOutdated when a new upstream
// revision was seen but its artifact could not be made.
const NewRevisionReason = "NewRevision"

// NewRevisionOutdated is Flux's ArtifactOutdated for most kinds (see
// Adapter.Outdated): NewRevision "new upstream revision '<revision>'"
// whenever revision is not prev's.
func NewRevisionOutdated(_ Object, prev *meta.Artifact, revision string) (string, string, bool) {
	if revision == "" || (prev != nil && prev.Revision == revision) {
		return "", "", false
	}
	return NewRevisionReason, fmt.Sprintf("new upstream revision '%s'", revision), true
}
