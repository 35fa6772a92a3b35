package multinodetest

import (
	"context"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/testsupport/miniotest"
	"github.com/headwater-gitops/headwater/testsupport/testca"
)

// hwNamespace is where overlays/ha installs Headwater.
const hwNamespace = "headwater-system"

// client is a controller-runtime client of the cluster that knows the
// Flux source kinds.
func client(t *testing.T) ctrlclient.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := sourcev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cl, err := ctrlclient.New(env.c.Config, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func ensureNamespace(t *testing.T, name string) {
	t.Helper()
	_, err := env.c.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// installHA applies overlays/ha as its users do: an S3
// service of their own (one MinIO server on the machine, outside the
// nodes, as a cloud's S3 is outside the cluster), the NATS certificates
// cert-manager would make, then kubectl apply -k.
func installHA(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	ensureNamespace(t, hwNamespace)
	srv, err := miniotest.StartOn(t.TempDir(), env.c.HostIP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	s3 := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "headwater-s3", Namespace: hwNamespace},
		StringData: map[string]string{
			"endpoint": "http://" + srv.Endpoint, "bucket": "headwater",
			"accesskey": srv.AccessKey, "secretkey": srv.SecretKey,
		},
	}
	if _, err := env.c.Client.CoreV1().Secrets(hwNamespace).Create(ctx, s3, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ca, err := testca.New("nats")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"nats", "nats." + hwNamespace + ".svc", "nats." + hwNamespace + ".svc.cluster.local",
		"*.nats-headless." + hwNamespace + ".svc", "*.nats-headless." + hwNamespace + ".svc.cluster.local"}
	server, err := ca.Issue(x509.ExtKeyUsageServerAuth, "nats", func(c *x509.Certificate) { c.DNSNames = names })
	if err != nil {
		t.Fatal(err)
	}
	clientCert, err := ca.Issue(x509.ExtKeyUsageClientAuth, "headwater", nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, issued := range map[string]*testca.Issued{"headwater-nats-tls": server, "headwater-nats-client-tls": clientCert} {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: hwNamespace},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{"tls.crt": issued.CertPEM, "tls.key": issued.KeyPEM, "ca.crt": ca.CertPEM},
		}
		if _, err := env.c.Client.CoreV1().Secrets(hwNamespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	kubectl(t, "apply", "-k", filepath.Join(env.deploy, "overlays", "ha"))
	// The egress policy refuses private addresses to tenants' URLs by
	// default: the tests' git server is on the nodes' bridge, allowed
	// as an operator allows an in-cluster git server.
	kubectl(t, "-n", hwNamespace, "set", "env", "deployment/fetcher",
		"HEADWATER_ALLOWED_DESTINATIONS="+strings.Join(env.c.TestServerRanges(), ","))
	eventually(t, 10*time.Minute, "every pod of overlays/ha Ready", podsReady)
	t.Logf("overlays/ha: every pod Ready %s after kubectl apply -k", time.Since(start).Round(100*time.Millisecond))
}

// podsReady is nil when every pod of Headwater's namespace is Ready (a
// Job's: Succeeded) and none is being deleted.
func podsReady(ctx context.Context) error {
	pods, err := env.c.Client.CoreV1().Pods(hwNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	if len(pods.Items) == 0 {
		return fmt.Errorf("no pods yet")
	}
	var notReady []string
	for i := range pods.Items {
		p := &pods.Items[i]
		if isJobPod(p) {
			if p.Status.Phase != corev1.PodSucceeded {
				notReady = append(notReady, p.Name+" ("+string(p.Status.Phase)+")")
			}
			continue
		}
		if p.DeletionTimestamp != nil || !podReady(p) {
			notReady = append(notReady, p.Name+" ("+string(p.Status.Phase)+" on "+p.Spec.NodeName+")")
		}
	}
	if len(notReady) > 0 {
		return fmt.Errorf("not Ready: %s", strings.Join(notReady, ", "))
	}
	return nil
}

func isJobPod(p *corev1.Pod) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == "Job" {
			return true
		}
	}
	return false
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podsByApp lists Headwater's pods by app.kubernetes.io/name, each with
// the node it runs on.
func podsByApp(ctx context.Context) (map[string][]corev1.Pod, error) {
	pods, err := env.c.Client.CoreV1().Pods(hwNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string][]corev1.Pod{}
	for _, p := range pods.Items {
		if app := p.Labels["app.kubernetes.io/name"]; app != "" && !isJobPod(&p) {
			out[app] = append(out[app], p)
		}
	}
	return out, nil
}
