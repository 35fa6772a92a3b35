// Package sourcekind adapts each Flux source kind to the watcher's generic
// reconciler and outcome handler: how to make an empty object, what its
// fetch request carries, and where its common status fields live.
package sourcekind

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
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
	// Plugin is the registration of a plug-in kind (see Plugin); nil for
	// the built-in kinds.
	Plugin *Registration
	// New returns an empty object of the kind.
	New func() Object
	// Suspended reports spec.suspend.
	Suspended func(Object) bool
	// Static, when set, reports an object Flux leaves alone: no artifact,
	// no finalizer, an empty status (a HelmRepository of type oci). Its
	// artifacts, if it had any, are deleted. Nil for kinds always fetched.
	Static func(Object) bool
	// Request copies the spec into a fetch request, resolving references
	// to other objects with r, and reports whether the content-affecting
	// part of the spec differs from what the stored artifact was built with
	// (so the artifact must be rebuilt even if the upstream revision is
	// unchanged). A *failure.Error (Waiting or Stalling) means the job
	// cannot be made yet: the reconciler writes it as it writes a failed
	// job's outcome.
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
	// ReadyFormat formats Flux's Ready and ArtifactInStorage message for a
	// stored revision (one %s), which differs between kinds.
	ReadyFormat string
	// StoredCondition, when set, gives the reason and message of
	// ArtifactInStorage (and so of Ready) for an outcome with an artifact,
	// and of the Event for a new one, where they are not Succeeded,
	// ReadyFormat and NewArtifact (a HelmChart's ChartPullSucceeded
	// "pulled '<chart>' chart with version '<version>'").
	StoredCondition func(obj Object, o *events.Outcome) (reason, message string)
	// Recovered, when set, gives Flux's message of the Event for a
	// recovery that kept the stored artifact (reason Succeeded): the new
	// artifact's message as Flux words it without a fresh fetch (a
	// GitRepository's "stored artifact for commit '<revision>'"). Nil
	// means the Ready message.
	Recovered func(obj Object, art *meta.Artifact) string
	// Progress, when set, records what a new job is made from in status
	// before the job is published (a HelmChart's
	// observedSourceArtifactRevision, which Flux records before building).
	Progress func(obj Object, req *events.FetchRequested)
	// Outdated, when set, decides ArtifactOutdated for a failed job that
	// had resolved revision (empty if it resolved none), given the stored
	// artifact prev (nil if none): its reason and message, and whether to
	// set it. Nil means Flux's default, NewRevision "new upstream revision
	// '<revision>'" whenever revision is not prev's (a HelmChart's differs:
	// NewChart).
	Outdated func(obj Object, prev *meta.Artifact, revision string) (reason, message string, outdated bool)
	// TracesVerification is set for the kinds whose successful signature
	// check Flux records as a trace Event (a GitRepository's "verified
	// signature of ..."); the others only set SourceVerified.
	TracesVerification bool
	// UpToDateReason is the reason Flux logs when nothing changed upstream.
	UpToDateReason string
	// Remote names what an object's check asks of its upstream: the URL
	// and everything the fetcher authenticates and connects with. Objects
	// with the same remote are answered by one listing (a Git remote's
	// references, a Helm index), so the watcher checks them together.
	// Nil, or an empty name, leaves the object on its own schedule.
	Remote func(Object) string
	// Status returns the object's common status fields.
	Status func(Object) Status
	// Conditions are the kind's own conditions besides Ready, Reconciling,
	// Stalled and ArtifactInStorage, in the order in which they decide
	// Ready: the first failing one (a negative-polarity one that is True,
	// a normal-polarity one that is False; see NegativePolarity) gives
	// Ready=False its reason and message. A failure sets one of the
	// negative ones, a success clears them.
	Conditions []string
}

// NegativePolarity reports whether a condition type is abnormal-true: True
// means something is wrong (FetchFailed, StorageOperationFailed,
// IncludeUnavailable, BuildFailed, ArtifactOutdated, Reconciling, Stalled). Every other
// condition a source has (Ready, ArtifactInStorage, SourceVerified) is
// normal-polarity: True means all is well.
func NegativePolarity(conditionType string) bool {
	switch conditionType {
	case sourcev1.FetchFailedCondition, sourcev1.StorageOperationFailedCondition, sourcev1.IncludeUnavailableCondition,
		sourcev1.BuildFailedCondition, sourcev1.ArtifactOutdatedCondition, meta.ReconcilingCondition, meta.StalledCondition:
		return true
	}
	return false
}

// ReadyMessage is Flux's Ready and ArtifactInStorage message for a stored
// revision.
func (k Kind) ReadyMessage(revision string) string { return fmt.Sprintf(k.ReadyFormat, revision) }

// Kinds lists every kind the watcher reconciles.
func Kinds() []Kind {
	return []Kind{GitRepository(), Bucket(), OCIRepository(), HelmRepository(), HelmChart()}
}

// ByName returns the built-in kind with the given name.
func ByName(name string) (Kind, bool) {
	return Set(Kinds()).ByName(name)
}

// Set is the kinds one watcher reconciles: the built-in ones and the
// plug-in kinds it is configured with.
type Set []Kind

// NewSet returns the built-in kinds and a kind for each of regs.
func NewSet(regs []Registration) Set {
	s := Set(Kinds())
	for _, r := range regs {
		s = append(s, Plugin(r))
	}
	return s
}

// ByName returns the kind with the given name; a nil Set holds the
// built-in kinds.
func (s Set) ByName(name string) (Kind, bool) {
	if s == nil {
		s = Kinds()
	}
	for _, k := range s {
		if k.Name == name {
			return k, true
		}
	}
	return Kind{}, false
}

// waiting is the failure of a job that cannot be made until something else
// changes (an included source gets an artifact): the condition
// (abnormal-true), Ready=False with reason and message, a Warning Event, and
// a look again later; with stalled, only after the spec changes.
func waiting(condition, reason string, stalled bool, format string, args ...any) *failure.Error {
	h := failure.Waiting
	if stalled {
		h = failure.Stalling
	}
	return failure.New(h, condition, reason, format, args...)
}

// refuseCredentials refuses a URL that carries credentials in its user-info
// (https://user:token@host/..., https://token@host/..., oci://user:token@...):
// a job's spec travels on the bus, where no credential may go. An SSH user
// name alone (ssh://git@host/...) is no credential. A URL that does not
// parse is refused too when it has an '@' (a password with a character a
// URL must escape makes the whole URL invalid: it may still hold the
// credentials). The source stalls with a message saying where the
// credentials belong; the URL itself is not repeated.
func refuseCredentials(field, raw string) error {
	if !strings.Contains(raw, "://") {
		// A Bucket endpoint is host[:port]: read it as an authority.
		raw = "//" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		if !strings.Contains(raw, "@") {
			// An unparsable URL is the fetcher's to report.
			return nil
		}
		return failure.New(failure.Stalling, sourcev1.FetchFailedCondition, sourcev1.URLInvalidReason,
			"%s is not a valid URL and may carry credentials, which Headwater never sends over its bus: "+
				"correct it, and put any credentials in a Secret named by spec.secretRef", field)
	}
	if u.User == nil {
		return nil
	}
	if _, password := u.User.Password(); !password && u.Scheme == "ssh" {
		return nil
	}
	return failure.New(failure.Stalling, sourcev1.FetchFailedCondition, sourcev1.URLInvalidReason,
		"%s carries credentials in its user-info, which Headwater never sends over its bus: "+
			"remove them and put them in a Secret named by spec.secretRef", field)
}

// RemoteKey is a Kind's Remote for an object whose upstream is location,
// reached with auth (Secret names, a provider, a service account): the
// same location with the same credentials is one remote. Credentials are
// namespaced, so the object's namespace is part of the key when any of
// auth is set; a public location is one remote across namespaces.
func RemoteKey(obj Object, location string, auth ...string) string {
	key := location
	for _, a := range auth {
		if a != "" {
			return obj.GetNamespace() + "\x00" + location + "\x00" + strings.Join(auth, "\x00")
		}
	}
	return key
}

// localRef is the name a reference holds, empty for none.
func localRef(r *meta.LocalObjectReference) string {
	if r == nil {
		return ""
	}
	return r.Name
}
