package e2e

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	helmregistry "helm.sh/helm/v3/pkg/registry"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	ociregistry "github.com/headwater-gitops/headwater/testsupport/registry"
)

// pushOCICharts pushes the versions of chart to reg's repository repo.
func pushOCICharts(t *testing.T, reg *ociregistry.Server, repo, chart string, versions ...string) {
	t.Helper()
	opts := []helmregistry.ClientOption{helmregistry.ClientOptPlainHTTP(), helmregistry.ClientOptWriter(io.Discard),
		helmregistry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "creds.json"))}
	if reg.Options.Username != "" {
		opts = append(opts, helmregistry.ClientOptBasicAuth(reg.Options.Username, reg.Options.Password))
	}
	push, err := helmregistry.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range versions {
		p, err := chartrepo.Package(t.TempDir(), chartrepo.Chart{Name: chart, Version: v})
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := push.Push(data, reg.Host+"/"+repo+"/"+chart+":"+v); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHelmChartDependenciesOCI packages a chart from a GitRepository whose
// dependencies are oci:// charts, as Flux: one from a registry with basic
// auth, pulled with the Secret of the OCI HelmRepository of that URL and
// added under its alias; one from a registry no HelmRepository names,
// pulled anonymously. A chart whose dependency names its repository by
// an alias ("@stable") fails as in Flux: Ready False with
// DependencyBuildError, BuildFailed saying aliases are not supported and
// what to use instead, and a Warning Event.
func TestHelmChartDependenciesOCI(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	private := ociregistry.New(t, ociregistry.Options{Username: "helm", Password: "deps"})
	public := ociregistry.New(t, ociregistry.Options{})
	pushOCICharts(t, private, "charts", "redis", "1.0.0", "1.1.0")
	pushOCICharts(t, public, "library", "nginx", "3.0.0")
	createSecret(t, "deps-oci-auth", map[string]string{"username": "helm", "password": "deps"})
	createObject(t, &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "deps-oci", Namespace: namespace},
		Spec: sourcev1.HelmRepositorySpec{URL: private.URL("charts"), Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true,
			Interval: metav1.Duration{Duration: 5 * time.Minute}, SecretRef: &meta.LocalObjectReference{Name: "deps-oci-auth"}},
	})
	files := map[string]string{
		"charts/app/Chart.yaml": "apiVersion: v2\nname: app\nversion: 1.0.0\ndependencies:\n" +
			"- name: redis\n  version: 1.x\n  repository: " + private.URL("charts") + "\n  alias: cache\n" +
			"- name: nginx\n  version: 3.0.0\n  repository: " + public.URL("library") + "\n",
		"charts/app/templates/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n",
		"charts/aliased/Chart.yaml": "apiVersion: v2\nname: aliased\nversion: 1.0.0\ndependencies:\n" +
			"- name: redis\n  version: 1.x\n  repository: \"@stable\"\n",
	}
	_, c1 := newRepo(t, "helm-oci-deps", files)
	createSource(t, "helm-oci-deps", env.Git.RepoURL("helm-oci-deps"), branch)
	waitArtifact(t, "helm-oci-deps", revision(c1))
	for _, name := range []string{"app", "aliased"} {
		createObject(t, &sourcev1.HelmChart{
			ObjectMeta: metav1.ObjectMeta{Name: "oci-deps-" + name, Namespace: namespace},
			Spec: sourcev1.HelmChartSpec{Chart: "./charts/" + name, Interval: metav1.Duration{Duration: 5 * time.Minute},
				SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.GitRepositoryKind, Name: "helm-oci-deps"}},
		})
	}

	chart := waitHelmChart(t, "oci-deps-app", "1.0.0")
	if c := conditionOf(t, chart, meta.ReadyCondition); c.Reason != sourcev1.ChartPackageSucceededReason {
		t.Errorf("Ready = %s %q", c.Reason, c.Message)
	}
	ch, err := loader.LoadArchive(bytes.NewReader(download(t, chart.Status.Artifact.URL)))
	if err != nil {
		t.Fatal(err)
	}
	var deps []string
	for _, d := range ch.Dependencies() {
		deps = append(deps, d.Name()+"@"+d.Metadata.Version)
	}
	sort.Strings(deps)
	if strings.Join(deps, ",") != "cache@1.1.0,nginx@3.0.0" {
		t.Errorf("dependencies %v, want cache@1.1.0 (redis from the private registry) and nginx@3.0.0 (anonymous)", deps)
	}

	get := func() *sourcev1.HelmChart { return getObject(t, "oci-deps-aliased", &sourcev1.HelmChart{}) }
	bad := waitConditionOf(t, "helmchart oci-deps-aliased", get, meta.ReadyCondition, metav1.ConditionFalse, "DependencyBuildError")
	if c := conditionOf(t, bad, sourcev1.BuildFailedCondition); c.Status != metav1.ConditionTrue ||
		!strings.Contains(c.Message, "aliased repository dependency is not supported: @stable") || !strings.Contains(c.Message, "refer to the repository by its http(s):// or oci:// URL") {
		t.Errorf("BuildFailed = %s %q", c.Status, c.Message)
	}
	waitKindEvent(t, sourcev1.HelmChartKind, "oci-deps-aliased", corev1.EventTypeWarning, "DependencyBuildError", nil)
	if bad.Status.Artifact != nil {
		t.Errorf("a chart whose dependency cannot be built has an artifact: %+v", bad.Status.Artifact)
	}
	requireServicesRunning(t)
}
