package sourcekind

import (
	"context"
	"fmt"
	"reflect"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// OCIRepository adapts sourcev1.OCIRepository.
func OCIRepository() Kind {
	return Kind{
		Name:           sourcev1.OCIRepositoryKind,
		ReadyFormat:    "stored artifact for digest '%s'",
		UpToDateReason: sourcev1.ArtifactUpToDateReason,
		// Flux's order (ociRepositoryReadyCondition), but, as for a
		// GitRepository, a failed verification is named before the
		// outdated artifact it causes.
		Conditions: []string{
			sourcev1.StorageOperationFailedCondition,
			sourcev1.FetchFailedCondition,
			sourcev1.SourceVerifiedCondition,
			sourcev1.ArtifactOutdatedCondition,
		},
		Adapter: Adapt(Funcs[*sourcev1.OCIRepository]{
			New: func() *sourcev1.OCIRepository { return &sourcev1.OCIRepository{} },
			Status: func(r *sourcev1.OCIRepository) Status {
				return Status{&r.Status.ObservedGeneration, &r.Status.Artifact, &r.Status.LastHandledReconcileAt}
			},
			Suspended: func(r *sourcev1.OCIRepository) bool { return r.Spec.Suspend },
			Remote: func(r *sourcev1.OCIRepository) string {
				s := r.Spec
				return RemoteKey(r, s.URL, localRef(s.SecretRef), localRef(s.CertSecretRef), localRef(s.ProxySecretRef),
					s.Provider, s.ServiceAccountName)
			},
			Request: func(_ context.Context, _ client.Reader, r *sourcev1.OCIRepository, req *events.FetchRequested) (bool, error) {
				if err := refuseCredentials("spec.url", r.Spec.URL); err != nil {
					return false, err
				}
				req.OCIRepository = r.Spec.DeepCopy()
				// An artifact not verified as spec.verify asks is fetched and
				// verified again, as Flux verifies again after a failure.
				unverified := r.Spec.Verify != nil && !conditions.IsTrue(r, sourcev1.SourceVerifiedCondition)
				return r.Status.Artifact != nil && (ociContentConfigChanged(r) || unverified), nil
			},
			Observe: func(r *sourcev1.OCIRepository) {
				r.Status.ObservedIgnore = r.Spec.Ignore
				r.Status.ObservedLayerSelector = r.Spec.LayerSelector.DeepCopy()
				if a := r.Status.Artifact; a != nil && a.URL != "" {
					// Flux's status.url: the stable URL of the latest artifact.
					r.Status.URL = latestURL(a.URL)
				}
			},
			Record:    ociRecord,
			Recovered: ociRecovered,
		}),
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

// ociRecord writes SourceVerified from an outcome.
//
// SourceVerified (normal polarity) is True with Flux's message once the
// signature of the fetched revision verified, False with reason
// VerificationError when it did not, and absent when spec.verify is unset.
func ociRecord(r *sourcev1.OCIRepository, _ string, out *events.Outcome) {
	if r.Spec.Verify == nil {
		conditions.Delete(r, sourcev1.SourceVerifiedCondition)
		return
	}
	switch v := out.Verification; {
	case v == nil:
	case v.Verified:
		conditions.MarkTrue(r, sourcev1.SourceVerifiedCondition, v.Reason, "%s", v.Message)
	default:
		conditions.MarkFalse(r, sourcev1.SourceVerifiedCondition, v.Reason, "%s", v.Message)
	}
}

// ociRecovered is Flux's message for an OCIRepository's artifact: its
// revision and spec.url, and the origin source and revision when the
// artifact's metadata has both.
func ociRecovered(r *sourcev1.OCIRepository, art *meta.Artifact) string {
	msg := fmt.Sprintf("stored artifact with revision '%s' from '%s'", art.Revision, r.Spec.URL)
	if src, rev := art.Metadata["org.opencontainers.image.source"], art.Metadata["org.opencontainers.image.revision"]; src != "" && rev != "" {
		msg = fmt.Sprintf("%s, origin source '%s', origin revision '%s'", msg, src, rev)
	}
	return msg
}
