package generator

import (
	"context"
	"fmt"

	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/headwater-gitops/headwater/pkg/events"
)

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
	if err := r.writer().RemoveFinalizer(ctx, gen, swv1beta1.Finalizer); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("remove finalizer: %w", err))
	}
	logr.FromContextOrDiscard(ctx).Info("stored artifacts scheduled for deletion; finalizer removed", "outputs", len(previous))
	return nil
}
