// Package status turns what the bus reports into a source's status and its
// Kubernetes Events, the way Flux's source-controller writes them.
//
// Each step writes only the conditions it owns; Summarize, run by Patch
// after every change, derives Ready from them (Flux's summarize-and-patch):
//
//   - Ready (summary; normal polarity): False with the reason and message
//     of Stalled, or of the first failing one of the kind's Conditions (in
//     the kind's order); else, while a new generation is processed
//     (Reconciling), Unknown/Progressing unless the object was Ready with
//     its artifact in storage, which stays Ready (Flux's
//     ProgressiveStatus); else True with ArtifactInStorage's reason and
//     message.
//   - ArtifactInStorage (normal polarity): True once an artifact is stored
//     (Apply); False when a failed job found the stored one gone or
//     corrupt.
//   - Reconciling (abnormal-true): set while a new generation is processed
//     (MarkProgressing), removed when the outcome for the current
//     generation arrives (Apply), but for a rate-limited one, which sets
//     it with reason ProgressingWithRetry until the next attempt. The
//     reconciler sets it so too, with FetchFailed BusUnavailable, while
//     the bus does not take the source's fetch job.
//   - Stalled (abnormal-true): set by a failure retrying cannot fix
//     (MarkFailure), removed by any other outcome.
//   - FetchFailed, StorageOperationFailed, IncludeUnavailable, ...
//     (abnormal-true, among the kind's Conditions): set by the failure
//     naming them (MarkFailure), cleared by a successful outcome.
//   - ArtifactOutdated (abnormal-true): set, reason NewRevision (a
//     HelmChart's NewChart: the kind's Outdated), when a failure happened
//     after a new upstream revision was seen (Apply); cleared by a
//     successful outcome.
package status

import (
	"fmt"

	eventv1 "github.com/fluxcd/pkg/apis/event/v1beta1"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/watcher/internal/sourcekind"
)

// Event is a Kubernetes Event to record for the object.
type Event struct {
	// Type is corev1.EventTypeNormal, corev1.EventTypeWarning or Flux's
	// eventv1.EventTypeTrace: recorded as a Normal Event, never posted to
	// the notification-controller.
	Type    string
	Reason  string
	Message string
	// Revision and Digest are the stored artifact's, on the Events Flux
	// annotates with them (a new artifact, a recovery): posted to the
	// notification-controller as metadata.
	Revision, Digest string
}

// Event reasons Flux uses that the API module does not define.
const (
	// NewArtifactReason is the reason of the Event for a new artifact.
	NewArtifactReason = "NewArtifact"
	// ArtifactMissingReason and ArtifactVerificationFailedReason are the
	// reasons of the notices that say the stored artifact is gone or
	// corrupt, as the bus contract declares them.
	ArtifactMissingReason            = events.ArtifactMissingReason
	ArtifactVerificationFailedReason = events.ArtifactVerificationFailedReason
)

// NoChangeMessage is Flux's message for a reconcile that found the upstream
// revision unchanged.
func NoChangeMessage(revision string) string {
	return fmt.Sprintf("no changes since last reconciliation: observed revision '%s'", revision)
}

// UpToDateMessage is Flux's message for a reconcile whose stored artifact
// has the upstream revision (reason ArtifactUpToDate).
func UpToDateMessage(revision string) string {
	return fmt.Sprintf("artifact up-to-date with remote revision: '%s'", revision)
}

// GarbageCollectedMessage is Flux's message for the artifacts of a deleted
// source removed (reason GarbageCollectionSucceeded).
const GarbageCollectedMessage = "garbage collected artifacts for deleted resource"

// ProgressingMessage is the Reconciling message for a new generation.
func ProgressingMessage(observed, current int64) string {
	return fmt.Sprintf("processing object: new generation %d -> %d", observed, current)
}

// NewRevisionReason is Flux's ArtifactOutdated reason for a new upstream
// revision whose artifact could not be made (sourcekind.NewRevisionReason).
const NewRevisionReason = sourcekind.NewRevisionReason

// MarkProgressing records that the object's current generation is being
// processed: Reconciling=True, reason Progressing. Ready (Summarize) then
// reads Unknown, but for an object that was Ready with its artifact in
// storage: that one stays Ready, as with Flux.
func MarkProgressing(obj sourcekind.Object, st sourcekind.Status) {
	msg := ProgressingMessage(*st.ObservedGeneration, obj.GetGeneration())
	conditions.MarkReconciling(obj, meta.ProgressingReason, "%s", msg)
}

// MarkFailure writes a failure into the conditions it owns: its condition
// True with its reason and message (the kind's other negative conditions
// but ArtifactOutdated are cleared: they described an earlier attempt), and
// Stalled when retrying cannot help. A failure without a condition (a failed
// signature check) is written by the kind into another field.
func MarkFailure(kind sourcekind.Kind, obj sourcekind.Object, f *failure.Error) {
	for _, c := range kind.Conditions {
		if sourcekind.NegativePolarity(c) && c != f.Condition && c != sourcev1.ArtifactOutdatedCondition {
			conditions.Delete(obj, c)
		}
	}
	if f.Condition != "" {
		conditions.MarkTrue(obj, f.Condition, f.Reason, "%s", f.Error())
	}
	if f.Stalled() {
		conditions.MarkStalled(obj, f.Reason, "%s", f.Error())
	} else {
		conditions.Delete(obj, meta.StalledCondition)
	}
}

// Steady reports whether obj is steady: it has an artifact, its current
// generation is observed, no reconcile request is pending and it is Ready
// (so no condition of it fails and none is in progress). Applying an
// unchanged outcome to a steady object changes nothing in its status (but
// for an artifact URL whose advertised address changed, which the caller
// checks).
func Steady(kind sourcekind.Kind, obj sourcekind.Object) bool {
	if obj.GetArtifact() == nil || !conditions.IsReady(obj) {
		return false
	}
	st := kind.Status(obj)
	if *st.ObservedGeneration != obj.GetGeneration() {
		return false
	}
	token, requested := meta.ReconcileAnnotationValue(obj.GetAnnotations())
	return !requested || token == *st.LastHandledReconcileAt
}

// Summarize derives Ready from the other conditions, in Flux's order (see
// the package documentation). It is the only writer of Ready.
func Summarize(kind sourcekind.Kind, obj sourcekind.Object) {
	from := func(c *metav1.Condition, status metav1.ConditionStatus) {
		conditions.Set(obj, &metav1.Condition{Type: meta.ReadyCondition, Status: status, Reason: c.Reason, Message: c.Message})
	}
	if c := conditions.Get(obj, meta.StalledCondition); c != nil && c.Status == metav1.ConditionTrue {
		from(c, metav1.ConditionFalse)
		return
	}
	for _, t := range kind.Conditions {
		failing := metav1.ConditionFalse
		if sourcekind.NegativePolarity(t) {
			failing = metav1.ConditionTrue
		}
		if c := conditions.Get(obj, t); c != nil && c.Status == failing {
			from(c, metav1.ConditionFalse)
			return
		}
	}
	stored := conditions.Get(obj, sourcev1.ArtifactInStorageCondition)
	if stored != nil && stored.Status != metav1.ConditionTrue {
		stored = nil
	}
	// A new generation in progress makes Ready Unknown, but for an object
	// that was Ready with its artifact in storage: that artifact is still
	// served and is what consumers use until the new generation's outcome
	// says otherwise, so it stays Ready, as Flux's ProgressiveStatus keeps
	// a Ready=True (fluxcd/pkg runtime/reconcile). A spec written back in
	// another form (a typed client turns spec.timeout "60s" into "1m0s")
	// is a new generation too: it must not read as an outage.
	if conditions.IsReconciling(obj) && (stored == nil || !conditions.IsTrue(obj, meta.ReadyCondition)) {
		conditions.MarkUnknown(obj, meta.ReadyCondition, meta.ProgressingReason, "reconciliation in progress")
		return
	}
	if stored != nil {
		from(stored, metav1.ConditionTrue)
		return
	}
	conditions.Delete(obj, meta.ReadyCondition)
}

// Reannounce returns the new artifact's Event of a stored outcome whose
// artifact obj's status holds (digest and update time): the Event Apply
// returns for it when it stores a new digest, which the watcher writes
// before acknowledging the outcome. For a redelivered outcome that an
// earlier attempt applied, Apply finds nothing new, but that attempt may
// have ended (the watcher killed, the Event refused) before its Event was
// written: the watcher writes this one, so a new artifact's Event is
// recorded at least once.
func Reannounce(kind sourcekind.Kind, obj sourcekind.Object, eventType string, o *events.Outcome) []Event {
	prev := *kind.Status(obj).Artifact
	if eventType != events.TypeArtifactStored || o.Artifact == nil || prev == nil ||
		prev.Digest != o.Artifact.Digest || !prev.LastUpdateTime.Equal(&o.Artifact.LastUpdateTime) {
		return nil
	}
	reason, msg, own := storedCondition(kind, obj, o, prev.Revision)
	return []Event{newArtifactEvent(o, reason, msg, own)}
}

// storedCondition is the reason and message of ArtifactInStorage for an
// outcome with an artifact of revision: the kind's own (StoredCondition;
// own is true), or Succeeded with its Ready message.
func storedCondition(kind sourcekind.Kind, obj sourcekind.Object, o *events.Outcome, revision string) (reason, msg string, own bool) {
	if reason, msg := kind.StoredCondition(obj, o); reason != "" {
		return reason, msg, true
	}
	return meta.SucceededReason, kind.ReadyMessage(revision), false
}

// newArtifactEvent is the Event of a new artifact: NewArtifact with the
// outcome's message (Flux's), or the kind's own reason (a HelmChart's
// ChartPullSucceeded: own); msg and reason are the ArtifactInStorage
// condition's.
func newArtifactEvent(o *events.Outcome, reason, msg string, own bool) Event {
	m := o.EventMessage
	if m == "" {
		m = msg
	}
	r := NewArtifactReason
	if own {
		r = reason
	}
	return Event{Type: corev1.EventTypeNormal, Reason: r, Message: m, Revision: o.Artifact.Revision, Digest: o.Artifact.Digest}
}

// Apply writes an outcome of eventType (a public type such as
// events.TypeArtifactStored) into obj's status, but for Ready (see
// Summarize), and returns the Events it deserves. obj must be the live
// object with the job's UID.
func Apply(kind sourcekind.Kind, obj sourcekind.Object, eventType string, o *events.Outcome) []Event {
	st := kind.Status(obj)
	job := o.Job
	wasFailing := conditions.IsFalse(obj, meta.ReadyCondition)
	oldReady := conditions.Get(obj, meta.ReadyCondition)
	var out []Event
	for _, n := range o.Notices {
		out = append(out, Event{Type: k8sEventType(n.Warning), Reason: n.Reason, Message: n.Message})
	}

	// An outcome for an older generation than the one already observed is
	// stale: a newer job has reported since.
	if job.Object.Generation < *st.ObservedGeneration {
		return out
	}
	current := job.Object.Generation == obj.GetGeneration()

	switch eventType {
	case events.TypeArtifactStored, events.TypeArtifactUnchanged:
		if o.Artifact == nil {
			return out
		}
		prev := *st.Artifact
		stale := prev != nil && o.Artifact.LastUpdateTime.Before(&prev.LastUpdateTime)
		if !stale {
			*st.Artifact = o.Artifact.DeepCopy()
		}
		reason, msg, own := storedCondition(kind, obj, o, (*st.Artifact).Revision)
		conditions.MarkTrue(obj, sourcev1.ArtifactInStorageCondition, reason, "%s", msg)
		for _, c := range kind.Conditions {
			if sourcekind.NegativePolarity(c) {
				conditions.Delete(obj, c)
			}
		}
		conditions.Delete(obj, meta.StalledCondition)
		if current {
			kind.Observe(obj)
		}
		if v := o.Verification; eventType == events.TypeArtifactStored && kind.TracesVerification && v != nil && v.Verified {
			// Flux's trace for the signatures checked on a fetch.
			out = append(out, Event{Type: eventv1.EventTypeTrace, Reason: v.Reason, Message: v.Message})
		}
		switch {
		case eventType == events.TypeArtifactStored && !stale && (prev == nil || prev.Digest != o.Artifact.Digest):
			out = append(out, newArtifactEvent(o, reason, msg, own))
		case wasFailing:
			art := *st.Artifact
			if m := kind.Recovered(obj, art); m != "" {
				msg = m
			}
			out = append(out, Event{Type: corev1.EventTypeNormal, Reason: reason, Message: msg, Revision: art.Revision, Digest: art.Digest})
		case eventType == events.TypeArtifactUnchanged && kind.UpToDateReason != sourcev1.ArtifactUpToDateReason:
			// Flux records a no-change reconcile of a GitRepository as a
			// trace: a Normal Event (Kubernetes aggregates the repeats),
			// not posted to the notification-controller.
			out = append(out, Event{Type: eventv1.EventTypeTrace, Reason: kind.UpToDateReason, Message: NoChangeMessage(o.Revision)})
		case eventType == events.TypeArtifactUnchanged:
			// The other kinds' no-change reconciles: Flux's trace
			// ArtifactUpToDate, recorded the same way.
			out = append(out, Event{Type: eventv1.EventTypeTrace, Reason: sourcev1.ArtifactUpToDateReason,
				Message: UpToDateMessage((*st.Artifact).Revision)})
		}
	case events.TypeArtifactFailed:
		data := o.Failure
		if data == nil {
			data = &events.Failure{Condition: sourcev1.FetchFailedCondition, Reason: meta.FailedReason, Message: "unknown failure"}
		}
		f := failure.FromData(data)
		MarkFailure(kind, obj, f)
		// The stored artifact was found gone or corrupt and could not be
		// rebuilt (the upstream failed): it is no longer in storage.
		for _, n := range o.Notices {
			if n.Reason == ArtifactMissingReason || n.Reason == ArtifactVerificationFailedReason {
				conditions.MarkFalse(obj, sourcev1.ArtifactInStorageCondition, n.Reason, "%s", n.Message)
			}
		}
		// A new upstream revision was seen but its artifact could not be
		// made: the stored one is outdated (Flux's NewRevision, or the
		// kind's own reason).
		if reason, msg, ok := kind.Outdated(obj, *st.Artifact, o.Revision); ok {
			conditions.MarkTrue(obj, sourcev1.ArtifactOutdatedCondition, reason, "%s", msg)
		}
		// A throttled source's message counts down its next attempt:
		// one Event when the throttling starts, none per attempt.
		throttled := f.Handling == failure.Throttled
		if oldReady == nil || oldReady.Status != metav1.ConditionFalse || oldReady.Reason != data.Reason ||
			(oldReady.Message != data.Message && !throttled) {
			out = append(out, Event{Type: corev1.EventTypeWarning, Reason: data.Reason, Message: data.Message})
		}
	default:
		return out
	}

	kind.Record(obj, eventType, o)

	// The job is done: it handled its reconcile request, and if it was made
	// from the current generation, that generation is observed.
	if job.ReconcileToken != "" {
		*st.LastHandledReconcileAt = job.ReconcileToken
	}
	*st.ObservedGeneration = job.Object.Generation
	if current {
		conditions.Delete(obj, meta.ReconcilingCondition)
		if f := o.Failure; eventType == events.TypeArtifactFailed && f != nil && f.RetryAfterMilliseconds > 0 && !f.Stalled {
			// Rate limited: the watcher tries again when the host
			// allows, and shows it as Flux shows a reconcile it retries.
			conditions.MarkReconciling(obj, meta.ProgressingWithRetryReason, "%s", f.Message)
		}
	}
	return out
}

func k8sEventType(warning bool) string {
	if warning {
		return corev1.EventTypeWarning
	}
	return corev1.EventTypeNormal
}
