package multinodetest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
)

// hwNamespace is where overlays/ha installs Headwater.
const hwNamespace = "headwater-system"

// installHA applies overlays/ha as its users do: an S3 service of their
// own (one MinIO server on the machine, outside the nodes, as a cloud's S3
// is outside the cluster), the NATS certificates cert-manager would make,
// then kubectl apply -k of the overlay with the tests' servers allowed by
// the egress policy.
func installHA(t *testing.T) {
	t.Helper()
	env.EnsureNamespace(t, hwNamespace)
	env.S3Secret(t, hwNamespace)
	env.NATSTLSSecrets(t, hwNamespace)
	start := time.Now()
	env.Kubectl(t, "apply", "-k", env.DeployPath("overlays/ha"))
	kubetest.Eventually(t, 10*time.Minute, "every pod of overlays/ha Ready", podsReady)
	t.Logf("overlays/ha: every pod Ready %s after kubectl apply -k", time.Since(start).Round(100*time.Millisecond))
}

// podsReady is nil when every pod of Headwater's namespace is Ready (a
// Job's: Succeeded) and none is being deleted.
func podsReady(ctx context.Context) error { return env.PodsReady(ctx, hwNamespace) }

// podsByApp lists Headwater's pods by app.kubernetes.io/name, each with
// the node it runs on.
func podsByApp(ctx context.Context) (map[string][]corev1.Pod, error) {
	pods, err := env.C.Client.CoreV1().Pods(hwNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string][]corev1.Pod{}
	for _, p := range pods.Items {
		if app := p.Labels["app.kubernetes.io/name"]; app != "" && !kubetest.IsJobPod(&p) {
			out[app] = append(out[app], p)
		}
	}
	return out, nil
}
