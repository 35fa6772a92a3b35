package generator

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fluxcd/pkg/apis/meta"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/services/watcher/internal/externalartifact"
)

// HandleOutcome applies the public event of a generator's job (its seal
// already checked by the results consumer): a stored outcome publishes
// every output as an ExternalArtifact, deletes those of outputs the spec
// no longer has and writes the status (inventory, observedSourcesDigest,
// lastHandledReconcileAt, Ready True), with a NewArtifact Event naming the
// outputs whose content changed (or a Succeeded Event for a recovery,
// none when nothing changed); a failed one sets Ready False (Stalled
// when only a spec change helps) with a Warning Event when the failure is
// new, and leaves the ExternalArtifacts, and the artifacts they serve,
// alone. An outcome for a deleted generator, an older generation, or
// sources that have changed since its job was made is ignored: the newer
// job's outcome will be applied. Its error is the API server's, and makes
// the consumer try again.
func (r *Reconciler) HandleOutcome(ctx context.Context, eventType string, o *events.Outcome) error {
	log := logr.FromContextOrDiscard(ctx)
	if eventType != events.TypeArtifactStored && eventType != events.TypeArtifactFailed {
		return nil
	}
	key := types.NamespacedName{Namespace: o.Job.Object.Namespace, Name: o.Job.Object.Name}
	gen := &swv1beta1.ArtifactGenerator{}
	err := r.Client.Get(ctx, key, gen)
	if apierrors.IsNotFound(err) {
		err = r.Live.Get(ctx, key, gen)
	}
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get ArtifactGenerator %s: %w", key, err)
	}
	if string(gen.UID) != o.Job.Object.UID || gen.Generation != o.Job.Object.Generation || !gen.DeletionTimestamp.IsZero() {
		log.V(1).Info("ignoring the outcome of an earlier generator or generation")
		return nil
	}
	if r.Owns != nil && !r.Owns(gen) {
		log.V(1).Info("ignoring the outcome of a generator of another shard")
		return nil
	}
	srcs, err := r.resolve(ctx, gen)
	var p *problem
	switch {
	case errors.As(err, &p):
		// The reconcile that follows the sources' change reports it.
		r.Metrics.count("stale")
		return nil
	case err != nil:
		return err
	case srcs.digest != o.Revision:
		r.Metrics.count("stale")
		log.V(1).Info("ignoring the outcome for sources since changed", "job", o.Revision, "now", srcs.digest)
		return nil
	}
	if eventType == events.TypeArtifactFailed {
		return r.applyFailure(ctx, gen, o)
	}
	return r.applyStored(ctx, gen, o)
}

// applyStored publishes the outputs and writes the status.
func (r *Reconciler) applyStored(ctx context.Context, gen *swv1beta1.ArtifactGenerator, o *events.Outcome) error {
	log := logr.FromContextOrDiscard(ctx)
	labels := map[string]string{swv1beta1.ArtifactGeneratorLabel: string(gen.UID)}
	var annotations map[string]string
	if cm := gen.Spec.CommonMetadata; cm != nil {
		for k, v := range cm.Labels {
			labels[k] = v
		}
		annotations = cm.Annotations
	}
	var changed []string
	for _, out := range o.Outputs {
		art := out.Artifact
		_, change, err := r.Writer.Write(ctx, gen, externalartifact.Output{Name: out.Name, Artifact: &art,
			Ready: externalartifact.Stored(&art), Labels: outputLabels(labels, out.Labels), Annotations: annotations})
		if errors.Is(err, externalartifact.ErrForeign) {
			r.Metrics.count("failed")
			return r.applyFailure(ctx, gen, &events.Outcome{Job: o.Job, Failure: &events.Failure{
				Reason: swv1beta1.ValidationFailedReason, Message: err.Error(), Stalled: true}})
		}
		if err != nil {
			return err
		}
		if out.Changed || change == externalartifact.Created {
			changed = append(changed, fmt.Sprintf("%s@%s", out.Name, art.Revision))
		}
	}
	keep := map[string]bool{}
	for _, out := range o.Outputs {
		keep[out.Name] = true
	}
	for _, ref := range gen.Status.Inventory {
		if keep[ref.Name] {
			continue
		}
		if err := r.Writer.Delete(ctx, gen, ref.Name); err != nil && !errors.Is(err, externalartifact.ErrForeign) {
			return err
		}
		log.Info("deleted ExternalArtifact no longer generated", "name", ref.Name)
	}
	msg := fmt.Sprintf("reconciliation succeeded, generated %d artifact(s)", len(o.Outputs))
	old := apimeta.FindStatusCondition(gen.Status.Conditions, meta.ReadyCondition)
	recovered := old != nil && old.Status == metav1.ConditionFalse
	err := r.patchStatus(ctx, gen, func(g *swv1beta1.ArtifactGenerator) {
		g.Status.Inventory = inventory(g.Namespace, o.Outputs)
		g.Status.ObservedSourcesDigest = o.Revision
		if o.Job.ReconcileToken != "" {
			g.Status.LastHandledReconcileAt = o.Job.ReconcileToken
		}
		setCondition(g, meta.ReadyCondition, metav1.ConditionTrue, meta.SucceededReason, msg)
		apimeta.RemoveStatusCondition(&g.Status.Conditions, meta.ReconcilingCondition)
		apimeta.RemoveStatusCondition(&g.Status.Conditions, meta.StalledCondition)
	})
	if err != nil {
		return err
	}
	r.Metrics.count("stored")
	if len(changed) > 0 {
		r.event(gen, corev1.EventTypeNormal, "NewArtifact", "stored artifacts: "+strings.Join(changed, ", "))
		log.Info("artifacts generated", "changed", changed, "outputs", len(o.Outputs))
	} else if recovered {
		// A recovery is a change worth an Event; an outcome that changed
		// nothing records none.
		r.event(gen, corev1.EventTypeNormal, meta.SucceededReason, msg)
	}
	return nil
}

// applyFailure writes a job's failure into the status.
func (r *Reconciler) applyFailure(ctx context.Context, gen *swv1beta1.ArtifactGenerator, o *events.Outcome) error {
	f := o.Failure
	if f == nil {
		f = &events.Failure{Reason: meta.BuildFailedReason, Message: "the job failed without saying why"}
	}
	if f.Retrying {
		// The bus tries it again: not the job's last word.
		return nil
	}
	old := apimeta.FindStatusCondition(gen.Status.Conditions, meta.ReadyCondition)
	isNew := old == nil || old.Status != metav1.ConditionFalse || old.Reason != f.Reason || old.Message != f.Message
	err := r.patchStatus(ctx, gen, func(g *swv1beta1.ArtifactGenerator) {
		setCondition(g, meta.ReadyCondition, metav1.ConditionFalse, f.Reason, f.Message)
		apimeta.RemoveStatusCondition(&g.Status.Conditions, meta.ReconcilingCondition)
		if f.Stalled {
			setCondition(g, meta.StalledCondition, metav1.ConditionTrue, f.Reason, f.Message)
		}
		if o.Job.ReconcileToken != "" {
			g.Status.LastHandledReconcileAt = o.Job.ReconcileToken
		}
	})
	if err != nil {
		return err
	}
	r.Metrics.count("failed")
	if isNew {
		r.event(gen, corev1.EventTypeWarning, f.Reason, f.Message)
		logr.FromContextOrDiscard(ctx).Info("generating artifacts failed", "reason", f.Reason, "message", f.Message, "stalled", f.Stalled)
	}
	return nil
}

// outputLabels are an output's labels: its pathPattern captures, then the
// generator's common labels and its own label, which take precedence.
func outputLabels(common, captures map[string]string) map[string]string {
	if len(captures) == 0 {
		return common
	}
	out := make(map[string]string, len(common)+len(captures))
	for k, v := range captures {
		out[k] = v
	}
	for k, v := range common {
		out[k] = v
	}
	return out
}
