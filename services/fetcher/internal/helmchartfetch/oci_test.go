package helmchartfetch

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v3/pkg/registry"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets/secretstest"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	registryserver "github.com/headwater-gitops/headwater/testsupport/registry"
)

// TestFetchChartOCI pulls charts from an OCI HelmRepository served by the
// CNCF distribution registry, with basic auth: the highest version of a
// range from the registry's tags, an exact version, values files merged.
func TestFetchChartOCI(t *testing.T) {
	srv := registryserver.New(t, registryserver.Options{Username: "helm", Password: "oci"})
	push, err := registry.NewClient(registry.ClientOptPlainHTTP(), registry.ClientOptWriter(io.Discard),
		registry.ClientOptBasicAuth("helm", "oci"), registry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "creds.json")))
	must(t, err)
	for _, v := range []string{"6.0.0", "6.1.0", "7.0.0-rc.1"} {
		p, err := chartrepo.Package(t.TempDir(), chartrepo.Chart{Name: "podinfo", Version: v, Values: map[string]any{"message": "default"},
			Files: map[string]string{"values-prod.yaml": "message: prod\n"}})
		must(t, err)
		data, err := os.ReadFile(p)
		must(t, err)
		_, err = push.Push(data, srv.Host+"/charts/podinfo:"+v)
		must(t, err)
	}
	kube := secretstest.Reader(t, "default", map[string]map[string]string{"auth": {"username": "helm", "password": "oci"}})
	s := &Source{Secrets: kube}
	cs := &events.ChartSource{Kind: sourcev1.HelmRepositoryKind, Name: "oci", HelmRepository: &sourcev1.HelmRepositorySpec{
		URL: srv.URL("charts"), Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true, SecretRef: &meta.LocalObjectReference{Name: "auth"}}}
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		spec     sourcev1.HelmChartSpec
		revision string
		message  string
	}{
		{"latest stable", sourcev1.HelmChartSpec{Chart: "podinfo"}, "6.1.0", "pulled 'podinfo' chart with version '6.1.0'"},
		{"exact", sourcev1.HelmChartSpec{Chart: "podinfo", Version: "6.0.0"}, "6.0.0", "pulled 'podinfo' chart with version '6.0.0'"},
		{"values files", sourcev1.HelmChartSpec{Chart: "podinfo", Version: "6.x", ValuesFiles: []string{"values.yaml", "values-prod.yaml"}},
			"6.1.0+3", "packaged 'podinfo' chart with version '6.1.0+3' and merged values files [values.yaml values-prod.yaml]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fetchChart(t, s, request(tc.spec, cs), "podinfo", tc.revision, tc.message)
		})
	}
	t.Run("wrong credentials", func(t *testing.T) {
		bad := *cs
		bad.HelmRepository = cs.HelmRepository.DeepCopy()
		bad.HelmRepository.SecretRef = nil
		_, err := s.Resolve(ctx, request(sourcev1.HelmChartSpec{Chart: "podinfo"}, &bad))
		if f := failure.As(err); f == nil || f.Condition != sourcev1.FetchFailedCondition || !strings.Contains(f.Error(), "could not fetch tags") {
			t.Fatalf("failure %v", err)
		}
	})
	t.Run("verify", func(t *testing.T) {
		_, err := s.Resolve(ctx, request(sourcev1.HelmChartSpec{Chart: "podinfo", Verify: &sourcev1.HelmChartVerification{Provider: "cosign"}}, cs))
		if f := failure.As(err); f == nil || f.Handling != failure.Stalling || !strings.Contains(f.Error(), "not supported yet") {
			t.Fatalf("failure %v", err)
		}
	})
	t.Run("no match", func(t *testing.T) {
		_, err := s.Resolve(ctx, request(sourcev1.HelmChartSpec{Chart: "podinfo", Version: "9.x"}, cs))
		if f := failure.As(err); f == nil || f.Reason != ReasonChartReference || f.Handling != failure.Stalling {
			t.Fatalf("failure %v", err)
		}
	})
}
