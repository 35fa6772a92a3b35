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
		Name: sourcev1.BucketKind,
		Remote: func(o Object) string {
			s := o.(*sourcev1.Bucket).Spec
			return RemoteKey(o, s.Provider+"|"+s.Endpoint+"|"+s.BucketName+"|"+s.Region+"|"+s.Prefix,
				localRef(s.SecretRef), localRef(s.CertSecretRef), localRef(s.ProxySecretRef), s.ServiceAccountName)
		},
		New:       func() Object { return &sourcev1.Bucket{} },
		Suspended: func(o Object) bool { return o.(*sourcev1.Bucket).Spec.Suspend },
		Request: func(_ context.Context, _ client.Reader, o Object, req *events.FetchRequested) (bool, error) {
			b := o.(*sourcev1.Bucket)
			if err := refuseCredentials("spec.endpoint", b.Spec.Endpoint); err != nil {
				return false, err
			}
			req.Bucket = b.Spec.DeepCopy()
			return b.Status.Artifact != nil && !reflect.DeepEqual(b.Spec.Ignore, b.Status.ObservedIgnore), nil
		},
		Observe: func(o Object) {
			b := o.(*sourcev1.Bucket)
			b.Status.ObservedIgnore = b.Spec.Ignore
			if a := b.Status.Artifact; a != nil && a.URL != "" {
				// Flux's status.url: the stable URL of the latest artifact.
				b.Status.URL = latestURL(a.URL)
			}
		},
		ReadyFormat:    "stored artifact: revision '%s'",
		UpToDateReason: sourcev1.ArtifactUpToDateReason,
		Status: func(o Object) Status {
			st := &o.(*sourcev1.Bucket).Status
			return Status{&st.ObservedGeneration, &st.Artifact, &st.LastHandledReconcileAt}
		},
		// Flux's order (bucketReadyCondition).
		Conditions: []string{
			sourcev1.StorageOperationFailedCondition,
			sourcev1.FetchFailedCondition,
			sourcev1.ArtifactOutdatedCondition,
		},
	}
}

// latestURL replaces the file name of an artifact URL with the latest pointer.
func latestURL(artifactURL string) string {
	dir, _ := path.Split(artifactURL)
	return dir + storage.LatestName
}
