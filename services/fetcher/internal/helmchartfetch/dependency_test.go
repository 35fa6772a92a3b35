package helmchartfetch

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v3/pkg/registry"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets/secretstest"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	registryserver "github.com/headwater-gitops/headwater/testsupport/registry"
)

// pushCharts pushes each version of chart to srv's repository repo.
func pushCharts(t *testing.T, srv *registryserver.Server, repo, chart string, versions ...string) {
	t.Helper()
	opts := []registry.ClientOption{registry.ClientOptPlainHTTP(), registry.ClientOptWriter(io.Discard),
		registry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "creds.json"))}
	if srv.Options.Username != "" {
		opts = append(opts, registry.ClientOptBasicAuth(srv.Options.Username, srv.Options.Password))
	}
	push, err := registry.NewClient(opts...)
	must(t, err)
	for _, v := range versions {
		p, err := chartrepo.Package(t.TempDir(), chartrepo.Chart{Name: chart, Version: v, Values: map[string]any{"version": v}})
		must(t, err)
		data, err := os.ReadFile(p)
		must(t, err)
		_, err = push.Push(data, srv.Host+"/"+repo+"/"+chart+":"+v)
		must(t, err)
	}
}

// TestFetchChartDependenciesOCI builds a chart from a GitRepository whose
// dependencies are oci:// charts, as Flux's dependency manager: from a
// registry with credentials, with the OCI HelmRepository of that URL's
// Secret (a range picks the highest tag, an exact version is the tag);
// from a registry no HelmRepository names, anonymously; twice from one
// chart under two aliases; pinned by Chart.lock. Without the
// HelmRepository the private registry refuses, and a repository given as
// an alias ("@name", "alias:name") is refused in Flux's words.
func TestFetchChartDependenciesOCI(t *testing.T) {
	private := registryserver.New(t, registryserver.Options{Username: "helm", Password: "oci"})
	public := registryserver.New(t, registryserver.Options{})
	pushCharts(t, private, "charts", "redis", "1.0.0", "1.1.0", "2.0.0")
	pushCharts(t, public, "library", "nginx", "3.0.0")
	kube := secretstest.Reader(t, "default", map[string]map[string]string{"registry": {"username": "helm", "password": "oci"}})
	store, err := storage.NewDir(t.TempDir())
	must(t, err)
	s := &Source{Secrets: kube, Storage: store}
	repos := []events.ChartRepository{{Name: "private", Spec: sourcev1.HelmRepositorySpec{URL: private.URL("charts") + "/",
		Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true, SecretRef: &meta.LocalObjectReference{Name: "registry"}}}}
	chartYAML := "apiVersion: v2\nname: app\nversion: 1.0.0\ndependencies:\n" +
		"- name: redis\n  version: 1.x\n  repository: " + private.URL("charts") + "\n  alias: cache\n" +
		"- name: redis\n  version: 1.0.0\n  repository: " + private.URL("charts") + "\n  alias: queue\n" +
		"- name: nginx\n  version: '>=3.0.0'\n  repository: " + public.URL("library") + "\n"
	ctx := context.Background()
	deps := func(files map[string]string, repos []events.ChartRepository) ([]string, error) {
		cs := sourceArtifact(t, s, "gitrepository/default/app/"+strings.ReplaceAll(t.Name(), "/", "-")+".tar.gz", files, repos)
		res, err := s.Resolve(ctx, request(sourcev1.HelmChartSpec{Chart: "app"}, cs))
		must(t, err)
		content, err := res.Download(ctx, t.TempDir())
		if err != nil {
			return nil, err
		}
		ch, err := load(content.File)
		must(t, err)
		var out []string
		for _, d := range ch.Dependencies() {
			out = append(out, d.Name()+"@"+d.Metadata.Version+"="+d.Values["version"].(string))
		}
		sort.Strings(out)
		return out, nil
	}

	t.Run("from registries", func(t *testing.T) {
		got, err := deps(map[string]string{"app/Chart.yaml": chartYAML}, repos)
		must(t, err)
		if want := "cache@1.1.0=1.1.0,nginx@3.0.0=3.0.0,queue@1.0.0=1.0.0"; strings.Join(got, ",") != want {
			t.Fatalf("dependencies %v, want %s", got, want)
		}
	})
	t.Run("pinned by the lock file", func(t *testing.T) {
		lock := "dependencies:\n- name: redis\n  version: 1.0.0\n  repository: " + private.URL("charts") + "\n" +
			"digest: sha256:0000000000000000000000000000000000000000000000000000000000000000\ngenerated: \"2026-01-01T00:00:00Z\"\n"
		one := "apiVersion: v2\nname: app\nversion: 1.0.0\ndependencies:\n- name: redis\n  version: 1.x\n  repository: " + private.URL("charts") + "\n"
		got, err := deps(map[string]string{"app/Chart.yaml": one, "app/Chart.lock": lock}, repos)
		must(t, err)
		if strings.Join(got, ",") != "redis@1.0.0=1.0.0" {
			t.Fatalf("dependencies %v, want the locked redis 1.0.0", got)
		}
	})
	t.Run("no credentials without the HelmRepository", func(t *testing.T) {
		_, err := deps(map[string]string{"app/Chart.yaml": chartYAML}, nil)
		f := failure.As(err)
		if f == nil || f.Condition != sourcev1.BuildFailedCondition || f.Reason != ReasonDependencyBuild ||
			!strings.Contains(f.Error(), "failed to add remote dependency 'cache'") {
			t.Fatalf("failure %v", err)
		}
	})
	t.Run("no version matches", func(t *testing.T) {
		none := strings.Replace(chartYAML, "version: 1.x", "version: 9.x", 1)
		_, err := deps(map[string]string{"app/Chart.yaml": none}, repos)
		f := failure.As(err)
		if f == nil || f.Reason != ReasonDependencyBuild || f.Handling != failure.Final || !strings.Contains(f.Error(), "version '9.x'") {
			t.Fatalf("failure %v", err)
		}
	})
	for repo, want := range map[string]string{
		"@stable":      "aliased repository dependency is not supported: @stable (refer to the repository by its http(s):// or oci:// URL",
		"alias:stable": "invalid dependency repository URL: alias:stable (refer to the repository by its http(s):// or oci:// URL",
	} {
		t.Run("repository "+repo, func(t *testing.T) {
			aliased := "apiVersion: v2\nname: app\nversion: 1.0.0\ndependencies:\n- name: redis\n  version: 1.x\n  repository: \"" + repo + "\"\n"
			_, err := deps(map[string]string{"app/Chart.yaml": aliased}, repos)
			f := failure.As(err)
			if f == nil || f.Condition != sourcev1.BuildFailedCondition || f.Reason != ReasonDependencyBuild || f.Handling != failure.Final ||
				!strings.Contains(f.Error(), want) {
				t.Fatalf("failure %v", err)
			}
		})
	}
}
