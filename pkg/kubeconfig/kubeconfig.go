// Package kubeconfig finds the Kubernetes API server a service talks to.
package kubeconfig

import (
	"flag"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
)

// Load returns the configuration of the kubeconfig file at path; with an
// empty path, of $KUBECONFIG, then of the pod's service account
// (in-cluster), then of ~/.kube/config, as controller-runtime looks.
func Load(path string) (*rest.Config, error) {
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		return cfg, nil
	}
	cfg, err := config.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes config: %w", err)
	}
	return cfg, nil
}

// Options locate the API server and limit the requests a service makes to
// it on its side.
type Options struct {
	// Path is a kubeconfig file; see Load for what an empty one means.
	Path string
	// QPS and Burst are the client-side limits. Every source of
	// configuration leaves QPS at 0, which client-go reads as its own
	// default of 5 requests per second, far too few for thousands of
	// sources; a negative QPS leaves throttling to the API server's
	// priority and fairness (the default, as Flux's flags allow).
	QPS   float64
	Burst int
}

// BindFlags registers -kubeconfig, -kube-api-qps and -kube-api-burst on
// fs; usage describes the kubeconfig (the cluster it is for).
func (o *Options) BindFlags(fs *flag.FlagSet, usage string) {
	fs.StringVar(&o.Path, "kubeconfig", "", usage)
	fs.Float64Var(&o.QPS, "kube-api-qps", -1,
		"Client-side limit of Kubernetes API requests per second; -1 leaves throttling to the API server's priority and fairness.")
	fs.IntVar(&o.Burst, "kube-api-burst", -1, "Client-side burst of Kubernetes API requests, with -kube-api-qps.")
}

// Load returns the configuration Load(o.Path) finds, with the client-side
// limits of QPS and Burst.
func (o Options) Load() (*rest.Config, error) {
	cfg, err := Load(o.Path)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = float32(o.QPS), o.Burst
	return cfg, nil
}
