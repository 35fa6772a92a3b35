package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/testsupport/registry"
)

// Sizes of the OCIRepository scenario, as Flux's own benchmark of 1000
// OCIRepositories.
const (
	ociArtifacts          = 10
	ociSourcesPerArtifact = 100
	ociSources            = ociArtifacts * ociSourcesPerArtifact
	ociRepoNameForm       = "apps/app-%02d"
)

// Counter names of scenario j's measurement (Measurement.Counters).
const (
	// CounterRegistryRequests is every request the registry answered.
	CounterRegistryRequests = "registry requests"
	// CounterManifestRequests is the HEADs and GETs of manifests.
	CounterManifestRequests = "manifest requests"
	// CounterBlobDownloads is the GETs of blobs: layers and configs.
	CounterBlobDownloads = "blob downloads"
	// CounterLayerDownloads is the GETs of the artifacts' layers.
	CounterLayerDownloads = "layer downloads"
)

// ManyOCI runs scenario j on sys: 1000 OCIRepositories over 10 artifacts in a
// real registry (the CNCF distribution registry, as pushed by `flux push
// artifact`) are created at once and awaited Ready with an artifact. It
// notes the registry's requests: with content shared, each layer is
// downloaded once.
func ManyOCI(ctx context.Context, o Options, sys System, tb testing.TB) (m *Measurement, err error) {
	env, stop, err := startEnv(ctx, o, "many-oci", sys)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	reg := registry.New(tb, registry.Options{})
	layers := map[string]bool{}
	for i := range ociArtifacts {
		files := map[string]string{
			"deploy/deployment.yaml": fmt.Sprintf("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app-%02d\n", i),
			"deploy/service.yaml":    fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata:\n  name: app-%02d\n", i),
			"README.md":              fmt.Sprintf("# app %d\n", i),
		}
		a := registry.FluxArtifact(tb, files, "https://github.com/acme/apps", fmt.Sprintf("main@sha1:%040d", i))
		ls, err := a.Image(tb).Layers()
		if err != nil {
			return nil, fmt.Errorf("scenario j: %w", err)
		}
		for _, l := range ls {
			d, err := l.Digest()
			if err != nil {
				return nil, fmt.Errorf("scenario j: %w", err)
			}
			layers[d.String()] = true
		}
		reg.Push(tb, fmt.Sprintf(ociRepoNameForm, i), "v1.0.0", a)
	}
	c, err := benchClient(ctx, env)
	if err != nil {
		return nil, err
	}
	names := make([]string, ociSources)
	for i := range names {
		names[i] = fmt.Sprintf("oci-%02d-%03d", i%ociArtifacts, i/ociArtifacts)
	}
	before := len(reg.Requests())
	sctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()
	o.progress("j: creating %d OCIRepositories over %d artifacts", ociSources, ociArtifacts)
	ociRepositories := func() client.ObjectList { return &sourcev1.OCIRepositoryList{} }
	t := newTracker(c, namespace, len(names), ociRepositories, readyWithArtifact[*sourcev1.OCIRepository])
	m, err = measureKind(sctx, o, "j", env, t, len(names), func(ctx context.Context) error {
		return forEach(ctx, names, func(ctx context.Context, i int, name string) error {
			return c.Create(ctx, &sourcev1.OCIRepository{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec: sourcev1.OCIRepositorySpec{
					URL:       reg.URL(fmt.Sprintf(ociRepoNameForm, i%ociArtifacts)),
					Reference: &sourcev1.OCIRepositoryRef{Tag: "v1.0.0"},
					Interval:  metav1.Duration{Duration: smallInterval},
					Insecure:  true,
				},
			})
		})
	})
	if err != nil {
		return m, fmt.Errorf("scenario j: %w", err)
	}
	reqs := reg.Requests()[before:]
	var manifests, blobs, layerGets int64
	for _, r := range reqs {
		switch {
		case r.Method == "GET" && strings.Contains(r.Path, "/blobs/"):
			blobs++
			if layers[r.Path[strings.LastIndex(r.Path, "/")+1:]] {
				layerGets++
			}
		case strings.Contains(r.Path, "/manifests/"):
			manifests++
		}
	}
	m.Counters = map[string]int64{
		CounterRegistryRequests: int64(len(reqs)),
		CounterManifestRequests: manifests,
		CounterBlobDownloads:    blobs,
		CounterLayerDownloads:   layerGets,
	}
	return m, nil
}
