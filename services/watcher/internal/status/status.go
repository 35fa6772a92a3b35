// Package status turns what the bus reports into a source's status and its
// Kubernetes Events, the way Flux's source-controller writes them.
//
// Conditions written here:
//
//   - Ready (summary; normal polarity): True/Succeeded with "stored artifact
//     for revision '<rev>'" after a stored or unchanged outcome; False with
//     the failure's reason and message after a failure; Unknown/Progressing
//     while a new generation is being processed.
//   - ArtifactInStorage (normal polarity): True once an artifact is stored.
//   - Reconciling (abnormal-true): set while a new generation is processed,
//     removed when the outcome for the current generation arrives.
//   - Stalled (abnormal-true): set for failures retrying cannot fix.
//   - FetchFailed, StorageOperationFailed, ... (abnormal-true): set by a
//     failure outcome naming them, cleared by a successful one.
//   - ArtifactOutdated (abnormal-true): set, reason NewRevision, when a
//     failure happened after a new upstream revision was seen; cleared by a
//     successful outcome.
package status

import (
	"fmt"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/services/watcher/internal/source"
)

// Event is a Kubernetes Event to record for the object.
type Event struct {
	// Type is corev1.EventTypeNormal or corev1.EventTypeWarning.
	Type    string
	Reason  string
	Message string
}

// Event reasons Flux uses that the API module does not define.
const (
	// NewArtifactReason is the reason of the Event for a new artifact.
	NewArtifactReason = "NewArtifact"
)

// ProgressingMessage is the Reconciling message for a new generation.
func ProgressingMessage(observed, current int64) string {
	return fmt.Sprintf("processing object: new generation %d -> %d", observed, current)
}

// MarkProgressing records that the object's current generation is being
// processed: Reconciling=True and Ready=Unknown, both reason Progressing.
func MarkProgressing(obj source.Object, st source.Status) {
	msg := ProgressingMessage(*st.ObservedGeneration, obj.GetGeneration())
	conditions.MarkReconciling(obj, meta.ProgressingReason, "%s", msg)
	conditions.MarkUnknown(obj, meta.ReadyCondition, meta.ProgressingReason, "reconciliation in progress")
}

// Apply writes an outcome of eventType (a public type such as
// events.TypeArtifactStored) into obj's status and returns the Events it
// deserves. obj must be the live object with the job's UID.
func Apply(kind source.Kind, obj source.Object, eventType string, o *events.Outcome) []Event {
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
		msg := kind.ReadyMessage((*st.Artifact).Revision)
		conditions.MarkTrue(obj, sourcev1.ArtifactInStorageCondition, meta.SucceededReason, "%s", msg)
		for _, c := range kind.FailureConditions {
			conditions.Delete(obj, c)
		}
		conditions.Delete(obj, meta.StalledCondition)
		conditions.MarkTrue(obj, meta.ReadyCondition, meta.SucceededReason, "%s", msg)
		if current && kind.Observe != nil {
			kind.Observe(obj)
		}
		switch {
		case eventType == events.TypeArtifactStored && !stale && (prev == nil || prev.Digest != o.Artifact.Digest):
			m := o.EventMessage
			if m == "" {
				m = msg
			}
			out = append(out, Event{Type: corev1.EventTypeNormal, Reason: NewArtifactReason, Message: m})
		case wasFailing:
			out = append(out, Event{Type: corev1.EventTypeNormal, Reason: meta.SucceededReason, Message: msg})
		}
	case events.TypeArtifactFailed:
		f := o.Failure
		if f == nil {
			f = &events.Failure{Condition: sourcev1.FetchFailedCondition, Reason: meta.FailedReason, Message: "unknown failure"}
		}
		if f.Condition != "" {
			conditions.MarkTrue(obj, f.Condition, f.Reason, "%s", f.Message)
		} else {
			// A failure reported by another field (a failed verification)
			// means the fetch itself worked.
			conditions.Delete(obj, sourcev1.FetchFailedCondition)
		}
		conditions.MarkFalse(obj, meta.ReadyCondition, f.Reason, "%s", f.Message)
		// A new upstream revision was seen but its artifact could not be
		// made: the stored one is outdated (Flux's NewRevision).
		if prev := *st.Artifact; o.Revision != "" && (prev == nil || prev.Revision != o.Revision) {
			conditions.MarkTrue(obj, sourcev1.ArtifactOutdatedCondition, "NewRevision", "new upstream revision '%s'", o.Revision)
		}
		if f.Stalled {
			conditions.MarkStalled(obj, f.Reason, "%s", f.Message)
		} else {
			conditions.Delete(obj, meta.StalledCondition)
		}
		if oldReady == nil || oldReady.Status != "False" || oldReady.Reason != f.Reason || oldReady.Message != f.Message {
			out = append(out, Event{Type: corev1.EventTypeWarning, Reason: f.Reason, Message: f.Message})
		}
	default:
		return out
	}

	if kind.Record != nil {
		kind.Record(obj, eventType, o)
	}

	// The job is done: it handled its reconcile request, and if it was made
	// from the current generation, that generation is observed.
	if job.ReconcileToken != "" {
		*st.LastHandledReconcileAt = job.ReconcileToken
	}
	*st.ObservedGeneration = job.Object.Generation
	if current {
		conditions.Delete(obj, meta.ReconcilingCondition)
	}
	return out
}

func k8sEventType(warning bool) string {
	if warning {
		return corev1.EventTypeWarning
	}
	return corev1.EventTypeNormal
}
