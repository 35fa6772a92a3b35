package helmchartfetch

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"sigs.k8s.io/yaml"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets/secretstest"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
)

const indexPath = "helmrepository/default/charts/index-x.yaml"

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// setup serves podinfo 6.1.0, 6.2.0 and 7.0.0-rc.1 with basic auth and
// stores the repository's index as a HelmRepository's artifact.
func setup(t *testing.T) (*chartrepo.Server, *Source, *events.ChartSource) {
	t.Helper()
	srv := &chartrepo.Server{Dir: t.TempDir(), Username: "helm", Password: "pw"}
	must(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = srv.Stop() })
	values := map[string]any{"message": "default", "replicas": 1, "nested": map[string]any{"a": 1, "b": 1}}
	files := map[string]string{"values-prod.yaml": "message: prod\nnested:\n  b: 2\n"}
	must(t, srv.Add(
		chartrepo.Chart{Name: "podinfo", Version: "6.1.0", Values: values, Files: files},
		chartrepo.Chart{Name: "podinfo", Version: "6.2.0", Values: values, Files: files},
		chartrepo.Chart{Name: "podinfo", Version: "7.0.0-rc.1", Values: values}))
	store, err := storage.NewDir(t.TempDir())
	must(t, err)
	_, err = store.Put(context.Background(), indexPath, bytes.NewReader(srv.Index()))
	must(t, err)
	kube := secretstest.Reader(t, "default", map[string]map[string]string{"auth": {"username": "helm", "password": "pw"}})
	cs := &events.ChartSource{Kind: sourcev1.HelmRepositoryKind, Name: "charts", Artifact: meta.Artifact{Path: indexPath},
		HelmRepository: &sourcev1.HelmRepositorySpec{URL: srv.URL(), SecretRef: &meta.LocalObjectReference{Name: "auth"}}}
	return srv, &Source{Secrets: kube, Storage: store}, cs
}

func request(spec sourcev1.HelmChartSpec, cs *events.ChartSource) *events.FetchRequested {
	return &events.FetchRequested{
		Job:       events.Job{ID: "job", Object: events.ObjectRef{Kind: Kind, Namespace: "default", Name: "podinfo", Generation: 3}},
		HelmChart: &spec, ChartSource: cs,
	}
}

func TestFetchChart(t *testing.T) {
	srv, s, cs := setup(t)
	for _, tc := range []struct {
		name     string
		spec     sourcev1.HelmChartSpec
		revision string
		message  string
		values   map[string]any
	}{
		{name: "latest stable", spec: sourcev1.HelmChartSpec{Chart: "podinfo"}, revision: "6.2.0",
			message: "pulled 'podinfo' chart with version '6.2.0'"},
		{name: "range", spec: sourcev1.HelmChartSpec{Chart: "podinfo", Version: "<6.2.0"}, revision: "6.1.0",
			message: "pulled 'podinfo' chart with version '6.1.0'"},
		{name: "exact prerelease", spec: sourcev1.HelmChartSpec{Chart: "podinfo", Version: "7.0.0-rc.1"}, revision: "7.0.0-rc.1",
			message: "pulled 'podinfo' chart with version '7.0.0-rc.1'"},
		{name: "values files", spec: sourcev1.HelmChartSpec{Chart: "podinfo", ValuesFiles: []string{"values.yaml", "values-prod.yaml"}},
			revision: "6.2.0+3", message: "packaged 'podinfo' chart with version '6.2.0+3' and merged values files [values.yaml values-prod.yaml]",
			values: map[string]any{"message": "prod", "replicas": float64(1), "nested": map[string]any{"a": float64(1), "b": float64(2)}}},
		{name: "missing values file ignored", spec: sourcev1.HelmChartSpec{Chart: "podinfo", ValuesFiles: []string{"values-prod.yaml", "values-x.yaml"},
			IgnoreMissingValuesFiles: true}, revision: "6.2.0+3",
			message: "packaged 'podinfo' chart with version '6.2.0+3' and merged values files [values-prod.yaml]",
			values:  map[string]any{"message": "prod", "nested": map[string]any{"b": float64(2)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			content, ch := fetchChart(t, s, request(tc.spec, cs), "podinfo", tc.revision, tc.message)
			if tc.values != nil && !equalJSON(ch.Values, tc.values) {
				t.Fatalf("values %v, want %v", ch.Values, tc.values)
			}
			if tc.values == nil {
				// Pulled as is: the bytes the repository serves.
				got, err := os.ReadFile(content.File)
				must(t, err)
				want, err := os.ReadFile(filepath.Join(srv.Dir, "podinfo-"+tc.revision+".tgz"))
				must(t, err)
				if !bytes.Equal(got, want) {
					t.Fatal("a pulled chart differs from the one served")
				}
			}
		})
	}
}

func TestFetchChartBadInput(t *testing.T) {
	srv, s, cs := setup(t)
	ctx := context.Background()
	// Hostile archives, served under an index entry of their own.
	bomb := tgz(t, map[string][]byte{"podinfo/Chart.yaml": []byte("apiVersion: v2\nname: podinfo\nversion: 6.1.0\n"),
		"podinfo/big.txt": bytes.Repeat([]byte("0"), 6<<20)})
	climb := tgz(t, map[string][]byte{"podinfo/Chart.yaml": []byte("apiVersion: v2\nname: podinfo\nversion: 6.1.0\n"),
		"podinfo/../../etc/passwd": []byte("x")})
	must(t, os.WriteFile(filepath.Join(srv.Dir, "bomb.tgz"), bomb, 0o644))
	absolute := tgz(t, map[string][]byte{"podinfo/Chart.yaml": []byte("apiVersion: v2\nname: podinfo\nversion: 6.1.0\n"),
		"podinfo//etc/passwd": []byte("x")})
	must(t, os.WriteFile(filepath.Join(srv.Dir, "climb.tgz"), climb, 0o644))
	must(t, os.WriteFile(filepath.Join(srv.Dir, "absolute.tgz"), absolute, 0o644))
	// The Helm loader drops an empty first element: it would load this
	// one, and the archive stored as served would carry it.
	rooted := tgz(t, map[string][]byte{"podinfo/Chart.yaml": []byte("apiVersion: v2\nname: podinfo\nversion: 6.1.0\n"),
		"/etc/passwd": []byte("x")})
	must(t, os.WriteFile(filepath.Join(srv.Dir, "rooted.tgz"), rooted, 0o644))
	hostile := func(file string) *events.ChartSource {
		idx := "apiVersion: v1\nentries:\n  podinfo:\n  - apiVersion: v2\n    name: podinfo\n    version: 6.1.0\n    urls:\n    - " + file + "\n"
		p := "helmrepository/default/charts/" + file + ".yaml"
		_, err := s.Storage.Put(ctx, p, strings.NewReader(idx))
		must(t, err)
		c := *cs
		c.Artifact.Path = p
		return &c
	}
	wrongAuth := *cs
	wrongAuth.HelmRepository = cs.HelmRepository.DeepCopy()
	wrongAuth.HelmRepository.SecretRef = nil
	for _, tc := range []struct {
		name      string
		spec      sourcev1.HelmChartSpec
		cs        *events.ChartSource
		maxSize   int64
		atResolve bool
		condition string
		reason    string
		handling  failure.Handling
		message   string
	}{
		{name: "no match", spec: sourcev1.HelmChartSpec{Chart: "podinfo", Version: "9.x"}, atResolve: true,
			condition: sourcev1.FetchFailedCondition, reason: ReasonChartReference, handling: failure.Stalling,
			message: "invalid chart reference: failed to get chart version for remote reference: no 'podinfo' chart with version matching '9.x' found"},
		{name: "no chart", spec: sourcev1.HelmChartSpec{Chart: "nginx"}, atResolve: true,
			condition: sourcev1.FetchFailedCondition, reason: ReasonChartReference, handling: failure.Stalling, message: "no chart 'nginx'"},
		{name: "over the size limit", spec: sourcev1.HelmChartSpec{Chart: "podinfo"}, maxSize: 100,
			condition: sourcev1.FetchFailedCondition, reason: ReasonChartPull, handling: failure.Final, message: "larger than the maximum chart size"},
		{name: "missing values file", spec: sourcev1.HelmChartSpec{Chart: "podinfo", ValuesFiles: []string{"values-x.yaml"}},
			condition: sourcev1.BuildFailedCondition, reason: ReasonValuesFiles, handling: failure.Stalling,
			message: "values files merge error: no values file found at path 'values-x.yaml'"},
		{name: "wrong credentials", spec: sourcev1.HelmChartSpec{Chart: "podinfo"}, cs: &wrongAuth,
			condition: sourcev1.FetchFailedCondition, reason: ReasonChartPull, message: "401 Unauthorized"},
		{name: "decompression bomb", spec: sourcev1.HelmChartSpec{Chart: "podinfo"}, cs: hostile("bomb.tgz"),
			condition: sourcev1.FetchFailedCondition, reason: ReasonChartPull, handling: failure.Final, message: "larger than the maximum file size"},
		{name: "climbing path", spec: sourcev1.HelmChartSpec{Chart: "podinfo"}, cs: hostile("climb.tgz"),
			condition: sourcev1.FetchFailedCondition, reason: ReasonChartPull, handling: failure.Final,
			message: `chart illegally contains an entry outside the chart: unsafe path in archive: "podinfo/../../etc/passwd"`},
		{name: "absolute path", spec: sourcev1.HelmChartSpec{Chart: "podinfo"}, cs: hostile("absolute.tgz"),
			condition: sourcev1.FetchFailedCondition, reason: ReasonChartPull, handling: failure.Final, message: "chart illegally contains absolute paths"},
		{name: "rooted path", spec: sourcev1.HelmChartSpec{Chart: "podinfo"}, cs: hostile("rooted.tgz"),
			condition: sourcev1.FetchFailedCondition, reason: ReasonChartPull, handling: failure.Final,
			message: `chart illegally contains an entry outside the chart: unsafe path in archive: "/etc/passwd"`},
		{name: "missing index", spec: sourcev1.HelmChartSpec{Chart: "podinfo"}, atResolve: true,
			cs:        &events.ChartSource{Kind: cs.Kind, Name: cs.Name, Artifact: meta.Artifact{Path: "helmrepository/default/charts/gone.yaml"}, HelmRepository: cs.HelmRepository},
			condition: sourcev1.StorageOperationFailedCondition, reason: sourcev1.ReadOperationFailedReason, message: "failed to read the HelmRepository index"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cs
			if c == nil {
				c = cs
			}
			s.MaxChartSize = tc.maxSize
			res, err := s.Resolve(ctx, request(tc.spec, c))
			if !tc.atResolve {
				must(t, err)
				_, err = res.Download(ctx, t.TempDir())
			}
			f := failure.As(err)
			if f == nil || f.Condition != tc.condition || f.Reason != tc.reason || f.Handling != tc.handling || !strings.Contains(f.Error(), tc.message) {
				t.Fatalf("failure = %#v (%v); want %s/%s (%s) containing %q", f, err, tc.condition, tc.reason, tc.handling, tc.message)
			}
		})
	}
}

// tgz makes a gzipped tar of files, in the order given by their names.
func tgz(t *testing.T, files map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, name := range []string{"podinfo/Chart.yaml", "podinfo/big.txt", "podinfo/../../etc/passwd", "podinfo//etc/passwd", "/etc/passwd"} {
		b, ok := files[name]
		if !ok {
			continue
		}
		must(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}))
		_, err := tw.Write(b)
		must(t, err)
	}
	must(t, tw.Close())
	must(t, zw.Close())
	return buf.Bytes()
}

func equalJSON(a, b map[string]any) bool {
	return strings.TrimSpace(toYAML(a)) == strings.TrimSpace(toYAML(b))
}

func toYAML(m map[string]any) string {
	b, err := yaml.Marshal(m)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// fetchChart resolves and downloads a HelmChart job with s, checks the
// revision, the artifact name (<chart>-<revision>.tgz) and the message,
// and returns the content and the chart it holds.
func fetchChart(t *testing.T, s *Source, req *events.FetchRequested, chartName, revision, message string) (*source.Content, *chart.Chart) {
	t.Helper()
	ctx := context.Background()
	res, err := s.Resolve(ctx, req)
	must(t, err)
	if c, ok := res.(io.Closer); ok {
		defer c.Close()
	}
	if res.Revision() != revision {
		t.Fatalf("revision %s, want %s", res.Revision(), revision)
	}
	dir := t.TempDir()
	content, err := res.Download(ctx, dir)
	must(t, err)
	if content.ArtifactName != chartName+"-"+revision+".tgz" || content.EventMessage != message || content.File != filepath.Join(dir, ChartFile) {
		t.Fatalf("content = %+v", content)
	}
	ch, err := loader.Load(content.File)
	must(t, err)
	if ch.Metadata.Version != revision {
		t.Fatalf("chart version %s, want %s", ch.Metadata.Version, revision)
	}
	return content, ch
}
