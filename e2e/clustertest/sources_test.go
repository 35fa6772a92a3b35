package clustertest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	fluxmeta "github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
)

// source is what every Flux source kind has in common.
type source interface {
	ctrlclient.Object
	GetConditions() []metav1.Condition
	GetArtifact() *fluxmeta.Artifact
}

// waitSourceReady waits until obj is Ready with an artifact and returns
// the artifact.
func waitSourceReady(t *testing.T, cl ctrlclient.Client, obj source, timeout time.Duration) *fluxmeta.Artifact {
	t.Helper()
	key := ctrlclient.ObjectKeyFromObject(obj)
	kubetest.Eventually(t, timeout, fmt.Sprintf("%T %s Ready", obj, key), func(ctx context.Context) error {
		if err := cl.Get(ctx, key, obj); err != nil {
			return err
		}
		ready := apimeta.FindStatusCondition(obj.GetConditions(), "Ready")
		if ready == nil || ready.Status != metav1.ConditionTrue {
			return fmt.Errorf("not Ready: %+v", ready)
		}
		if obj.GetArtifact() == nil {
			return fmt.Errorf("no artifact")
		}
		return nil
	})
	return obj.GetArtifact()
}

// fetchArtifact downloads an artifact by its status URL from the node
// (the Service's name answered by its cluster IP, as cluster DNS would)
// and returns its sha256 digest.
func fetchArtifact(ctx context.Context, a *fluxmeta.Artifact) (string, error) {
	u, err := url.Parse(a.URL)
	if err != nil {
		return "", err
	}
	svc, err := env.C.ServiceURL(ctx, ns, "source-controller", "")
	if err != nil {
		return "", err
	}
	base, _ := url.Parse(svc)
	u.Host = base.Host
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", err
	}
	// A client of its own, its connection closed after the download: the
	// tests that download every 100 ms leave no idle connections behind.
	hc := env.C.HTTPClient()
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", a.URL, resp.Status)
	}
	h := sha256.New()
	if _, err := io.Copy(h, resp.Body); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// inClusterS3 is a client of the in-cluster MinIO (components/minio) with
// the credentials of the Secret headwater-s3, reached through the node,
// and the bucket Headwater stores artifacts in.
func inClusterS3(t *testing.T) (*minio.Client, string) {
	t.Helper()
	ctx := context.Background()
	s, err := env.C.Client.CoreV1().Secrets(ns).Get(ctx, "headwater-s3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := env.C.Client.CoreV1().Services(ns).Get(ctx, "minio", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mc, err := minio.New(fmt.Sprintf("%s:9000", svc.Spec.ClusterIP), &minio.Options{
		Creds:     credentials.NewStaticV4(string(s.Data["accesskey"]), string(s.Data["secretkey"]), ""),
		Transport: &http.Transport{DialContext: env.C.DialContext},
	})
	if err != nil {
		t.Fatal(err)
	}
	return mc, string(s.Data["bucket"])
}

// events returns the Events of the object name in namespace with reason
// (any reason when empty).
func events(t *testing.T, namespace, name, reason string) []corev1.Event {
	t.Helper()
	selector := "involvedObject.name=" + name
	if reason != "" {
		selector += ",reason=" + reason
	}
	list, err := env.C.Client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// requestReconcile asks for a reconcile at once, as `flux reconcile` does.
func requestReconcile(t *testing.T, cl ctrlclient.Client, obj ctrlclient.Object) {
	t.Helper()
	patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, fluxmeta.ReconcileRequestAnnotation, time.Now().Format(time.RFC3339Nano)))
	if err := cl.Patch(context.Background(), obj, ctrlclient.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}
}

var _ source = &sourcev1.GitRepository{}
