package source

import (
	"context"
	"reflect"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// OCIRepository adapts sourcev1.OCIRepository.
func OCIRepository() Kind {
	return Kind{
		Name:      sourcev1.OCIRepositoryKind,
		New:       func() Object { return &sourcev1.OCIRepository{} },
		Suspended: func(o Object) bool { return o.(*sourcev1.OCIRepository).Spec.Suspend },
		Request: func(_ context.Context, _ client.Reader, o Object, req *events.FetchRequested) (bool, error) {
			r := o.(*sourcev1.OCIRepository)
			req.OCIRepository = r.Spec.DeepCopy()
			return r.Status.Artifact != nil && ociContentConfigChanged(r), nil
		},
		Observe: func(o Object) {
			r := o.(*sourcev1.OCIRepository)
			r.Status.ObservedIgnore = r.Spec.Ignore
			r.Status.ObservedLayerSelector = r.Spec.LayerSelector.DeepCopy()
			if a := r.Status.Artifact; a != nil && a.URL != "" {
				// Flux's status.url: the stable URL of the latest artifact.
				r.Status.URL = latestURL(a.URL)
			}
		},
		ReadyFormat:    "stored artifact for digest '%s'",
		UpToDateReason: sourcev1.ArtifactUpToDateReason,
		Status: func(o Object) Status {
			st := &o.(*sourcev1.OCIRepository).Status
			return Status{&st.ObservedGeneration, &st.Artifact, &st.LastHandledReconcileAt}
		},
		// Flux's order (ociRepositoryReadyCondition). SourceVerified is
		// never written: spec.verify stalls the source (not supported yet).
		Conditions: []string{
			sourcev1.StorageOperationFailedCondition,
			sourcev1.FetchFailedCondition,
			sourcev1.ArtifactOutdatedCondition,
			sourcev1.SourceVerifiedCondition,
		},
	}
}

// ociContentConfigChanged reports whether the stored artifact was built
// with other content-affecting fields (spec.ignore, spec.layerSelector)
// than the spec has now, as Flux's status.observedIgnore and
// status.observedLayerSelector record them.
func ociContentConfigChanged(r *sourcev1.OCIRepository) bool {
	return !reflect.DeepEqual(r.Spec.Ignore, r.Status.ObservedIgnore) ||
		!reflect.DeepEqual(r.Spec.LayerSelector, r.Status.ObservedLayerSelector)
}
