package sourcekind

import (
	"context"
	"path"
	"reflect"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// Bucket adapts sourcev1.Bucket.
func Bucket() Kind {
	return Kind{
		Name:           sourcev1.BucketKind,
		ReadyFormat:    "stored artifact: revision '%s'",
		UpToDateReason: sourcev1.ArtifactUpToDateReason,
		// Flux's order (bucketReadyCondition).
		Conditions: []string{
			sourcev1.StorageOperationFailedCondition,
			sourcev1.FetchFailedCondition,
			sourcev1.ArtifactOutdatedCondition,
		},
		Adapter: Adapt(Funcs[*sourcev1.Bucket]{
			New: func() *sourcev1.Bucket { return &sourcev1.Bucket{} },
			Status: func(b *sourcev1.Bucket) Status {
				return Status{&b.Status.ObservedGeneration, &b.Status.Artifact, &b.Status.LastHandledReconcileAt}
			},
			Suspended: func(b *sourcev1.Bucket) bool { return b.Spec.Suspend },
			Remote: func(b *sourcev1.Bucket) string {
				s := b.Spec
				return RemoteKey(b, s.Provider+"|"+s.Endpoint+"|"+s.BucketName+"|"+s.Region+"|"+s.Prefix,
					localRef(s.SecretRef), localRef(s.CertSecretRef), localRef(s.ProxySecretRef), s.ServiceAccountName)
			},
			Request: func(_ context.Context, _ client.Reader, b *sourcev1.Bucket, req *events.FetchRequested) (bool, error) {
				if err := refuseCredentials("spec.endpoint", b.Spec.Endpoint); err != nil {
					return false, err
				}
				req.Bucket = b.Spec.DeepCopy()
				return b.Status.Artifact != nil && !reflect.DeepEqual(b.Spec.Ignore, b.Status.ObservedIgnore), nil
			},
			Observe: func(b *sourcev1.Bucket) {
				b.Status.ObservedIgnore = b.Spec.Ignore
				if a := b.Status.Artifact; a != nil && a.URL != "" {
					// Flux's status.url: the stable URL of the latest artifact.
					b.Status.URL = latestURL(a.URL)
				}
			},
		}),
	}
}

// latestURL replaces the file name of an artifact URL with the latest pointer.
func latestURL(artifactURL string) string {
	dir, _ := path.Split(artifactURL)
	return dir + storage.LatestName
}
