package sourcekind

import (
	"context"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// HelmRepository adapts sourcev1.HelmRepository. A HelmRepository of type
// oci is static, as in Flux: it has no artifact, no finalizer and no
// status (its HelmCharts pull from the registry themselves).
func HelmRepository() Kind {
	return Kind{
		Name: sourcev1.HelmRepositoryKind,
		Remote: func(o Object) string {
			s := o.(*sourcev1.HelmRepository).Spec
			return RemoteKey(o, s.URL, localRef(s.SecretRef), localRef(s.CertSecretRef), s.Provider)
		},
		New:       func() Object { return &sourcev1.HelmRepository{} },
		Suspended: func(o Object) bool { return o.(*sourcev1.HelmRepository).Spec.Suspend },
		Static: func(o Object) bool {
			return o.(*sourcev1.HelmRepository).Spec.Type == sourcev1.HelmRepositoryTypeOCI
		},
		Request: func(_ context.Context, _ client.Reader, o Object, req *events.FetchRequested) (bool, error) {
			h := o.(*sourcev1.HelmRepository)
			if err := refuseCredentials("spec.url", h.Spec.URL); err != nil {
				return false, err
			}
			req.HelmRepository = h.Spec.DeepCopy()
			// The artifact is the index as served: nothing in the spec
			// changes it but what the server sends.
			return false, nil
		},
		Observe: func(o Object) {
			h := o.(*sourcev1.HelmRepository)
			if a := h.Status.Artifact; a != nil {
				// The index's URL on the artifact server (Flux points at an
				// index.yaml symlink to it; Headwater's one pointer per
				// source is latest.tar.gz, see docs/design.md).
				h.Status.URL = a.URL
			}
		},
		ReadyFormat:    "stored artifact: revision '%s'",
		UpToDateReason: sourcev1.ArtifactUpToDateReason,
		Status: func(o Object) Status {
			st := &o.(*sourcev1.HelmRepository).Status
			return Status{&st.ObservedGeneration, &st.Artifact, &st.LastHandledReconcileAt}
		},
		// Flux's order (helmRepositoryReadyCondition).
		Conditions: []string{
			sourcev1.StorageOperationFailedCondition,
			sourcev1.FetchFailedCondition,
			sourcev1.ArtifactOutdatedCondition,
		},
	}
}
