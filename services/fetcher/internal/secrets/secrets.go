// Package secrets reads the Secrets that sources name for their
// credentials (and the image pull secrets of the ServiceAccounts they
// name), straight from the Kubernetes API (no cache, no watch): a fetcher
// reads a few Secrets per job and must see a changed Secret at once.
package secrets

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/kubeconfig"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/provenance"
)

// Reader reads the data of a Secret.
type Reader interface {
	// Get returns the data of the Secret namespace/name.
	Get(ctx context.Context, namespace, name string) (map[string][]byte, error)
	// ImagePullSecrets returns the names of the image pull secrets of the
	// ServiceAccount namespace/name, in order.
	ImagePullSecrets(ctx context.Context, namespace, name string) ([]string, error)
}

// Options locate the Kubernetes API server.
type Options struct {
	// Kubeconfig is a kubeconfig file; when empty, the KUBECONFIG
	// environment variable, the in-cluster config and ~/.kube/config are
	// tried in turn (controller-runtime's loading rules).
	Kubeconfig string
	// QPS and Burst limit the requests per second made to the API server
	// on this side; a negative QPS leaves throttling to the API server's
	// priority and fairness.
	QPS   float64
	Burst int
	// ProvenanceCacheTTL is how long the check of a job against its
	// source (package provenance) trusts a read of the source at the
	// job's generation and spec; zero reads the source for every job.
	ProvenanceCacheTTL time.Duration
}

// BindFlags registers the options on fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "",
		"Kubeconfig file of the cluster whose Secrets hold credentials; default: KUBECONFIG, in-cluster, ~/.kube/config.")
	fs.Float64Var(&o.QPS, "kube-api-qps", -1,
		"Client-side limit of Kubernetes API requests per second (every job reads its source, and Secrets); -1 leaves throttling to the API server's priority and fairness.")
	fs.IntVar(&o.Burst, "kube-api-burst", -1, "Client-side burst of Kubernetes API requests, with -kube-api-qps.")
	fs.DurationVar(&o.ProvenanceCacheTTL, "provenance-cache-ttl", 5*time.Minute,
		"How long a job's source, read at the job's generation and spec, vouches for later jobs of that generation and spec without another read; 0 reads the source for every job.")
}

// RESTConfig loads the API server configuration, with the client-side
// limits of QPS and Burst: every job reads its source live, so client-go's
// default of 5 requests per second (20 with controller-runtime's loader)
// would make a burst of a thousand jobs wait a minute for nothing.
func (o *Options) RESTConfig() (*rest.Config, error) {
	return kubeconfig.Options{Path: o.Kubeconfig, QPS: o.QPS, Burst: o.Burst}.Load()
}

// NewReader returns a Reader on the configured cluster. When no cluster is
// configured it still returns a Reader, whose every Get fails with the
// reason, together with that reason as the error: a fetcher without a
// cluster serves every source that needs no Secret.
func (o *Options) NewReader() (Reader, error) {
	cfg, err := o.RESTConfig()
	if err != nil {
		return Unavailable{Err: err}, err
	}
	r, err := NewKubeForConfig(cfg)
	if err != nil {
		return Unavailable{Err: err}, err
	}
	return r, nil
}

// NewProvenance returns the checker of jobs against the sources they name
// (package provenance), reading the configured cluster; an error when no
// cluster is configured.
func (o *Options) NewProvenance() (*provenance.Checker, error) {
	cfg, err := o.RESTConfig()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return provenance.NewCached(c, o.ProvenanceCacheTTL), nil
}

// NewClient returns an uncached client of the configured cluster that
// reads ServiceAccounts and creates their tokens (package
// workloadidentity); an error when no cluster is configured.
func (o *Options) NewClient() (client.Client, error) {
	cfg, err := o.RESTConfig()
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := authnv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return c, nil
}

// Kube reads Secrets through a controller-runtime client.
type Kube struct {
	c client.Reader
}

// NewKube returns a Kube reading through c, which should not be a cached
// client (reading Secrets through a cache would watch every Secret).
func NewKube(c client.Reader) *Kube { return &Kube{c: c} }

// NewKubeForConfig returns a Kube with an uncached client for cfg. It does
// not contact the API server.
func NewKubeForConfig(cfg *rest.Config) (*Kube, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return NewKube(c), nil
}

// Get returns the data of the Secret namespace/name.
func (k *Kube) Get(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	var s corev1.Secret
	if err := k.c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &s); err != nil {
		return nil, err
	}
	return s.Data, nil
}

// ImagePullSecrets returns the names of the ServiceAccount's
// imagePullSecrets, in order.
func (k *Kube) ImagePullSecrets(ctx context.Context, namespace, name string) ([]string, error) {
	var sa corev1.ServiceAccount
	if err := k.c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &sa); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(sa.ImagePullSecrets))
	for _, ref := range sa.ImagePullSecrets {
		names = append(names, ref.Name)
	}
	return names, nil
}

// Unavailable is the Reader of a fetcher that has no cluster to read from.
type Unavailable struct {
	// Err says why there is no cluster.
	Err error
}

// ErrNoCluster is wrapped by every error of Unavailable.
var ErrNoCluster = errors.New("no Kubernetes API server is configured")

// Get always fails.
func (u Unavailable) Get(context.Context, string, string) (map[string][]byte, error) {
	return nil, fmt.Errorf("%w: %w", ErrNoCluster, u.Err)
}

// ImagePullSecrets always fails.
func (u Unavailable) ImagePullSecrets(context.Context, string, string) ([]string, error) {
	return nil, fmt.Errorf("%w: %w", ErrNoCluster, u.Err)
}

// Fingerprint digests the data of the Secrets something is built from (nil
// for a Secret not named), so that two fetches with the same fingerprint
// authenticate and connect the same way, and a rotated key changes it. It
// is a one-way digest and never leaves the process.
func Fingerprint(secrets ...map[string][]byte) string {
	h := sha256.New()
	for _, data := range secrets {
		if data == nil {
			h.Write([]byte("-\n"))
			continue
		}
		keys := slices.Sorted(maps.Keys(data))
		fmt.Fprintf(h, "%d\n", len(keys))
		for _, k := range keys {
			fmt.Fprintf(h, "%d:%s%d:", len(k), k, len(data[k]))
			h.Write(data[k])
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}
