// Package source adapts each Flux source kind to the watcher's generic
// reconciler and outcome handler: how to make an empty object, what its
// fetch request carries, and where its common status fields live.
package source

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

// Kind adapts one source kind.
type Kind struct {
	// Name is the Kubernetes kind, e.g. "GitRepository".
	Name string
	// New returns an empty object of the kind.
	New func() Object
	// Suspended reports spec.suspend.
	Suspended func(Object) bool
	// Request copies the spec into a fetch request, resolving references
	// to other objects with r, and reports whether the content-affecting
	// part of the spec differs from what the stored artifact was built with
	// (so the artifact must be rebuilt even if the upstream revision is
	// unchanged). A *WaitingError means the job cannot be made yet.
	Request func(ctx context.Context, r client.Reader, obj Object, req *events.FetchRequested) (force bool, err error)
	// Record writes the kind-specific parts of an outcome into status
	// (e.g. a GitRepository's includedArtifacts and SourceVerified); nil
	// when the kind has none.
	Record func(obj Object, eventType string, o *events.Outcome)
	// Setup adds kind-specific watches to the kind's controller, e.g. a
	// GitRepository's reaction to the artifacts it includes changing.
	Setup func(ctx context.Context, mgr ctrl.Manager, b *builder.Builder) error
	// Observe records, once the artifact for the object's current spec is
	// in status, the spec fields status reports as observed (and any field
	// derived from the artifact, such as a Bucket's status.url).
	Observe func(Object)
	// ReadyMessage is Flux's Ready and ArtifactInStorage message for a
	// stored revision, which differs between kinds.
	ReadyMessage func(revision string) string
	// UpToDateReason is the reason Flux logs when nothing changed upstream.
	UpToDateReason string
	// Status returns the object's common status fields.
	Status func(Object) Status
	// FailureConditions are the negative-polarity conditions a successful
	// outcome clears.
	FailureConditions []string
}

// Kinds lists every kind the watcher reconciles.
func Kinds() []Kind {
	return []Kind{GitRepository(), Bucket()}
}

// ByName returns the kind with the given name.
func ByName(name string) (Kind, bool) {
	for _, k := range Kinds() {
		if k.Name == name {
			return k, true
		}
	}
	return Kind{}, false
}

// WaitingError says a job cannot be made until something else changes (an
// included source gets an artifact, say). The reconciler writes Condition
// (abnormal-true) and Ready=False with Reason and Message, records a Warning
// Event, and looks again after RequeueAfter, or never if Stalled.
type WaitingError struct {
	Condition string
	Reason    string
	Message   string
	// Stalled is true when only a spec change can help.
	Stalled bool
}

func (e *WaitingError) Error() string { return e.Message }

// waiting builds a WaitingError.
func waiting(condition, reason string, stalled bool, format string, args ...any) *WaitingError {
	return &WaitingError{Condition: condition, Reason: reason, Stalled: stalled, Message: fmt.Sprintf(format, args...)}
}
