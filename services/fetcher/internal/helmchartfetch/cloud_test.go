package helmchartfetch

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v3/pkg/registry"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/registrylogin"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets/secretstest"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	"github.com/headwater-gitops/headwater/testsupport/cloudid"
	registryserver "github.com/headwater-gitops/headwater/testsupport/registry"
)

// newChartClouds pushes chart podinfo 6.1.0 to charts/podinfo of a test
// registry and returns the three clouds' identity endpoints and registry
// fronts of it (testsupport/cloudid).
func newChartClouds(t *testing.T) *cloudid.Clouds {
	t.Helper()
	backend := registryserver.New(t, registryserver.Options{Username: "helm", Password: "oci"})
	push, err := registry.NewClient(registry.ClientOptPlainHTTP(), registry.ClientOptWriter(io.Discard),
		registry.ClientOptBasicAuth("helm", "oci"), registry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "creds.json")))
	must(t, err)
	p, err := chartrepo.Package(t.TempDir(), chartrepo.Chart{Name: "podinfo", Version: "6.1.0"})
	must(t, err)
	data, err := os.ReadFile(p)
	must(t, err)
	_, err = push.Push(data, backend.Host+"/charts/podinfo:6.1.0")
	must(t, err)
	return cloudid.New(t, backend)
}

// cloudSource is a source that logs in through the token endpoints of
// clouds, with a cache of its own, and trusts the fronts' certificates
// (Secret default/fronts-ca).
func cloudSource(t *testing.T, clouds *cloudid.Clouds) *Source {
	return &Source{
		Secrets: secretstest.Reader(t, "default", map[string]map[string]string{"fronts-ca": {"ca.crt": string(clouds.CACerts())}}),
		Cloud: &registrylogin.Login{Tokens: providertoken.NewCache(0, nil), RootCAs: clouds.Roots, Aliases: clouds.Aliases(),
			Getenv: sourcetest.Getenv(clouds.Env)},
	}
}

// cloudRepo is an OCI HelmRepository of the charts behind front, with
// provider and the fronts' CA of Secret fronts-ca.
func cloudRepo(front *cloudid.Registry, provider string) *events.ChartSource {
	return &events.ChartSource{Kind: sourcev1.HelmRepositoryKind, Name: "oci", HelmRepository: &sourcev1.HelmRepositorySpec{
		URL: "oci://" + front.Host() + "/charts", Type: sourcev1.HelmRepositoryTypeOCI, Provider: provider,
		CertSecretRef: &meta.LocalObjectReference{Name: "fronts-ca"}}}
}

// TestFetchChartOCICloudProviders pulls a chart from an OCI HelmRepository
// with spec.provider aws, gcp and azure and no secretRef: the fetcher's
// identity is exchanged at the clouds' token endpoints (testsupport/cloudid)
// for the login the registry's front lets through.
func TestFetchChartOCICloudProviders(t *testing.T) {
	clouds := newChartClouds(t)
	s := cloudSource(t, clouds)
	for _, tc := range []struct {
		provider string
		front    *cloudid.Registry
	}{{"aws", clouds.ECR}, {"gcp", clouds.GAR}, {"azure", clouds.ACR}} {
		t.Run(tc.provider, func(t *testing.T) {
			fetchChart(t, s, request(sourcev1.HelmChartSpec{Chart: "podinfo"}, cloudRepo(tc.front, tc.provider)), "podinfo", "6.1.0",
				"pulled 'podinfo' chart with version '6.1.0'")
		})
	}
	t.Run("not the provider's registry", func(t *testing.T) {
		_, err := s.Resolve(context.Background(), request(sourcev1.HelmChartSpec{Chart: "podinfo"}, cloudRepo(clouds.ECR, "azure")))
		if f := failure.As(err); f == nil || f.Reason != sourcev1.AuthenticationFailedReason || f.Handling != failure.Stalling ||
			f.Error() != "failed to get credential from 'azure': invalid Azure registry: '"+cloudid.ECRName+"'. must match ^.+\\.(azurecr\\.io|azurecr\\.cn|azurecr\\.de|azurecr\\.us)$" {
			t.Fatalf("failure %v", err)
		}
	})
	t.Run("token endpoint down", func(t *testing.T) {
		clouds.GCP.FailWith(503)
		defer clouds.GCP.FailWith(0)
		// A source without a cache, so the login is asked for again.
		fresh := &Source{Secrets: s.Secrets, Cloud: &registrylogin.Login{RootCAs: clouds.Roots, Aliases: clouds.Aliases(), Getenv: s.Cloud.Getenv}}
		_, err := fresh.Resolve(context.Background(), request(sourcev1.HelmChartSpec{Chart: "podinfo"}, cloudRepo(clouds.GAR, "gcp")))
		if f := failure.As(err); f == nil || f.Reason != sourcev1.AuthenticationFailedReason || f.Handling != failure.Transient {
			t.Fatalf("failure %v", err)
		}
	})
}
