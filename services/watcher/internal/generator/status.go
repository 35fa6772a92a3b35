package generator

import (
	"context"
	"sort"
	"strings"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/jitter"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/services/watcher/internal/patch"
)

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

// patchStatus writes what mutate does to gen's status through the
// watcher's writer, reading gen live and mutating again after a conflict
// (patch.Retry). Nothing is written when nothing changed.
func (r *Reconciler) patchStatus(ctx context.Context, gen *swv1beta1.ArtifactGenerator, mutate func(*swv1beta1.ArtifactGenerator)) error {
	return r.writer().Status(ctx, gen, patch.Options{OnConflict: patch.Retry}, func() bool {
		mutate(gen)
		return true
	})
}

// writer is the watcher's writer of generators' status and finalizers.
func (r *Reconciler) writer() patch.Writer { return patch.Writer{Client: r.Client, Live: r.Live} }

// setCondition sets a condition for the generator's generation.
func setCondition(g *swv1beta1.ArtifactGenerator, typ string, status metav1.ConditionStatus, reason, message string) {
	apimeta.SetStatusCondition(&g.Status.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason,
		Message: message, ObservedGeneration: g.Generation})
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
