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
		Name:           sourcev1.HelmRepositoryKind,
		ReadyFormat:    "stored artifact: revision '%s'",
		UpToDateReason: sourcev1.ArtifactUpToDateReason,
		// Flux's order (helmRepositoryReadyCondition).
		Conditions: []string{
			sourcev1.StorageOperationFailedCondition,
			sourcev1.FetchFailedCondition,
			sourcev1.ArtifactOutdatedCondition,
		},
		Adapter: Adapt(Funcs[*sourcev1.HelmRepository]{
			New: func() *sourcev1.HelmRepository { return &sourcev1.HelmRepository{} },
			Status: func(h *sourcev1.HelmRepository) Status {
				return Status{&h.Status.ObservedGeneration, &h.Status.Artifact, &h.Status.LastHandledReconcileAt}
			},
			Suspended: func(h *sourcev1.HelmRepository) bool { return h.Spec.Suspend },
			Static:    func(h *sourcev1.HelmRepository) bool { return h.Spec.Type == sourcev1.HelmRepositoryTypeOCI },
			Remote: func(h *sourcev1.HelmRepository) string {
				s := h.Spec
				return RemoteKey(h, s.URL, localRef(s.SecretRef), localRef(s.CertSecretRef), s.Provider)
			},
			Request: func(_ context.Context, _ client.Reader, h *sourcev1.HelmRepository, req *events.FetchRequested) (bool, error) {
				if err := refuseCredentials("spec.url", h.Spec.URL); err != nil {
					return false, err
				}
				req.HelmRepository = h.Spec.DeepCopy()
				// The artifact is the index as served: nothing in the spec
				// changes it but what the server sends.
				return false, nil
			},
			Observe: func(h *sourcev1.HelmRepository) {
				if a := h.Status.Artifact; a != nil {
					// The index's URL on the artifact server (Flux points at an
					// index.yaml symlink to it; Headwater's one pointer per
					// source is latest.tar.gz, see docs/design.md).
					h.Status.URL = a.URL
				}
			},
		}),
	}
}
