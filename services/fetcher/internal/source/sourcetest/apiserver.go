package sourcetest

import (
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// CRDs are custom resource definitions for StartAPIServer to install.
type CRDs struct {
	// Dir holds the CustomResourceDefinition manifests (such as the
	// repository's deploy/crds); a missing directory fails the start.
	Dir string
	// AddToScheme adds their kinds (such as sourcev1.AddToScheme) to the
	// returned client's scheme.
	AddToScheme func(*runtime.Scheme) error
}

// StartAPIServer starts a real API server (envtest's, whose service
// account issuer signs TokenRequest tokens) with crds installed for the
// rest of t and returns an admin client of it that knows the built-in
// kinds and those of crds.
func StartAPIServer(t *testing.T, crds ...CRDs) client.Client {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, which builds kube-apiserver and etcd")
	}
	env := &envtest.Environment{ErrorIfCRDPathMissing: true}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, c := range crds {
		env.CRDDirectoryPaths = append(env.CRDDirectoryPaths, c.Dir)
		if err := c.AddToScheme(scheme); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop() // what started before the failure (a CRD that did not install)
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
