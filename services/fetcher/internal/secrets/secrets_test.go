package secrets

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestNewReader(t *testing.T) {
	unreachable := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(unreachable, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		kubeconfig string
		startErr   bool
		getErr     string
	}{
		// No cluster at all: the fetcher starts, Secrets cannot be read.
		{name: "missing kubeconfig", kubeconfig: filepath.Join(t.TempDir(), "absent"), startErr: true, getErr: ErrNoCluster.Error()},
		// A cluster that does not answer: the fetcher starts without
		// contacting it, each read fails.
		{name: "unreachable cluster", kubeconfig: unreachable, getErr: "connection refused"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Kubeconfig: tc.kubeconfig}
			r, err := o.NewReader()
			if (err != nil) != tc.startErr {
				t.Errorf("NewReader error = %v, want error %v", err, tc.startErr)
			}
			if r == nil {
				t.Fatal("NewReader returned no reader")
			}
			_, err = r.Get(context.Background(), "default", "creds")
			if err == nil || !strings.Contains(err.Error(), tc.getErr) {
				t.Errorf("Get error = %v, want one containing %q", err, tc.getErr)
			}
		})
	}
}

func TestKubeGet(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "creds"},
		Data:       map[string][]byte{"username": []byte("flux")},
	}, &corev1.ServiceAccount{
		ObjectMeta:       metav1.ObjectMeta{Namespace: "apps", Name: "puller"},
		ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}, {Name: "other"}},
	}).Build()
	k := NewKube(c)
	if names, err := k.ImagePullSecrets(context.Background(), "apps", "puller"); err != nil || !slices.Equal(names, []string{"regcred", "other"}) {
		t.Errorf("ImagePullSecrets = %v, %v; want the account's pull secrets in order", names, err)
	}
	if _, err := k.ImagePullSecrets(context.Background(), "apps", "absent"); !apierrors.IsNotFound(err) {
		t.Errorf("ImagePullSecrets of a missing account = %v, want not found", err)
	}
	data, err := k.Get(context.Background(), "apps", "creds")
	if err != nil || string(data["username"]) != "flux" {
		t.Errorf("Get = %v, %v; want the secret's data", data, err)
	}
	if _, err := k.Get(context.Background(), "other", "creds"); !apierrors.IsNotFound(err) {
		t.Errorf("Get in another namespace = %v, want not found", err)
	}
	if _, err := (Unavailable{Err: errors.New("no kubeconfig")}).Get(context.Background(), "apps", "creds"); !errors.Is(err, ErrNoCluster) {
		t.Errorf("Unavailable.Get = %v, want ErrNoCluster", err)
	}
}

// TestRESTConfigLimits: the fetcher's client takes its rate limits from the
// flags, by default none on the client side (-1), whatever the kubeconfig.
func TestRESTConfigLimits(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("fetcher", flag.ContinueOnError)
	var o Options
	o.BindFlags(fs)
	if err := fs.Parse([]string{"-kubeconfig", kubeconfig}); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.QPS != -1 || cfg.Burst != -1 {
		t.Errorf("default QPS %v, burst %d; want -1, -1 (no client-side throttling)", cfg.QPS, cfg.Burst)
	}
	if err := fs.Parse([]string{"-kubeconfig", kubeconfig, "-kube-api-qps", "50", "-kube-api-burst", "100"}); err != nil {
		t.Fatal(err)
	}
	if cfg, err = o.RESTConfig(); err != nil {
		t.Fatal(err)
	}
	if cfg.QPS != 50 || cfg.Burst != 100 {
		t.Errorf("QPS %v, burst %d; want 50, 100", cfg.QPS, cfg.Burst)
	}
}
