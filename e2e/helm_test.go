package e2e

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	gcrv1 "github.com/google/go-containerregistry/pkg/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	helmregistry "helm.sh/helm/v3/pkg/registry"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
	ociregistry "github.com/headwater-gitops/headwater/testsupport/registry"
)

// TestHelmRepositoryAndChart is Flux's HelmRepository and HelmChart
// documentation examples through the whole system, against a chart
// repository the test serves (basic auth): the index stored as served and
// a chart pulled from it, a new chart version published upstream becoming
// a new artifact at once, an unchanged index costing a 304, values files
// merged into a packaged chart, and bad input failing with clear
// conditions and Events while the last artifacts stay served.
func TestHelmRepositoryAndChart(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const (
		repoName   = "podinfo"
		secretName = "podinfo-helm-auth"
	)
	srv := &chartrepo.Server{Dir: t.TempDir(), Username: "helm", Password: "s3cret"}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	values := map[string]any{"replicaCount": 1, "message": "hello", "ui": map[string]any{"color": "blue", "logo": "podinfo"}}
	files := map[string]string{"values-prod.yaml": "replicaCount: 3\nui:\n  color: red\n"}
	if err := srv.Add(chartrepo.Chart{Name: "podinfo", Version: "6.0.0", Values: values, Files: files},
		chartrepo.Chart{Name: "podinfo", Version: "6.1.0", Values: values, Files: files}); err != nil {
		t.Fatal(err)
	}
	createSecret(t, secretName, map[string]string{"username": "helm", "password": "s3cret"})
	createObject(t, &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Name: repoName, Namespace: namespace},
		Spec: sourcev1.HelmRepositorySpec{URL: srv.URL(), Interval: metav1.Duration{Duration: 5 * time.Minute},
			SecretRef: &meta.LocalObjectReference{Name: secretName}},
	})

	index1 := srv.Index()
	repo := waitHelmRepository(t, repoName, sha256Digest(index1))
	t.Run("index stored as served", func(t *testing.T) {
		hex := strings.TrimPrefix(sha256Digest(index1), "sha256:")
		a := repo.Status.Artifact
		if want := fmt.Sprintf("helmrepository/%s/%s/index-%s.yaml", namespace, repoName, hex); a.Path != want {
			t.Errorf("artifact path %s, want %s", a.Path, want)
		}
		if a.Digest != a.Revision {
			t.Errorf("digest %s, want the revision %s (the index is stored as served)", a.Digest, a.Revision)
		}
		if got := download(t, a.URL); !bytes.Equal(got, index1) {
			t.Error("the stored index differs from the one served")
		}
		if repo.Status.URL != a.URL {
			t.Errorf("status.url %s, want %s", repo.Status.URL, a.URL)
		}
		if c := conditionOf(t, repo, meta.ReadyCondition); c.Message != "stored artifact: revision '"+a.Revision+"'" {
			t.Errorf("Ready message %q", c.Message)
		}
		msg := fmt.Sprintf("stored fetched index of size %dB from '%s'", len(index1), srv.URL())
		if len(index1) >= 1000 {
			msg = ""
		}
		waitKindEvent(t, sourcev1.HelmRepositoryKind, repoName, corev1.EventTypeNormal, "NewArtifact", func(m string) bool {
			return (msg == "" || m == msg) && strings.HasPrefix(m, "stored fetched index of size ") && strings.HasSuffix(m, " from '"+srv.URL()+"'")
		})
	})

	t.Run("same URL and credentials share one download", func(t *testing.T) {
		downloads, _, _ := srv.Counts()
		for _, name := range []string{"podinfo-copy-1", "podinfo-copy-2"} {
			createObject(t, &sourcev1.HelmRepository{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec: sourcev1.HelmRepositorySpec{URL: srv.URL(), Interval: metav1.Duration{Duration: 5 * time.Minute},
					SecretRef: &meta.LocalObjectReference{Name: secretName}},
			})
			cp := waitHelmRepository(t, name, sha256Digest(index1))
			if cp.Status.Artifact.Digest != repo.Status.Artifact.Digest || !strings.Contains(cp.Status.Artifact.Path, "/"+name+"/") {
				t.Errorf("%s artifact %+v", name, cp.Status.Artifact)
			}
		}
		if d, nm, _ := srv.Counts(); d != downloads {
			t.Errorf("%d more index downloads (%d 304s), want none: the copies revalidate and reuse the stored index", d-downloads, nm)
		}
	})

	createObject(t, &sourcev1.HelmChart{
		ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: namespace},
		Spec: sourcev1.HelmChartSpec{Chart: "podinfo", Version: "6.*", Interval: metav1.Duration{Duration: 5 * time.Minute},
			SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: repoName}},
	})
	chart := waitHelmChart(t, "podinfo", "6.1.0")
	t.Run("chart pulled as is", func(t *testing.T) {
		a := chart.Status.Artifact
		if want := fmt.Sprintf("helmchart/%s/podinfo/podinfo-6.1.0.tgz", namespace); a.Path != want {
			t.Errorf("artifact path %s, want %s", a.Path, want)
		}
		served, err := os.ReadFile(filepath.Join(srv.Dir, "podinfo-6.1.0.tgz"))
		if err != nil {
			t.Fatal(err)
		}
		if got := download(t, a.URL); !bytes.Equal(got, served) {
			t.Error("the stored chart differs from the one served")
		}
		c := conditionOf(t, chart, meta.ReadyCondition)
		if c.Reason != sourcev1.ChartPullSucceededReason || c.Message != "pulled 'podinfo' chart with version '6.1.0'" {
			t.Errorf("Ready = %s %q", c.Reason, c.Message)
		}
		if chart.Status.ObservedChartName != "podinfo" || chart.Status.ObservedSourceArtifactRevision != repo.Status.Artifact.Revision {
			t.Errorf("observed chart %q, source revision %q", chart.Status.ObservedChartName, chart.Status.ObservedSourceArtifactRevision)
		}
		waitKindEvent(t, sourcev1.HelmChartKind, "podinfo", corev1.EventTypeNormal, sourcev1.ChartPullSucceededReason,
			func(m string) bool { return m == "pulled 'podinfo' chart with version '6.1.0'" })
	})

	t.Run("unchanged index costs a 304", func(t *testing.T) {
		_, before, _ := srv.Counts()
		requestReconcileOf(t, getObject(t, repoName, &sourcev1.HelmRepository{}))
		eventually(t, "a 304 for the unchanged index", func() error {
			if _, nm, _ := srv.Counts(); nm <= before {
				return fmt.Errorf("%d 304s", nm)
			}
			return nil
		})
		waitCloudEvent(t, recorder, sourcev1.HelmRepositoryKind, repoName, events.TypeArtifactUnchanged, nil)
	})

	t.Run("new chart version", func(t *testing.T) {
		if err := srv.Add(chartrepo.Chart{Name: "podinfo", Version: "6.2.0", Values: values, Files: files}); err != nil {
			t.Fatal(err)
		}
		requestReconcileOf(t, getObject(t, repoName, &sourcev1.HelmRepository{}))
		waitHelmRepository(t, repoName, sha256Digest(srv.Index()))
		// The chart follows its source at once, not at its interval.
		waitHelmChart(t, "podinfo", "6.2.0")
	})

	t.Run("values files merged", func(t *testing.T) {
		createObject(t, &sourcev1.HelmChart{
			ObjectMeta: metav1.ObjectMeta{Name: "podinfo-prod", Namespace: namespace},
			Spec: sourcev1.HelmChartSpec{Chart: "podinfo", Interval: metav1.Duration{Duration: 5 * time.Minute},
				SourceRef:   sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: repoName},
				ValuesFiles: []string{"values.yaml", "values-prod.yaml"}},
		})
		prod := waitHelmChart(t, "podinfo-prod", "6.2.0+1")
		msg := "packaged 'podinfo' chart with version '6.2.0+1' and merged values files [values.yaml values-prod.yaml]"
		if c := conditionOf(t, prod, meta.ReadyCondition); c.Reason != sourcev1.ChartPackageSucceededReason || c.Message != msg {
			t.Errorf("Ready = %s %q", c.Reason, c.Message)
		}
		ch, err := loader.LoadArchive(bytes.NewReader(download(t, prod.Status.Artifact.URL)))
		if err != nil {
			t.Fatal(err)
		}
		ui, _ := ch.Values["ui"].(map[string]any)
		if ch.Metadata.Version != "6.2.0+1" || fmt.Sprint(ch.Values["replicaCount"]) != "3" || ui["color"] != "red" || ui["logo"] != "podinfo" {
			t.Errorf("packaged chart %s with values %v", ch.Metadata.Version, ch.Values)
		}
	})

	t.Run("version range matching nothing", func(t *testing.T) {
		createObject(t, &sourcev1.HelmChart{
			ObjectMeta: metav1.ObjectMeta{Name: "podinfo-none", Namespace: namespace},
			Spec: sourcev1.HelmChartSpec{Chart: "podinfo", Version: "9.x", Interval: metav1.Duration{Duration: 5 * time.Minute},
				SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: repoName}},
		})
		obj := waitConditionOf(t, "helmchart podinfo-none", func() *sourcev1.HelmChart { return getObject(t, "podinfo-none", &sourcev1.HelmChart{}) },
			meta.StalledCondition, metav1.ConditionTrue, "InvalidChartReference")
		want := "invalid chart reference: failed to get chart version for remote reference: no 'podinfo' chart with version matching '9.x' found"
		if c := conditionOf(t, obj, meta.ReadyCondition); c.Status != metav1.ConditionFalse || c.Message != want {
			t.Errorf("Ready = %s %q, want False %q", c.Status, c.Message, want)
		}
		waitKindEvent(t, sourcev1.HelmChartKind, "podinfo-none", corev1.EventTypeWarning, "InvalidChartReference", nil)
	})

	t.Run("bad index keeps the last artifact", func(t *testing.T) {
		good := getObject(t, repoName, &sourcev1.HelmRepository{})
		srv.SetIndex([]byte("<html><body>maintenance</body></html>\n"))
		requestReconcileOf(t, getObject(t, repoName, &sourcev1.HelmRepository{}))
		obj := waitConditionOf(t, "helmrepository "+repoName, func() *sourcev1.HelmRepository { return getObject(t, repoName, &sourcev1.HelmRepository{}) },
			sourcev1.FetchFailedCondition, metav1.ConditionTrue, sourcev1.IndexationFailedReason)
		if c := conditionOf(t, obj, meta.ReadyCondition); c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "not a Helm repository index") {
			t.Errorf("Ready = %s %q", c.Status, c.Message)
		}
		if obj.Status.Artifact == nil || obj.Status.Artifact.Digest != good.Status.Artifact.Digest {
			t.Fatalf("artifact %+v, want the last good one kept", obj.Status.Artifact)
		}
		download(t, obj.Status.Artifact.URL)
		waitKindEvent(t, sourcev1.HelmRepositoryKind, repoName, corev1.EventTypeWarning, sourcev1.IndexationFailedReason, nil)
	})

	t.Run("wrong credentials", func(t *testing.T) {
		patchSecret(t, secretName, map[string]string{"username": "helm", "password": "wrong"})
		requestReconcileOf(t, getObject(t, repoName, &sourcev1.HelmRepository{}))
		obj := waitConditionOf(t, "helmrepository "+repoName, func() *sourcev1.HelmRepository { return getObject(t, repoName, &sourcev1.HelmRepository{}) },
			sourcev1.FetchFailedCondition, metav1.ConditionTrue, meta.FailedReason)
		if c := conditionOf(t, obj, sourcev1.FetchFailedCondition); !strings.Contains(c.Message, "401 Unauthorized") || strings.Contains(c.Message, "wrong") {
			t.Errorf("FetchFailed message %q", c.Message)
		}
	})
}

func waitHelmRepository(t *testing.T, name, rev string) *sourcev1.HelmRepository {
	t.Helper()
	return waitReady(t, "helmrepository "+name, func() *sourcev1.HelmRepository { return getObject(t, name, &sourcev1.HelmRepository{}) },
		func(o *sourcev1.HelmRepository) int64 { return o.Status.ObservedGeneration }, rev)
}

func waitHelmChart(t *testing.T, name, rev string) *sourcev1.HelmChart {
	t.Helper()
	return waitReady(t, "helmchart "+name, func() *sourcev1.HelmChart { return getObject(t, name, &sourcev1.HelmChart{}) },
		func(o *sourcev1.HelmChart) int64 { return o.Status.ObservedGeneration }, rev)
}

// TestHelmChartFromGit builds a chart kept in a Git repository, with a
// repository dependency resolved through a HelmRepository of the
// namespace (with its credentials) and a file:// one from the same
// repository; a new commit that bumps the chart's version becomes a new
// artifact at once.
func TestHelmChartFromGit(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	srv := &chartrepo.Server{Dir: t.TempDir(), Username: "helm", Password: "deps"}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	if err := srv.Add(chartrepo.Chart{Name: "redis", Version: "1.0.0"}, chartrepo.Chart{Name: "redis", Version: "1.1.0"}); err != nil {
		t.Fatal(err)
	}
	createSecret(t, "git-chart-deps-auth", map[string]string{"username": "helm", "password": "deps"})
	createObject(t, &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "git-chart-deps", Namespace: namespace},
		Spec: sourcev1.HelmRepositorySpec{URL: srv.URL(), Interval: metav1.Duration{Duration: 5 * time.Minute},
			SecretRef: &meta.LocalObjectReference{Name: "git-chart-deps-auth"}},
	})
	waitHelmRepository(t, "git-chart-deps", sha256Digest(srv.Index()))

	chartYAML := func(version string) string {
		return "apiVersion: v2\nname: app\nversion: " + version + "\ndependencies:\n" +
			"- name: redis\n  version: 1.x\n  repository: " + srv.URL() + "\n" +
			"- name: common\n  version: 0.1.0\n  repository: file://../common\n"
	}
	files := map[string]string{
		"charts/app/Chart.yaml":          chartYAML("1.0.0"),
		"charts/app/values.yaml":         "message: app\n",
		"charts/app/templates/cm.yaml":   "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n",
		"charts/common/Chart.yaml":       "apiVersion: v2\nname: common\nversion: 0.1.0\ntype: library\n",
		"charts/common/templates/_h.tpl": "{{- define \"common.name\" -}}common{{- end -}}\n",
	}
	repo, c1 := newRepo(t, "helm-chart-source", files)
	createSource(t, "helm-chart-source", env.Git.RepoURL("helm-chart-source"), branch)
	waitArtifact(t, "helm-chart-source", revision(c1))
	createObject(t, &sourcev1.HelmChart{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: namespace},
		Spec: sourcev1.HelmChartSpec{Chart: "./charts/app", Interval: metav1.Duration{Duration: 5 * time.Minute},
			SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.GitRepositoryKind, Name: "helm-chart-source"}},
	})
	chart := waitHelmChart(t, "app", "1.0.0")
	if c := conditionOf(t, chart, meta.ReadyCondition); c.Reason != sourcev1.ChartPackageSucceededReason ||
		c.Message != "packaged 'app' chart with version '1.0.0'" {
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
	if strings.Join(deps, ",") != "common@0.1.0,redis@1.1.0" {
		t.Errorf("dependencies %v, want redis@1.1.0 (from the HelmRepository) and common@0.1.0 (file://)", deps)
	}

	c2 := commit(t, repo, map[string]string{"charts/app/Chart.yaml": chartYAML("1.1.0")}, "Release 1.1.0")
	requestReconcile(t, "helm-chart-source")
	waitArtifact(t, "helm-chart-source", revision(c2))
	waitHelmChart(t, "app", "1.1.0")
}

// TestHelmRepositoriesTogether creates HelmRepositories of one URL at
// once: the repository serves its index once, whatever the number.
func TestHelmRepositoriesTogether(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	srv := &chartrepo.Server{Dir: t.TempDir()}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	if err := srv.Add(chartrepo.Chart{Name: "podinfo", Version: "6.0.0"}); err != nil {
		t.Fatal(err)
	}
	const n = 8
	for i := range n {
		createObject(t, &sourcev1.HelmRepository{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("together-%d", i), Namespace: namespace},
			Spec:       sourcev1.HelmRepositorySpec{URL: srv.URL(), Interval: metav1.Duration{Duration: 5 * time.Minute}},
		})
	}
	for i := range n {
		waitHelmRepository(t, fmt.Sprintf("together-%d", i), sha256Digest(srv.Index()))
	}
	if d, nm, _ := srv.Counts(); d != 1 {
		t.Errorf("%d index downloads (%d 304s) for %d HelmRepositories of one URL, want 1", d, nm, n)
	}
}

// TestHelmChartFromOCI pulls a chart from a HelmRepository of type oci
// (the CNCF distribution registry, basic auth): the repository stays
// static as in Flux, the chart is pulled as is.
func TestHelmChartFromOCI(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	reg := ociregistry.New(t, ociregistry.Options{Username: "helm", Password: "oci"})
	push, err := helmregistry.NewClient(helmregistry.ClientOptPlainHTTP(), helmregistry.ClientOptWriter(io.Discard),
		helmregistry.ClientOptBasicAuth("helm", "oci"), helmregistry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "creds.json")))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"6.0.0", "6.1.0"} {
		p, err := chartrepo.Package(t.TempDir(), chartrepo.Chart{Name: "podinfo", Version: v})
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := push.Push(data, reg.Host+"/charts/podinfo:"+v); err != nil {
			t.Fatal(err)
		}
	}
	createSecret(t, "oci-charts-auth", map[string]string{"username": "helm", "password": "oci"})
	createObject(t, &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "oci-charts", Namespace: namespace},
		Spec: sourcev1.HelmRepositorySpec{URL: reg.URL("charts"), Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true,
			Interval: metav1.Duration{Duration: 5 * time.Minute}, SecretRef: &meta.LocalObjectReference{Name: "oci-charts-auth"}},
	})
	createObject(t, &sourcev1.HelmChart{
		ObjectMeta: metav1.ObjectMeta{Name: "podinfo-oci", Namespace: namespace},
		Spec: sourcev1.HelmChartSpec{Chart: "podinfo", Version: "6.x", Interval: metav1.Duration{Duration: 5 * time.Minute},
			SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: "oci-charts"}},
	})
	chart := waitHelmChart(t, "podinfo-oci", "6.1.0")
	if c := conditionOf(t, chart, meta.ReadyCondition); c.Message != "pulled 'podinfo' chart with version '6.1.0'" {
		t.Errorf("Ready message %q", c.Message)
	}
	if _, err := loader.LoadArchive(bytes.NewReader(download(t, chart.Status.Artifact.URL))); err != nil {
		t.Fatal(err)
	}
	repo := getObject(t, "oci-charts", &sourcev1.HelmRepository{})
	if len(repo.Finalizers) != 0 || repo.Status.Artifact != nil || len(repo.Status.Conditions) != 0 {
		t.Errorf("an OCI HelmRepository is static in Flux; got finalizers %v, status %+v", repo.Finalizers, repo.Status)
	}
}

// TestHelmChartFromOCIVerify checks a HelmChart's spec.verify with cosign
// public keys on charts of an OCI HelmRepository: a signed chart is stored
// with SourceVerified=True; moved to an unsigned version, the chart fails
// with Flux's ChartVerificationError, SourceVerified=False and a Warning
// Event, and the signed chart stays the artifact.
func TestHelmChartFromOCIVerify(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	reg := ociregistry.New(t, ociregistry.Options{})
	push, err := helmregistry.NewClient(helmregistry.ClientOptPlainHTTP(), helmregistry.ClientOptWriter(io.Discard),
		helmregistry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "creds.json")))
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"1.0.0", "2.0.0"} {
		p, err := chartrepo.Package(t.TempDir(), chartrepo.Chart{Name: "podinfo", Version: v})
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		res, err := push.Push(data, reg.Host+"/charts/podinfo:"+v)
		if err != nil {
			t.Fatal(err)
		}
		if v == "1.0.0" {
			digest, err := gcrv1.NewHash(res.Manifest.Digest)
			if err != nil {
				t.Fatal(err)
			}
			reg.Sign(t, "charts/podinfo", digest, key)
		}
	}
	createSecret(t, "chart-cosign-keys", map[string]string{"cosign.pub": string(ociregistry.PublicKeyPEM(t, key))})
	createObject(t, &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "oci-signed-charts", Namespace: namespace},
		Spec: sourcev1.HelmRepositorySpec{URL: reg.URL("charts"), Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true,
			Interval: metav1.Duration{Duration: 5 * time.Minute}},
	})
	createObject(t, &sourcev1.HelmChart{
		ObjectMeta: metav1.ObjectMeta{Name: "podinfo-signed", Namespace: namespace},
		Spec: sourcev1.HelmChartSpec{Chart: "podinfo", Version: "1.0.0", Interval: metav1.Duration{Duration: 5 * time.Minute},
			SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: "oci-signed-charts"},
			Verify:    &sourcev1.HelmChartVerification{Provider: "cosign", SecretRef: &meta.LocalObjectReference{Name: "chart-cosign-keys"}}},
	})
	chart := waitHelmChart(t, "podinfo-signed", "1.0.0")
	if c := conditionOf(t, chart, sourcev1.SourceVerifiedCondition); c.Status != metav1.ConditionTrue || c.Reason != meta.SucceededReason ||
		c.Message != "verified signature of version 1.0.0" {
		t.Errorf("SourceVerified=%s %s %q", c.Status, c.Reason, c.Message)
	}
	signed := *chart.Status.Artifact

	patchObject(t, chart, func(c *sourcev1.HelmChart) { c.Spec.Version = "2.0.0" })
	get := func() *sourcev1.HelmChart { return getObject(t, "podinfo-signed", &sourcev1.HelmChart{}) }
	chart = waitConditionOf(t, "helmchart podinfo-signed", get, sourcev1.SourceVerifiedCondition, metav1.ConditionFalse, sourcev1.VerificationError)
	want := "chart verification error: no matching signatures were found for '" + reg.Host + "/charts/podinfo:2.0.0'"
	if c := conditionOf(t, chart, sourcev1.SourceVerifiedCondition); c.Message != want {
		t.Errorf("SourceVerified message %q\nwant %q", c.Message, want)
	}
	chart = waitConditionOf(t, "helmchart podinfo-signed", get, meta.ReadyCondition, metav1.ConditionFalse, "ChartVerificationError")
	if c := conditionOf(t, chart, sourcev1.BuildFailedCondition); c.Status != metav1.ConditionTrue || c.Message != want {
		t.Errorf("BuildFailed=%s %q", c.Status, c.Message)
	}
	if c := conditionOf(t, chart, sourcev1.ArtifactOutdatedCondition); c.Status != metav1.ConditionTrue || c.Reason != "NewChart" ||
		c.Message != "new 'podinfo' chart with version '2.0.0'" {
		t.Errorf("ArtifactOutdated=%s %s %q", c.Status, c.Reason, c.Message)
	}
	waitKindEvent(t, sourcev1.HelmChartKind, "podinfo-signed", corev1.EventTypeWarning, "ChartVerificationError", func(msg string) bool { return msg == want })
	if a := chart.Status.Artifact; a == nil || a.Revision != signed.Revision || a.Digest != signed.Digest {
		t.Errorf("artifact = %+v, want the signed chart %+v kept", a, signed)
	}
	if _, err := loader.LoadArchive(bytes.NewReader(download(t, signed.URL))); err != nil {
		t.Errorf("the signed chart is no longer served: %v", err)
	}

	// Back to the signed version: the stored chart is verified again, as
	// Flux verifies at every reconcile, and the chart recovers.
	patchObject(t, chart, func(c *sourcev1.HelmChart) { c.Spec.Version = "1.0.0" })
	chart = waitConditionOf(t, "helmchart podinfo-signed", get, sourcev1.SourceVerifiedCondition, metav1.ConditionTrue, meta.SucceededReason)
	chart = waitHelmChart(t, "podinfo-signed", "1.0.0")
	if a := chart.Status.Artifact; a.Digest != signed.Digest {
		t.Errorf("artifact digest %s, want the signed chart's %s", a.Digest, signed.Digest)
	}
}

// TestHelmChartFromBucket builds a chart kept in a Bucket (MinIO): the
// chart at spec.chart is packaged with its own values, and a new chart
// version put in the bucket becomes a new artifact at once.
func TestHelmChartFromBucket(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const bucket = "charts"
	srv := miniotest.New(t)
	srv.MakeBucket(t, bucket)
	chartYAML := func(version string) string { return "apiVersion: v2\nname: app\nversion: " + version + "\n" }
	putObject(t, srv, bucket, "charts/app/Chart.yaml", chartYAML("1.0.0"))
	putObject(t, srv, bucket, "charts/app/values.yaml", "message: from a bucket\n")
	putObject(t, srv, bucket, "charts/app/templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n")
	createSecret(t, "chart-bucket-credentials", map[string]string{"accesskey": srv.AccessKey, "secretkey": srv.SecretKey})
	createBucket(t, "chart-bucket", srv.Endpoint, bucket, func(b *sourcev1.Bucket) {
		b.Spec.SecretRef = &meta.LocalObjectReference{Name: "chart-bucket-credentials"}
	})
	waitBucketArtifact(t, "chart-bucket", listingRevision(t, srv, bucket, "", nil))
	createObject(t, &sourcev1.HelmChart{
		ObjectMeta: metav1.ObjectMeta{Name: "app-from-bucket", Namespace: namespace},
		Spec: sourcev1.HelmChartSpec{Chart: "charts/app", Interval: metav1.Duration{Duration: 5 * time.Minute},
			SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.BucketKind, Name: "chart-bucket"}},
	})
	chart := waitHelmChart(t, "app-from-bucket", "1.0.0")
	if c := conditionOf(t, chart, meta.ReadyCondition); c.Reason != sourcev1.ChartPackageSucceededReason ||
		c.Message != "packaged 'app' chart with version '1.0.0'" {
		t.Errorf("Ready = %s %q", c.Reason, c.Message)
	}
	ch, err := loader.LoadArchive(bytes.NewReader(download(t, chart.Status.Artifact.URL)))
	if err != nil {
		t.Fatal(err)
	}
	if ch.Values["message"] != "from a bucket" {
		t.Errorf("values %v, want the chart's own", ch.Values)
	}

	putObject(t, srv, bucket, "charts/app/Chart.yaml", chartYAML("1.1.0"))
	requestBucketReconcile(t, "chart-bucket")
	waitBucketArtifact(t, "chart-bucket", listingRevision(t, srv, bucket, "", nil))
	chart = waitHelmChart(t, "app-from-bucket", "1.1.0")
	if chart.Status.ObservedSourceArtifactRevision != getBucket(t, "chart-bucket").Status.Artifact.Revision {
		t.Errorf("observedSourceArtifactRevision %q", chart.Status.ObservedSourceArtifactRevision)
	}
}

// TestHelmRepositoryTLS serves the chart repository over HTTPS with a
// certificate of the test's own authority: with the authority in
// certSecretRef (ca.crt), the index is stored and a chart pulled from it;
// without it, the repository fails on the unknown certificate.
func TestHelmRepositoryTLS(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	srv := &chartrepo.Server{Dir: t.TempDir(), TLS: true}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	if err := srv.Add(chartrepo.Chart{Name: "podinfo", Version: "6.1.0"}); err != nil {
		t.Fatal(err)
	}
	ca, err := srv.CACert()
	if err != nil {
		t.Fatal(err)
	}
	createSecret(t, "tls-charts-ca", map[string]string{"ca.crt": string(ca)})
	createObject(t, &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "tls-charts", Namespace: namespace},
		Spec: sourcev1.HelmRepositorySpec{URL: srv.URL(), Interval: metav1.Duration{Duration: 5 * time.Minute},
			CertSecretRef: &meta.LocalObjectReference{Name: "tls-charts-ca"}},
	})
	createObject(t, &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "tls-charts-untrusted", Namespace: namespace},
		Spec:       sourcev1.HelmRepositorySpec{URL: srv.URL(), Interval: metav1.Duration{Duration: 5 * time.Minute}},
	})
	waitHelmRepository(t, "tls-charts", sha256Digest(srv.Index()))
	createObject(t, &sourcev1.HelmChart{
		ObjectMeta: metav1.ObjectMeta{Name: "podinfo-tls", Namespace: namespace},
		Spec: sourcev1.HelmChartSpec{Chart: "podinfo", Interval: metav1.Duration{Duration: 5 * time.Minute},
			SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: "tls-charts"}},
	})
	chart := waitHelmChart(t, "podinfo-tls", "6.1.0")
	if _, err := loader.LoadArchive(bytes.NewReader(download(t, chart.Status.Artifact.URL))); err != nil {
		t.Fatal(err)
	}

	get := func() *sourcev1.HelmRepository {
		return getObject(t, "tls-charts-untrusted", &sourcev1.HelmRepository{})
	}
	repo := waitConditionOf(t, "helmrepository tls-charts-untrusted", get, sourcev1.FetchFailedCondition, metav1.ConditionTrue, meta.FailedReason)
	if c := conditionOf(t, repo, sourcev1.FetchFailedCondition); !strings.Contains(c.Message, "certificate") {
		t.Errorf("FetchFailed message %q, want the certificate named", c.Message)
	}
	if repo.Status.Artifact != nil {
		t.Errorf("an index fetched from an untrusted server was stored: %+v", repo.Status.Artifact)
	}
}
