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

// ManyOCI runs scenario e: 1000 OCIRepositories over 10 artifacts in a
// real registry (the CNCF distribution registry, as pushed by `flux push
// artifact`) are created at once and awaited Ready with an artifact. It
// notes the registry's requests: with content shared, each layer is
// downloaded once.
func ManyOCI(ctx context.Context, o Options, tb testing.TB) (m *Measurement, err error) {
	env, stop, err := startEnv(ctx, o, "many-oci")
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	reg := registry.New(tb, registry.Options{})
	for i := range ociArtifacts {
		files := map[string]string{
			"deploy/deployment.yaml": fmt.Sprintf("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app-%02d\n", i),
			"deploy/service.yaml":    fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata:\n  name: app-%02d\n", i),
			"README.md":              fmt.Sprintf("# app %d\n", i),
		}
		reg.Push(tb, fmt.Sprintf(ociRepoNameForm, i), "v1.0.0",
			registry.FluxArtifact(tb, files, "https://github.com/acme/apps", fmt.Sprintf("main@sha1:%040d", i)))
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
	o.progress("e: creating %d OCIRepositories over %d artifacts", ociSources, ociArtifacts)
	ociRepositories := func() client.ObjectList { return &sourcev1.OCIRepositoryList{} }
	t := newTracker(c, namespace, len(names), ociRepositories, readyWithArtifact[*sourcev1.OCIRepository])
	m, err = measureKind(sctx, o, "e", env, t, len(names), func(ctx context.Context) error {
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
		return m, fmt.Errorf("scenario e: %w", err)
	}
	reqs := reg.Requests()[before:]
	var manifests, blobs int
	for _, r := range reqs {
		switch {
		case r.Method == "GET" && strings.Contains(r.Path, "/blobs/"):
			blobs++
		case strings.Contains(r.Path, "/manifests/"):
			manifests++
		}
	}
	m.Notes = append(m.Notes, fmt.Sprintf("registry: %d requests, %d of them manifest HEAD/GET, %d blob downloads (layers and configs) for %d artifacts",
		len(reqs), manifests, blobs, ociArtifacts))
	return m, nil
}
