package clustertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli"
	helmregistry "helm.sh/helm/v3/pkg/registry"
	"helm.sh/helm/v3/pkg/storage/driver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
	"github.com/headwater-gitops/headwater/testsupport/registry"
)

// release is the Helm release the chart tests install.
const release = "headwater"

// TestHelmInstall installs Headwater as a Helm user does: the chart
// (charts/headwater) is packaged, pushed to an OCI registry (the CNCF
// distribution registry) and installed from oci:// with the Helm v3 SDK's
// install action (`helm install --wait --wait-for-jobs
// --create-namespace`), which must bring every pod Ready without a
// restart; a GitRepository becomes Ready and its artifact downloads. An
// upgrade that rolls every Headwater Deployment and adds a fetcher keeps
// the source Ready with the same artifact throughout, and a commit made
// after it is fetched. An uninstall removes the workloads and keeps the
// CRDs (helm.sh/resource-policy: keep) and the users' sources.
func TestHelmInstall(t *testing.T) {
	requireFull(t)
	ctx := context.Background()
	cl := env.Client(t)
	h := newHelm(t, ns)
	t.Cleanup(func() { helmCleanup(t, h) })

	// Package and push, as a release of the chart would be published.
	chartDir := filepath.Join(env.Deploy, "..", "charts", "headwater")
	pkg := action.NewPackage()
	pkg.Destination = t.TempDir()
	archive, err := pkg.Run(chartDir, nil)
	if err != nil {
		t.Fatalf("helm package %s: %v", chartDir, err)
	}
	lint := action.NewLint()
	lint.Namespace = ns
	if res := lint.Run([]string{archive}, nil); len(res.Errors) > 0 {
		t.Fatalf("helm lint %s: %v", filepath.Base(archive), errors.Join(res.Errors...))
	}
	reg := registry.New(t, registry.Options{})
	data, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	packaged, err := loader.LoadArchive(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	version := packaged.Metadata.Version
	pushed, err := h.registry.Push(data, fmt.Sprintf("%s/charts/%s:%s", reg.Host, packaged.Name(), version))
	if err != nil {
		t.Fatalf("helm push: %v", err)
	}
	chartRef := "oci://" + reg.Host + "/charts/" + packaged.Name()
	t.Logf("helm package and push: %s %s (%d bytes, digest %s)", chartRef, version, pushed.Chart.Size, pushed.Chart.Digest)

	// helm install --wait --wait-for-jobs --create-namespace oci://...
	before := reg.CountRequests("GET", "/blobs/")
	install := action.NewInstall(h.cfg)
	install.ReleaseName = release
	install.Namespace = ns
	install.CreateNamespace = true
	install.Version = version
	install.PlainHTTP = true
	install.Wait = true
	install.WaitForJobs = true
	install.Timeout = 8 * time.Minute
	start := time.Now()
	path, err := install.LocateChart(chartRef, h.settings)
	if err != nil {
		t.Fatalf("helm install: locate %s: %v", chartRef, err)
	}
	if reg.WaitRequests("GET", "/blobs/", before+1, 10*time.Second) <= before {
		t.Fatalf("helm install located %s at %s without downloading it from the registry", chartRef, path)
	}
	chrt, err := loader.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := install.RunWithContext(ctx, chrt, env.WithTestServers(nil))
	if err != nil {
		t.Fatalf("helm install %s: %v\n%s", chartRef, err, env.Diagnose(ns))
	}
	waitPodsReady(t, time.Minute)
	t.Logf("helm install %s %s: release %s revision %d %s, every pod Ready %s after the install began",
		chartRef, version, rel.Name, rel.Version, rel.Info.Status, time.Since(start).Round(100*time.Millisecond))
	noRestarts(t, "the install")

	_, head := newRepo(t, "helm-installed", map[string]string{"app.yaml": "installed by helm\n"})
	gitRepository(t, cl, "default", "helm-installed", "helm-installed", time.Hour)
	gr := readyAt(t, cl, "default", "helm-installed", head, 3*time.Minute)
	if want := "http://source-controller." + ns + ".svc.cluster.local./"; !strings.HasPrefix(gr.Status.Artifact.URL, want) {
		t.Errorf("artifact URL %s, want it under %s", gr.Status.Artifact.URL, want)
	}
	download(t, gr.Status.Artifact.URL, gr.Status.Artifact.Digest)
	t.Logf("GitRepository Ready at %s, artifact downloaded from a pod", gr.Status.Artifact.Revision)

	t.Run("Upgrade", func(t *testing.T) { testHelmUpgrade(t, h, cl, chrt, gr) })
	t.Run("Uninstall", func(t *testing.T) { testHelmUninstall(t, h, cl, gr) })
}

// rolled are the values of the upgrade: one more fetcher, and a CPU
// request changed on every Headwater Deployment, so every one of their
// pods is replaced.
var rolled = map[string]any{
	"fetcher":        map[string]any{"replicas": 3, "resources": map[string]any{"requests": map[string]any{"cpu": "60m"}}},
	"watcher":        map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "60m"}}},
	"packager":       map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "60m"}}},
	"artifactServer": map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "60m"}}},
}

// rolledDeployments are the Deployments the upgrade's values replace
// every pod of.
var rolledDeployments = []string{"watcher", "fetcher", "packager", "artifact-server"}

// testHelmUpgrade upgrades the release with rolled while it watches the
// source installed before: Ready throughout, the same artifact, served
// throughout; four more sources, reconciled every 30 s through the
// upgrade, keep their artifacts; then a new commit is fetched.
func testHelmUpgrade(t *testing.T, h *helmClient, cl ctrlclient.Client, chrt *chart.Chart, gr *sourcev1.GitRepository) {
	ctx := context.Background()
	old := map[string]bool{}
	for _, d := range rolledDeployments {
		for _, p := range pods(t, d) {
			old[p.Name] = true
		}
	}
	// More sources, due every 30 s, so that jobs flow through the
	// fetchers, packagers and artifact-servers while they are replaced.
	busy := map[string]*sourcev1.GitRepository{}
	for i := range 4 {
		name := fmt.Sprintf("helm-busy-%d", i)
		_, head := newRepo(t, name, map[string]string{"app.yaml": name + "\n"})
		gitRepository(t, cl, "default", name, name, 30*time.Second)
		busy[name] = readyAt(t, cl, "default", name, head, 3*time.Minute)
	}
	w := watchSource(t, cl, gr, true)
	upgrade := action.NewUpgrade(h.cfg)
	upgrade.Namespace = ns
	upgrade.Wait = true
	upgrade.WaitForJobs = true
	upgrade.Timeout = 8 * time.Minute
	start := time.Now()
	rel, err := upgrade.RunWithContext(ctx, release, chrt, env.WithTestServers(rolled))
	if err != nil {
		w.stop()
		t.Fatalf("helm upgrade: %v\n%s", err, env.Diagnose(ns))
	}
	waitPodsReady(t, 3*time.Minute)
	took := time.Since(start)
	// Every pod of the four Deployments is new.
	kubetest.Eventually(t, 2*time.Minute, "every pod of the rolled Deployments replaced", func(context.Context) error {
		for _, d := range rolledDeployments {
			for _, p := range pods(t, d) {
				if old[p.Name] {
					return fmt.Errorf("pod %s of the release's first revision still there", p.Name)
				}
			}
		}
		return nil
	})
	seen := w.stop()
	t.Logf("helm upgrade: release revision %d %s, every pod Ready %s after the upgrade began; the source watched %s",
		rel.Version, rel.Info.Status, took.Round(100*time.Millisecond), seen)
	if rel.Version != 2 {
		t.Errorf("release revision %d after one upgrade, want 2", rel.Version)
	}
	if n := len(pods(t, "fetcher")); n != 3 {
		t.Errorf("%d fetcher pods after the upgrade, want 3", n)
	}
	for _, d := range rolledDeployments {
		for _, p := range pods(t, d) {
			if got := p.Spec.Containers[0].Resources.Requests.Cpu().String(); got != "60m" {
				t.Errorf("pod %s requests %s CPU, want the upgrade's 60m", p.Name, got)
			}
		}
	}
	noRestarts(t, "the upgrade")
	seen.check(t)
	// The busy sources went on being reconciled through the upgrade and
	// kept their artifacts: the same commit, the same digest.
	for name, before := range busy {
		after := readyAt(t, cl, "default", name, commitOfRevision(before.Status.Artifact.Revision), time.Minute)
		if after.Status.Artifact.Digest != before.Status.Artifact.Digest || after.Status.Artifact.URL != before.Status.Artifact.URL {
			t.Errorf("GitRepository %s: artifact %s %s after the upgrade, %s %s before", name,
				after.Status.Artifact.URL, after.Status.Artifact.Digest, before.Status.Artifact.URL, before.Status.Artifact.Digest)
		}
		if d, err := fetchArtifact(ctx, after.Status.Artifact); err != nil || d != after.Status.Artifact.Digest {
			t.Errorf("GitRepository %s: artifact after the upgrade: %s, %v; want %s", name, d, err, after.Status.Artifact.Digest)
		}
	}

	// The source survived as it was, and Headwater goes on fetching.
	readyAt(t, cl, gr.Namespace, gr.Name, commitOfRevision(gr.Status.Artifact.Revision), time.Minute)
	repo, _ := gitRepoFor(t, "helm-installed")
	if err := repo.Write(map[string]string{"app.yaml": "after the upgrade\n"}); err != nil {
		t.Fatal(err)
	}
	head, err := repo.Commit("after the upgrade")
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	requestReconcile(t, cl, gr)
	after := readyAt(t, cl, gr.Namespace, gr.Name, head, 2*time.Minute)
	took = time.Since(start)
	download(t, after.Status.Artifact.URL, after.Status.Artifact.Digest)
	t.Logf("after the upgrade: a new commit Ready at %s %s after the reconcile request, its artifact downloaded from a pod",
		after.Status.Artifact.Revision, took.Round(10*time.Millisecond))
}

// testHelmUninstall uninstalls the release: the workloads go, the CRDs
// and the sources stay.
func testHelmUninstall(t *testing.T, h *helmClient, cl ctrlclient.Client, gr *sourcev1.GitRepository) {
	ctx := context.Background()
	uninstall := action.NewUninstall(h.cfg)
	uninstall.Wait = true
	uninstall.Timeout = 5 * time.Minute
	start := time.Now()
	res, err := uninstall.Run(release)
	if err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	kubetest.Eventually(t, 3*time.Minute, "Headwater's pods gone", func(ctx context.Context) error {
		list, err := env.C.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=headwater"})
		if err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d pods left, such as %s", len(list.Items), list.Items[0].Name)
		}
		return nil
	})
	t.Logf("helm uninstall: every pod gone %s after it began; Helm says: %s", time.Since(start).Round(100*time.Millisecond),
		strings.Join(strings.Fields(res.Info), " "))
	if _, err := action.NewStatus(h.cfg).Run(release); !errors.Is(err, driver.ErrReleaseNotFound) {
		t.Errorf("helm status after the uninstall: %v, want %v", err, driver.ErrReleaseNotFound)
	}
	for _, d := range append([]string{"nats"}, rolledDeployments...) {
		if list := pods(t, d); len(list) > 0 {
			t.Errorf("pod %s left by the uninstall", list[0].Name)
		}
	}
	crds, err := headwaterCRDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"gitrepositories.source.toolkit.fluxcd.io", "helmcharts.source.toolkit.fluxcd.io",
		"ocirepositories.source.toolkit.fluxcd.io", "subscriptions.events.headwater.dev"} {
		if !crds[want] {
			t.Errorf("CRD %s removed by helm uninstall; the chart keeps its CRDs", want)
		}
	}
	var kept sourcev1.GitRepository
	if err := cl.Get(ctx, types.NamespacedName{Namespace: gr.Namespace, Name: gr.Name}, &kept); err != nil {
		t.Fatalf("GitRepository %s/%s after helm uninstall: %v", gr.Namespace, gr.Name, err)
	}
	if kept.Status.Artifact == nil || apimeta.FindStatusCondition(kept.Status.Conditions, "Ready") == nil {
		t.Errorf("GitRepository %s/%s lost its status with the uninstall: %+v", gr.Namespace, gr.Name, kept.Status)
	}
	t.Logf("after helm uninstall: %d CRDs of Headwater's kept, GitRepository %s/%s kept at %s", len(crds), gr.Namespace, gr.Name, kept.Status.Artifact.Revision)
}

// helmClient is the Helm v3 SDK pointed at the test cluster: the
// actions' configuration, its settings (caches in a temporary directory,
// never the user's), and a registry client for plain-HTTP registries.
type helmClient struct {
	cfg      *action.Configuration
	settings *cli.EnvSettings
	registry *helmregistry.Client
	log      *syncBuffer
}

// newHelm configures the Helm SDK for releases in namespace, as `helm
// --kubeconfig <the cluster's> -n namespace` would be.
func newHelm(t *testing.T, namespace string) *helmClient {
	t.Helper()
	dir := t.TempDir()
	settings := cli.New()
	settings.KubeConfig = env.C.Kubeconfig
	settings.SetNamespace(namespace)
	settings.RepositoryConfig = filepath.Join(dir, "repositories.yaml")
	settings.RepositoryCache = filepath.Join(dir, "cache")
	settings.RegistryConfig = filepath.Join(dir, "registry.json")
	rc, err := helmregistry.NewClient(helmregistry.ClientOptPlainHTTP(), helmregistry.ClientOptWriter(io.Discard),
		helmregistry.ClientOptCredentialsFile(settings.RegistryConfig))
	if err != nil {
		t.Fatal(err)
	}
	h := &helmClient{cfg: new(action.Configuration), settings: settings, registry: rc, log: &syncBuffer{}}
	if err := h.cfg.Init(settings.RESTClientGetter(), namespace, "secret", h.log.printf); err != nil {
		t.Fatalf("helm: %v", err)
	}
	h.cfg.RegistryClient = rc
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("helm's log:\n%s", h.log.tail(40))
		}
	})
	return h
}

// headwaterCRDs lists the names of the CRDs of Headwater's chart (Flux's
// source kinds and events.headwater.dev) that the cluster has.
func headwaterCRDs(ctx context.Context) (map[string]bool, error) {
	out, err := env.C.Kubectl(ctx, "get", "crd", "-o", "name").Run()
	if err != nil {
		return nil, fmt.Errorf("kubectl get crd: %w: %s", err, out)
	}
	crds := map[string]bool{}
	for _, l := range strings.Fields(out) {
		name := strings.TrimPrefix(l, "customresourcedefinition.apiextensions.k8s.io/")
		if strings.HasSuffix(name, ".source.toolkit.fluxcd.io") || strings.HasSuffix(name, ".headwater.dev") {
			crds[name] = true
		}
	}
	return crds, nil
}

// helmCleanup uninstalls the release if it is still there, then removes
// what an uninstall keeps (the sources, whose finalizer no watcher will
// remove now, the namespace, the CRDs and the volumes), so the next test
// starts from an empty cluster.
func helmCleanup(t *testing.T, h *helmClient) {
	ctx := context.Background()
	if _, err := action.NewStatus(h.cfg).Run(release); err == nil {
		u := action.NewUninstall(h.cfg)
		u.Wait = true
		u.Timeout = 5 * time.Minute
		if _, err := u.Run(release); err != nil {
			t.Errorf("cleanup: helm uninstall: %v", err)
		}
	}
	dropSources(t)
	removeNamespace(t, ns)
	crds, err := headwaterCRDs(ctx)
	if err != nil {
		t.Error(err)
		return
	}
	for name := range crds {
		if out, err := env.C.Kubectl(ctx, "delete", "crd", name, "--ignore-not-found", "--wait=true", "--timeout=2m").Run(); err != nil {
			t.Errorf("cleanup: delete CRD %s: %v\n%s", name, err, out)
		}
	}
}

// dropSources deletes every source of every kind, removing the
// finalizers no controller is left to remove.
func dropSources(t *testing.T) {
	ctx := context.Background()
	for _, kind := range []string{"gitrepositories", "buckets", "helmcharts", "helmrepositories", "ocirepositories"} {
		out, err := env.C.Kubectl(ctx, "get", kind, "--all-namespaces", "-o", `jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}`).Run()
		if err != nil {
			continue // the CRD is gone
		}
		for _, key := range strings.Fields(out) {
			namespace, name, _ := strings.Cut(key, "/")
			_, _ = env.C.Kubectl(ctx, "-n", namespace, "patch", kind, name, "--type=merge", "-p", `{"metadata":{"finalizers":null}}`).Run()
			_, _ = env.C.Kubectl(ctx, "-n", namespace, "delete", kind, name, "--ignore-not-found", "--wait=true", "--timeout=1m").Run()
		}
	}
}

// removeNamespace deletes namespace name, waits until it is gone, and
// deletes the volumes its claims left.
func removeNamespace(t *testing.T, name string) {
	ctx := context.Background()
	if err := env.C.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete namespace %s: %v", name, err)
	}
	err := kubetest.Poll(ctx, 5*time.Minute, func(ctx context.Context) error {
		if _, err := env.C.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("namespace %s still there (%v)", name, err)
		}
		pvs, err := env.C.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, pv := range pvs.Items {
			_ = env.C.Client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{})
		}
		return nil
	})
	if err != nil {
		t.Errorf("remove namespace %s: %v", name, err)
	}
}

// noRestarts fails t for every pod of the namespace that restarted during
// what.
func noRestarts(t *testing.T, what string) {
	t.Helper()
	for name, n := range restartCounts(t) {
		if n > 0 {
			t.Errorf("pod %s restarted %d times during %s", name, n, what)
		}
	}
}

// commitOfRevision is the commit of a Git revision, main@sha1:<commit>.
func commitOfRevision(rev string) string {
	_, c, _ := strings.Cut(rev, "sha1:")
	return c
}

// sourceWatch polls a source while something happens to the cluster and
// records every moment it was not as it was when the watch began (Ready
// with the same artifact), and, when asked, every failed download of its
// artifact through the Service source-controller.
type sourceWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	seen   watched
}

// watched is what a sourceWatch saw.
type watched struct {
	polls, downloads  int
	notReady, changed []string
	failedDownloads   []string
	firstFail         time.Time
	lastFail          time.Time
}

func (w watched) String() string {
	s := fmt.Sprintf("%d times: Ready with the same artifact %d times", w.polls, w.polls-len(w.notReady)-len(w.changed))
	if w.downloads > 0 {
		s += fmt.Sprintf("; %d downloads of the artifact, %d failed", w.downloads, len(w.failedDownloads))
		if len(w.failedDownloads) > 0 {
			s += fmt.Sprintf(" (over %s: %s)", w.lastFail.Sub(w.firstFail).Round(10*time.Millisecond), w.failedDownloads[0])
		}
	}
	return s
}

// check fails t for every moment the source was not Ready or had another
// artifact, and for every failed download.
func (w watched) check(t *testing.T) {
	t.Helper()
	for _, s := range w.notReady {
		t.Errorf("source not Ready: %s", s)
	}
	for _, s := range w.changed {
		t.Errorf("source's artifact changed: %s", s)
	}
	for _, s := range w.failedDownloads {
		t.Errorf("artifact download failed: %s", s)
	}
	if w.polls == 0 {
		t.Error("the source was never read while watched")
	}
}

// watchSource starts polling gr every 100 ms (and downloading its
// artifact, when downloads) until stop.
func watchSource(t *testing.T, cl ctrlclient.Client, gr *sourcev1.GitRepository, downloads bool) *sourceWatch {
	t.Helper()
	want := *gr.Status.Artifact
	ctx, cancel := context.WithCancel(context.Background())
	w := &sourceWatch{cancel: cancel, done: make(chan struct{})}
	key := types.NamespacedName{Namespace: gr.Namespace, Name: gr.Name}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			var now sourcev1.GitRepository
			if err := cl.Get(ctx, key, &now); err == nil {
				w.seen.polls++
				ready := apimeta.FindStatusCondition(now.Status.Conditions, "Ready")
				at := time.Now().Format("15:04:05.000")
				switch {
				case ready == nil || ready.Status != metav1.ConditionTrue:
					w.seen.notReady = append(w.seen.notReady, fmt.Sprintf("%s: %+v", at, ready))
				case now.Status.Artifact == nil || now.Status.Artifact.Revision != want.Revision || now.Status.Artifact.Digest != want.Digest || now.Status.Artifact.URL != want.URL:
					w.seen.changed = append(w.seen.changed, fmt.Sprintf("%s: %+v", at, now.Status.Artifact))
				}
			}
			if downloads {
				w.seen.downloads++
				if d, err := fetchArtifact(ctx, &want); (err != nil || d != want.Digest) && ctx.Err() == nil {
					now := time.Now()
					if w.seen.firstFail.IsZero() {
						w.seen.firstFail = now
					}
					w.seen.lastFail = now
					w.seen.failedDownloads = append(w.seen.failedDownloads, fmt.Sprintf("%s: digest %s, %v", now.Format("15:04:05.000"), d, err))
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

// stop ends the watch and returns what it saw.
func (w *sourceWatch) stop() watched {
	w.cancel()
	<-w.done
	return w.seen
}

// syncBuffer keeps the Helm SDK's log lines for a failing test.
type syncBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *syncBuffer) printf(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, fmt.Sprintf(format, args...))
}

func (b *syncBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines[max(0, len(b.lines)-n):], "\n")
}
