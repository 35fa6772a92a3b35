package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	"github.com/fluxcd/pkg/runtime/jitter"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/watcher/internal/sourcekind"
	"github.com/headwater-gitops/headwater/services/watcher/internal/status"
)

// BusUnavailableReason is the reason of FetchFailed (and so of Ready=False)
// for a source whose fetch job the bus would not take: NATS is down or
// unreachable, or JetStream has lost the quorum of the fetch stream. It is
// Headwater's: Flux has no bus.
const BusUnavailableReason = "BusUnavailable"

// unpublished records that obj's fetch job could not be published (err,
// the bus's answer) the way Flux records a reconcile that failed while
// the artifact stays: FetchFailed=True and Ready=False with
// BusUnavailableReason and a message that names the bus and what to look
// at, Reconciling=True with reason ProgressingWithRetry (the watcher
// retries), status.artifact kept (consumers read it, not Ready), and one
// Warning Event.
//
// It writes on the transition only, with the one Event: once the source
// says so, the retries (controller-runtime's backoff, up to 16 minutes
// apart) write nothing more, but for a new reconcile request, which it
// records as handled (as Flux records a failed reconcile's), so that
// `flux reconcile` returns with the message instead of waiting. The job's
// outcome, once the bus takes it again, clears FetchFailed and
// Reconciling (status.Apply) and records the recovery's Event.
//
// The reconcile is retried after RequeueDependency (30 s by default,
// jittered), not on controller-runtime's backoff for errors, which
// doubles up to 16 minutes: a source is fresh again at most that long
// after the bus is back, however long it was gone.
func (r *Reconciler) unpublished(ctx context.Context, obj sourcekind.Object, err error) (ctrl.Result, error) {
	f := busUnavailable(r.Kind.Name, obj, err)
	wrote, news := false, false
	perr := status.Patch(ctx, r.Client, r.Live, r.Kind, obj, func(o sourcekind.Object) bool {
		st := r.Kind.Status(o)
		token, requested := meta.ReconcileAnnotationValue(o.GetAnnotations())
		newRequest := requested && *st.LastHandledReconcileAt != token
		news = !said(o)
		wrote = news || newRequest
		if !wrote {
			return false
		}
		status.MarkFailure(r.Kind, o, f)
		conditions.MarkReconciling(o, meta.ProgressingWithRetryReason, "%s", f.Error())
		if newRequest {
			*st.LastHandledReconcileAt = token
		}
		return true
	})
	logger := log.FromContext(ctx)
	switch {
	case perr != nil:
		// The next attempt writes it: the Event waits for the write.
		logger.Error(perr, "recording that the bus does not take the fetch job failed")
	case wrote:
		logger.Error(err, "fetch job not published: the source keeps its artifact and says why", "reason", f.Reason)
		if news && r.Recorder != nil {
			r.Recorder.Eventf(obj, nil, corev1.EventTypeWarning, f.Reason, "Reconcile", "%s", f.Error())
		}
	default:
		logger.V(1).Info("fetch job not published", "error", err.Error())
	}
	after := r.RequeueDependency
	if after <= 0 {
		after = defaultBusRetry
	}
	return ctrl.Result{RequeueAfter: jitter.JitteredIntervalDuration(after)}, nil
}

// defaultBusRetry is how soon a fetch job the bus refused is tried again
// when the reconciler has no RequeueDependency.
const defaultBusRetry = 30 * time.Second

// said reports whether obj already says its fetch job waits for the bus.
func said(obj sourcekind.Object) bool {
	c := conditions.Get(obj, sourcev1.FetchFailedCondition)
	return c != nil && c.Status == metav1.ConditionTrue && c.Reason == BusUnavailableReason
}

// busUnavailable is the failure of a fetch job the bus did not take: its
// message says what failed, what the source keeps and where to look.
func busUnavailable(kind string, obj sourcekind.Object, err error) *failure.Error {
	keeps := "it has no artifact yet"
	if a := obj.GetArtifact(); a != nil {
		keeps = fmt.Sprintf("it keeps serving its artifact for revision '%s'", a.Revision)
	}
	return failure.New(failure.Transient, sourcev1.FetchFailedCondition, BusUnavailableReason,
		"the fetch job could not be published to NATS JetStream (stream %s, subject %s): %w; "+
			"%s until the bus takes jobs again: check the NATS servers (their JetStream quorum: /jsz on the monitoring port 8222) "+
			"and the services' headwater_bus_ready",
		events.FetchStream, events.FetchSubject(kind), err, keeps)
}
