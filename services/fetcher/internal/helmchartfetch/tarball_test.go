package helmchartfetch

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"sort"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/helmfetch"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
)

// sourceArtifact stores files as a source's tar.gz artifact and returns
// its ChartSource.
func sourceArtifact(t *testing.T, s *Source, key string, files map[string]string, repos []events.ChartRepository) *events.ChartSource {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		must(t, tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(files[n]))
		must(t, err)
	}
	must(t, tw.Close())
	must(t, zw.Close())
	_, err := s.Storage.Put(context.Background(), key, &buf)
	must(t, err)
	return &events.ChartSource{Kind: sourcev1.GitRepositoryKind, Name: "app",
		Artifact: meta.Artifact{Path: key, Revision: "main@sha1:0123456789abcdef0123456789abcdef01234567"}, Repositories: repos}
}

func TestFetchChartFromSource(t *testing.T) {
	_, s, repoSource := setup(t)
	repos := []events.ChartRepository{{Name: "charts", Spec: *repoSource.HelmRepository, Artifact: repoSource.Artifact}}
	app := map[string]string{
		"charts/app/Chart.yaml": "apiVersion: v2\nname: app\nversion: 1.2.3\ndependencies:\n" +
			"- name: common\n  version: 0.1.0\n  repository: file://../common\n" +
			"- name: podinfo\n  version: 6.1.x\n  repository: " + repoSource.HelmRepository.URL + "\n",
		"charts/app/values.yaml":         "message: app\n",
		"charts/app/values-prod.yaml":    "message: prod\n",
		"charts/app/templates/cm.yaml":   "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n",
		"charts/common/Chart.yaml":       "apiVersion: v2\nname: common\nversion: 0.1.0\ntype: library\n",
		"charts/common/templates/_h.tpl": "{{- define \"common.name\" -}}common{{- end -}}\n",
		"README.md":                      "not a chart\n",
	}
	ctx := context.Background()
	cs := sourceArtifact(t, s, "gitrepository/default/app/a.tar.gz", app, repos)
	for _, tc := range []struct {
		name, revision, message string
		spec                    sourcev1.HelmChartSpec
	}{
		{name: "chart version", spec: sourcev1.HelmChartSpec{Chart: "./charts/app"}, revision: "1.2.3",
			message: "packaged 'app' chart with version '1.2.3'"},
		{name: "revision strategy and values", spec: sourcev1.HelmChartSpec{Chart: "charts/app", ReconcileStrategy: sourcev1.ReconcileStrategyRevision,
			ValuesFiles: []string{"values.yaml", "values-prod.yaml"}}, revision: "1.2.3+0123456789ab",
			message: "packaged 'app' chart with version '1.2.3+0123456789ab' and merged values files [values.yaml values-prod.yaml]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ch := fetchChart(t, s, request(tc.spec, cs), "app", tc.revision, tc.message)
			var deps []string
			for _, d := range ch.Dependencies() {
				deps = append(deps, d.Name()+"@"+d.Metadata.Version)
			}
			sort.Strings(deps)
			if strings.Join(deps, ",") != "common@0.1.0,podinfo@6.1.0" {
				t.Fatalf("dependencies %v", deps)
			}
		})
	}

	t.Run("from a bucket", func(t *testing.T) {
		// A Bucket's artifact is the same tar.gz; its revision is a digest.
		files := map[string]string{"a/Chart.yaml": "apiVersion: v2\nname: a\nversion: 1.0.0\n", "a/values.yaml": "message: bucket\n"}
		c := sourceArtifact(t, s, "bucket/default/charts/a.tar.gz", files, nil)
		c.Kind, c.Name, c.Artifact.Revision = sourcev1.BucketKind, "charts", "sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
		fetchChart(t, s, request(sourcev1.HelmChartSpec{Chart: "./a"}, c), "a", "1.0.0", "packaged 'a' chart with version '1.0.0'")
		_, ch := fetchChart(t, s, request(sourcev1.HelmChartSpec{Chart: "a", ReconcileStrategy: sourcev1.ReconcileStrategyRevision}, c),
			"a", "1.0.0+fedcba987654", "packaged 'a' chart with version '1.0.0+fedcba987654'")
		if ch.Values["message"] != "bucket" {
			t.Fatalf("values %v", ch.Values)
		}
	})

	t.Run("packaged over the size limit", func(t *testing.T) {
		noise := make([]byte, 8<<10)
		_, err := rand.Read(noise)
		must(t, err)
		files := map[string]string{"a/Chart.yaml": "apiVersion: v2\nname: a\nversion: 1.0.0\n", "a/noise.txt": hex.EncodeToString(noise)}
		c := sourceArtifact(t, s, "gitrepository/default/big/a.tar.gz", files, nil)
		s.MaxChartSize = 4 << 10
		defer func() { s.MaxChartSize = 0 }()
		res, err := s.Resolve(ctx, request(sourcev1.HelmChartSpec{Chart: "a"}, c))
		must(t, err)
		_, err = res.Download(ctx, t.TempDir())
		f := failure.As(err)
		if f == nil || f.Condition != sourcev1.BuildFailedCondition || f.Reason != ReasonChartPackage || f.Handling != failure.Final ||
			!strings.Contains(f.Error(), "larger than the maximum chart size of 4096 bytes (-helm-chart-max-size)") {
			t.Fatalf("failure %v", err)
		}
		s.MaxChartSize = 0
		fetchChart(t, s, request(sourcev1.HelmChartSpec{Chart: "a"}, c), "a", "1.0.0", "packaged 'a' chart with version '1.0.0'")
	})

	cycle := map[string]string{
		"a/Chart.yaml": "apiVersion: v2\nname: a\nversion: 1.0.0\ndependencies:\n- name: b\n  version: 1.0.0\n  repository: file://../b\n",
		"b/Chart.yaml": "apiVersion: v2\nname: b\nversion: 1.0.0\ndependencies:\n- name: a\n  version: 1.0.0\n  repository: file://../a\n",
	}
	unknownRepo := map[string]string{
		"a/Chart.yaml": "apiVersion: v2\nname: a\nversion: 1.0.0\ndependencies:\n- name: x\n  version: 1.0.0\n  repository: https://charts.example.com\n",
	}
	t.Run("dependency from a repository that is no HelmRepository", func(t *testing.T) {
		public := &chartrepo.Server{Dir: t.TempDir()}
		must(t, public.Start("127.0.0.1:0"))
		t.Cleanup(func() { _ = public.Stop() })
		must(t, public.Add(chartrepo.Chart{Name: "redis", Version: "1.0.0"}, chartrepo.Chart{Name: "redis", Version: "1.1.0"}))
		files := map[string]string{"a/Chart.yaml": "apiVersion: v2\nname: a\nversion: 1.0.0\ndependencies:\n" +
			"- name: redis\n  version: 1.x\n  repository: " + public.URL() + "\n"}
		c := sourceArtifact(t, s, "gitrepository/default/public/a.tar.gz", files, repos)
		s.Indexes = helmfetch.NewSource(nil, 0, nil, nil)
		defer func() { s.Indexes = nil }()
		_, ch := fetchChart(t, s, request(sourcev1.HelmChartSpec{Chart: "a"}, c), "a", "1.0.0", "packaged 'a' chart with version '1.0.0'")
		if deps := ch.Dependencies(); len(deps) != 1 || deps[0].Metadata.Version != "1.1.0" {
			t.Fatalf("dependencies %v", deps)
		}
	})

	for _, tc := range []struct {
		name      string
		files     map[string]string
		chart     string
		atResolve bool
		reason    string
		message   string
	}{
		{name: "dependency cycle", files: cycle, chart: "a", reason: ReasonDependencyBuild, message: "dependency cycle: a -> b -> a"},
		{name: "no repository for a dependency", files: unknownRepo, chart: "a", reason: ReasonDependencyBuild,
			message: "no HelmRepository with an index in namespace 'default' has the URL 'https://charts.example.com'"},
		{name: "no chart at the path", files: unknownRepo, chart: "b", atResolve: true, reason: ReasonChartReference, message: "no chart found at path 'b'"},
		{name: "path out of the source", files: unknownRepo, chart: "../a", atResolve: true, reason: ReasonChartReference, message: "must be relative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := sourceArtifact(t, s, "gitrepository/default/bad/"+strings.ReplaceAll(tc.name, " ", "-")+".tar.gz", tc.files, nil)
			res, err := s.Resolve(ctx, request(sourcev1.HelmChartSpec{Chart: tc.chart}, c))
			if !tc.atResolve {
				must(t, err)
				_, err = res.Download(ctx, t.TempDir())
			}
			f := failure.As(err)
			if f == nil || f.Reason != tc.reason || !strings.Contains(f.Error(), tc.message) {
				t.Fatalf("failure %v, want %s containing %q", err, tc.reason, tc.message)
			}
		})
	}
}
