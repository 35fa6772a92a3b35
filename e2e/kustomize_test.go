package e2e

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/headwater-gitops/headwater/e2e/harness"
)

// kustomizationGVK is Flux's Kustomization, read unstructured: the e2e
// module does not link kustomize-controller's API.
var kustomizationGVK = schema.GroupVersionKind{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Kind: "Kustomization"}

// kustomizeControllerDir is the directory of Flux's kustomize-controller
// binary and its CRDs (crds/), found on HEADWATER_FLUX_CRDS as the
// Makefile exports it.
func kustomizeControllerDir(t *testing.T) string {
	t.Helper()
	for _, dir := range filepath.SplitList(os.Getenv("HEADWATER_FLUX_CRDS")) {
		if !strings.Contains(filepath.Base(filepath.Dir(dir)), "kustomize-controller") {
			continue
		}
		dir = filepath.Dir(dir)
		if fi, err := os.Stat(filepath.Join(dir, "kustomize-controller")); err != nil || fi.IsDir() {
			t.Fatalf("Flux's kustomize-controller is not built in %s: run `make flux-kustomize-controller` (`make test` runs it first)", dir)
		}
		return dir
	}
	t.Fatal("HEADWATER_FLUX_CRDS names no kustomize-controller directory: run `make flux-kustomize-controller` and the tests through `make test`")
	return ""
}

// startKustomizeController installs the Kustomization CRD and runs Flux's
// kustomize-controller against the test API server with the
// ExternalArtifact feature gate, until the test ends.
func startKustomizeController(t *testing.T) {
	t.Helper()
	dir := kustomizeControllerDir(t)
	if _, err := envtest.InstallCRDs(env.RESTConfig, envtest.CRDInstallOptions{Paths: []string{filepath.Join(dir, "crds")}}); err != nil {
		t.Fatalf("install the Kustomization CRD: %v", err)
	}
	ports, err := harness.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "kustomize-controller"),
		fmt.Sprintf("--metrics-addr=127.0.0.1:%d", ports[0]), fmt.Sprintf("--health-addr=127.0.0.1:%d", ports[1]),
		"--enable-leader-election=false", "--feature-gates=ExternalArtifact=true", "--no-remote-bases=true", "--log-level=debug")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+env.Kubeconfig, "RUNTIME_NAMESPACE="+namespace)
	logPath := filepath.Join(t.TempDir(), "kustomize-controller.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start kustomize-controller: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		_ = logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				lines := strings.Split(string(b), "\n")
				t.Logf("--- kustomize-controller\n%s", strings.Join(lines[max(0, len(lines)-60):], "\n"))
			}
		}
	})
}

// createKustomization creates a Kustomization applying the root of the
// ExternalArtifact source, and deletes it when the test ends.
func createKustomization(t *testing.T, name, source string) {
	t.Helper()
	k := &unstructured.Unstructured{}
	k.SetGroupVersionKind(kustomizationGVK)
	k.SetNamespace(namespace)
	k.SetName(name)
	k.Object["spec"] = map[string]any{
		"interval":        "10m",
		"path":            "./",
		"prune":           true,
		"targetNamespace": namespace,
		"sourceRef":       map[string]any{"kind": sourcev1.ExternalArtifactKind, "name": source},
	}
	createObject(t, k)
}

// kustomizationApplied waits until the Kustomization has applied revision
// rev (status.lastAppliedRevision) and is Ready.
func kustomizationApplied(t *testing.T, name, rev string) {
	t.Helper()
	eventually(t, fmt.Sprintf("Kustomization %s applied %s", name, rev), func() error {
		k := &unstructured.Unstructured{}
		k.SetGroupVersionKind(kustomizationGVK)
		if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, k); err != nil {
			return err
		}
		got, _, _ := unstructured.NestedString(k.Object, "status", "lastAppliedRevision")
		conds, _, _ := unstructured.NestedSlice(k.Object, "status", "conditions")
		ready := false
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == meta.ReadyCondition && m["status"] == "True" {
				ready = true
			}
		}
		if got != rev || !ready {
			return fmt.Errorf("lastAppliedRevision %q, Ready %v, conditions %v", got, ready, conds)
		}
		return nil
	})
}

// configMapData waits for the ConfigMap name and returns it.
func configMap(t *testing.T, name string, ok func(*corev1.ConfigMap) bool) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{}
	eventually(t, "ConfigMap "+name, func() error {
		if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, cm); err != nil {
			return err
		}
		if !ok(cm) {
			return fmt.Errorf("data %v", cm.Data)
		}
		return nil
	})
	return cm
}

// TestKustomizeControllerAppliesExternalArtifacts runs Flux's own
// kustomize-controller (--feature-gates=ExternalArtifact=true) with one
// Kustomization per ExternalArtifact of a monorepo split by an
// ArtifactGenerator: each applies its app; after a commit touching app b
// only, b's Kustomization applies b's new revision while a's keeps its
// revision and leaves a's objects untouched. An HTTPSource (a plug-in
// kind) is applied the same way, through the ExternalArtifact the watcher
// publishes for it.
func TestKustomizeControllerAppliesExternalArtifacts(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	startKustomizeController(t)
	const src, gen = "kc-mono", "kc-split"
	cmYAML := func(name, color string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\ndata:\n  color: %s\n", name, color)
	}
	files := map[string]string{
		"apps/a/configmap.yaml": cmYAML("kc-app-a", "blue"),
		"apps/b/configmap.yaml": cmYAML("kc-app-b", "blue"),
	}
	repo, c1 := newRepo(t, src, files)
	createSource(t, src, env.Git.RepoURL(src), branch)
	waitArtifact(t, src, revision(c1))
	createObject(t, perAppGenerator(gen, src, "kc", "a", "b"))
	eaA := waitExternalArtifact(t, "kc-a", nil)
	eaB := waitExternalArtifact(t, "kc-b", nil)
	createKustomization(t, "kc-a", "kc-a")
	createKustomization(t, "kc-b", "kc-b")
	kustomizationApplied(t, "kc-a", eaA.Status.Artifact.Revision)
	kustomizationApplied(t, "kc-b", eaB.Status.Artifact.Revision)
	blue := func(cm *corev1.ConfigMap) bool { return cm.Data["color"] == "blue" }
	cmA := configMap(t, "kc-app-a", blue)
	configMap(t, "kc-app-b", blue)

	files["apps/b/configmap.yaml"] = cmYAML("kc-app-b", "green")
	c2 := commit(t, repo, files, "Paint b green")
	requestReconcile(t, src)
	waitArtifact(t, src, revision(c2))
	eaB2 := waitExternalArtifact(t, "kc-b", func(a *meta.Artifact) bool { return a.Revision != eaB.Status.Artifact.Revision })
	kustomizationApplied(t, "kc-b", eaB2.Status.Artifact.Revision)
	configMap(t, "kc-app-b", func(cm *corev1.ConfigMap) bool { return cm.Data["color"] == "green" })

	kustomizationApplied(t, "kc-a", eaA.Status.Artifact.Revision)
	if a := waitExternalArtifact(t, "kc-a", nil); a.Status.Artifact.Revision != eaA.Status.Artifact.Revision {
		t.Errorf("kc-a got a new revision from a commit that did not touch it")
	}
	if got := configMap(t, "kc-app-a", blue); got.ResourceVersion != cmA.ResourceVersion {
		t.Errorf("ConfigMap kc-app-a was written again: resourceVersion %s -> %s", cmA.ResourceVersion, got.ResourceVersion)
	}

	// A plug-in kind's artifact, through the ExternalArtifact the watcher
	// publishes for it: an HTTPSource of a tarball, applied unchanged.
	bundle := &bundleServer{}
	bundle.serve(gzTar(t, [2]string{"configmap.yaml", cmYAML("kc-http", "red")}))
	ts := httptest.NewServer(bundle)
	t.Cleanup(ts.Close)
	hs := &unstructured.Unstructured{}
	hs.SetGroupVersionKind(httpSourceGVK)
	hs.SetNamespace(namespace)
	hs.SetName("kc-http")
	hs.Object["spec"] = map[string]any{"url": ts.URL + "/bundle.tar.gz", "interval": "1h"}
	createObject(t, hs)
	eaHTTP := waitExternalArtifact(t, "kc-http", nil)
	createKustomization(t, "kc-http", "kc-http")
	kustomizationApplied(t, "kc-http", eaHTTP.Status.Artifact.Revision)
	configMap(t, "kc-http", func(cm *corev1.ConfigMap) bool { return cm.Data["color"] == "red" })
}
