package kubetest

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/testsupport/miniotest"
	"github.com/headwater-gitops/headwater/testsupport/testca"
)

// S3Secret starts a MinIO on the host's end of the nodes' link (outside
// the nodes, as a cloud's S3 is outside the cluster: the "any S3" of
// overlays/s3) and makes, in namespace ns, the Secret headwater-s3 the S3
// overlays read. The server stops when t ends.
func (e *Env) S3Secret(t testing.TB, ns string) *miniotest.Server {
	t.Helper()
	srv, err := miniotest.StartOn(t.TempDir(), e.C.HostIP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "headwater-s3", Namespace: ns},
		StringData: map[string]string{
			"endpoint": "http://" + srv.Endpoint, "bucket": "headwater",
			"accesskey": srv.AccessKey, "secretkey": srv.SecretKey,
		},
	}
	if _, err := e.C.Client.CoreV1().Secrets(ns).Create(context.Background(), secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return srv
}

// NATSTLSSecrets makes, in namespace ns, the two Secrets
// components/nats-tls reads, as cert-manager would: the server's
// certificate (for the Service and every server of the headless one) and
// the clients', each with the ca.crt that signs the other side.
func (e *Env) NATSTLSSecrets(t testing.TB, ns string) {
	t.Helper()
	ca, err := testca.New("nats")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"nats", "nats." + ns + ".svc", "nats." + ns + ".svc.cluster.local",
		"*.nats-headless." + ns + ".svc", "*.nats-headless." + ns + ".svc.cluster.local"}
	server, err := ca.Issue(x509.ExtKeyUsageServerAuth, "nats", func(c *x509.Certificate) { c.DNSNames = names })
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(x509.ExtKeyUsageClientAuth, "headwater", nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, issued := range map[string]*testca.Issued{"headwater-nats-tls": server, "headwater-nats-client-tls": client} {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{"tls.crt": issued.CertPEM, "tls.key": issued.KeyPEM, "ca.crt": ca.CertPEM},
		}
		if _, err := e.C.Client.CoreV1().Secrets(ns).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// DeployPath is a kustomization over dir (inside Deploy, or dir itself
// when absolute: a kustomization of a test's own) that lets the services
// reach the test's servers, as an operator allows an in-cluster git
// server: the egress policy refuses private addresses to tenants' URLs by
// default, and the nodes' link and Services are private
// (cluster.TestServerRanges). The same dir always gives the same
// kustomization, so what an install applied its uninstall deletes.
func (e *Env) DeployPath(dir string) string {
	target := dir
	if !filepath.IsAbs(dir) {
		target = filepath.Join(e.Deploy, dir)
	}
	sum := sha256.Sum256([]byte(target))
	wrap := filepath.Join(e.Kustomizations, hex.EncodeToString(sum[:8]))
	// kustomize takes only relative paths to other kustomizations.
	rel, err := filepath.Rel(wrap, target)
	if err != nil {
		panic(fmt.Sprintf("kustomization over %s: %v", target, err))
	}
	if err := os.MkdirAll(wrap, 0o755); err != nil {
		panic(fmt.Sprintf("kustomization over %s: %v", target, err))
	}
	if err := os.WriteFile(filepath.Join(wrap, "kustomization.yaml"), []byte(e.allowTestServers(rel)), 0o644); err != nil {
		panic(fmt.Sprintf("kustomization over %s: %v", target, err))
	}
	return wrap
}

// allowTestServers is a kustomization of resource (a relative path) that
// sets HEADWATER_ALLOWED_DESTINATIONS to the test servers' ranges in every
// Deployment that requests tenants' URLs it renders (docs/security.md,
// "Egress").
func (e *Env) allowTestServers(resource string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%q]\npatches:\n", resource)
	allowed := strings.Join(e.C.TestServerRanges(), ",")
	for _, d := range []string{"fetcher", "dispatcher", "httpsource-fetcher"} {
		fmt.Fprintf(&b, `  - target: {kind: Deployment, name: %[1]s}
    patch: |-
      {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": %[1]q},
       "spec": {"template": {"spec": {"containers": [{"name": %[1]q, "env": [{"name": "HEADWATER_ALLOWED_DESTINATIONS", "value": %[2]q}]}]}}}}
`, d, allowed)
	}
	return b.String()
}

// WithTestServers returns the chart's values vals (nil: the defaults)
// with egress.allowedDestinations the test servers' ranges, as
// DeployPath's kustomization sets them.
func (e *Env) WithTestServers(vals map[string]any) map[string]any {
	out := map[string]any{"egress": map[string]any{"allowedDestinations": e.C.TestServerRanges()}}
	for k, v := range vals {
		out[k] = v
	}
	return out
}
