package clustertest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
)

// TestOverlays installs every other shipped overlay as shipped, with what
// each asks the user to provide first, and checks each the same way: every
// pod Ready, a GitRepository Ready, its artifact downloaded from a pod.
func TestOverlays(t *testing.T) {
	requireFull(t)
	for _, o := range []struct {
		dir     string
		prepare func(t *testing.T)
	}{
		{"overlays/single-node", nil},
		{"overlays/rwx", nil},
		{"overlays/s3", nil}, // its Secret comes late: see missingS3Secret
		{"overlays/production", func(t *testing.T) { env.S3Secret(t, ns); env.NATSTLSSecrets(t, ns) }},
		// Flux's namespace, which `flux install` made: the artifacts are
		// served as Flux's source-controller serves them.
		{"overlays/flux-system", nil},
		{"", componentsInstall},
	} {
		name := o.dir
		if name == "" {
			name = "components"
		}
		t.Run(strings.ReplaceAll(name, "/", "-"), func(t *testing.T) {
			dir := o.dir
			if dir == "overlays/flux-system" {
				fluxInstalled(t)
			}
			if o.prepare != nil {
				env.EnsureNamespace(t, ns)
				o.prepare(t)
			}
			if dir == "" {
				dir = componentsDir
			}
			cl := env.Client(t)
			if dir == "overlays/s3" {
				missingS3Secret(t)
			} else {
				install(t, dir)
			}
			repo := "overlay-" + strings.NewReplacer("/", "-", ".", "-").Replace(filepath.Base(dir))
			_, head := newRepo(t, repo, map[string]string{"app.yaml": repo + "\n"})
			gitRepository(t, cl, "default", repo, repo, time.Minute)
			gr := readyAt(t, cl, "default", repo, head, 3*time.Minute)
			if want := "http://source-controller." + ns + ".svc.cluster.local./"; !strings.HasPrefix(gr.Status.Artifact.URL, want) {
				t.Errorf("artifact URL %s, want it under %s", gr.Status.Artifact.URL, want)
			}
			download(t, gr.Status.Artifact.URL, gr.Status.Artifact.Digest)
			if o.dir == "" {
				httpSourceOnNode(t, cl)
			}
		})
	}
}

// httpSourceOnNode checks components/httpsource on the node: an HTTPSource
// of a tarball served from the node's link goes Ready, its artifact (and
// its ExternalArtifact's, the same) downloads from a pod with its digest.
func httpSourceOnNode(t *testing.T, cl ctrlclient.Client) {
	t.Helper()
	var tarball bytes.Buffer
	gz := gzip.NewWriter(&tarball)
	tw := tar.NewWriter(gz)
	body := "kind: ConfigMap\n"
	if err := tw.WriteHeader(&tar.Header{Name: "deploy/app.yaml", Mode: 0o644, Size: int64(len(body))}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write([]byte(body))
	_ = tw.Close()
	_ = gz.Close()
	ln, err := net.Listen("tcp", net.JoinHostPort(env.C.HostIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/gzip")
		w.Header().Set("ETag", `"v1"`)
		_, _ = w.Write(tarball.Bytes())
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	gvk := schema.GroupVersionKind{Group: "source.headwater.dev", Version: "v1alpha1", Kind: "HTTPSource"}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	obj.SetNamespace("default")
	obj.SetName("bundle")
	obj.Object["spec"] = map[string]any{"url": "http://" + ln.Addr().String() + "/bundle.tar.gz", "interval": "10m"}
	if err := cl.Create(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Delete(context.Background(), obj) })
	var art map[string]any
	kubetest.Eventually(t, 3*time.Minute, "HTTPSource bundle Ready with an artifact", func(ctx context.Context) error {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(gvk)
		if err := cl.Get(ctx, types.NamespacedName{Namespace: "default", Name: "bundle"}, got); err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == "Ready" && m["status"] != "True" {
				return fmt.Errorf("Ready %v: %v", m["status"], m["message"])
			}
		}
		a, ok, _ := unstructured.NestedMap(got.Object, "status", "artifact")
		if !ok || len(conds) == 0 {
			return fmt.Errorf("no artifact yet: %v", got.Object["status"])
		}
		art = a
		return nil
	})
	url, digest := fmt.Sprint(art["url"]), fmt.Sprint(art["digest"])
	download(t, url, digest)
	ea := &sourcev1.ExternalArtifact{}
	kubetest.Eventually(t, time.Minute, "ExternalArtifact bundle", func(ctx context.Context) error {
		if err := cl.Get(ctx, types.NamespacedName{Namespace: "default", Name: "bundle"}, ea); err != nil {
			return err
		}
		if ea.Status.Artifact == nil || ea.Status.Artifact.Digest != digest {
			return fmt.Errorf("artifact %+v, want digest %s", ea.Status.Artifact, digest)
		}
		return nil
	})
	if ref := ea.Spec.SourceRef; ref == nil || ref.Kind != "HTTPSource" || ref.Name != "bundle" {
		t.Errorf("ExternalArtifact sourceRef %+v, want the HTTPSource", ref)
	}
	t.Logf("HTTPSource bundle Ready, artifact %s downloaded from a pod; ExternalArtifact bundle the same", url)
}

// missingS3Secret installs overlays/s3 before its Secret exists, as a user
// who skipped that step would: the storage services wait in
// CreateContainerConfigError, saying which Secret, and start by themselves
// once it is made.
func missingS3Secret(t *testing.T) {
	env.Kubectl(t, "apply", "-k", env.DeployPath("overlays/s3"))
	t.Cleanup(func() { uninstall(t, "overlays/s3") })
	p := waitPodWaiting(t, "fetcher", "CreateContainerConfigError")
	ev := waitEvent(t, p.Name, "Failed", `secret "headwater-s3" not found`)
	t.Logf("kubectl get pods: %s CreateContainerConfigError; Event Failed: %s", p.Name, ev.Message)
	env.S3Secret(t, ns)
	waitPodsReady(t, 8*time.Minute)
}

// componentsDir is a kustomization of the test's own: the default install
// with the optional components that run pods (dispatcher, receivers, the
// HTTPSource plug-in kind and its fetcher).
var componentsDir string

func componentsInstall(t *testing.T) {
	dir := t.TempDir()
	// kustomize takes only relative paths to other kustomizations.
	deploy, err := filepath.Rel(dir, env.Deploy)
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [%q]
components: [%q, %q, %q]
`, deploy, filepath.Join(deploy, "components", "dispatcher"), filepath.Join(deploy, "components", "receivers"),
		filepath.Join(deploy, "components", "httpsource"))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	componentsDir = dir
}

// TestStorageFull fills the single-node overlay's volume: the source that
// does not fit fails with the storage's own words in its conditions and a
// Warning Event, the source stored before keeps its artifact, and nothing
// restarts.
func TestStorageFull(t *testing.T) {
	requireFull(t)
	env.C.LimitVolume("headwater-artifacts", "24m")
	defer env.C.LimitVolume("headwater-artifacts", "")
	cl := env.Client(t)
	install(t, "overlays/single-node")
	_, head := newRepo(t, "small", map[string]string{"app.yaml": "small\n"})
	gitRepository(t, cl, "default", "small", "small", time.Minute)
	small := readyAt(t, cl, "default", "small", head, 3*time.Minute)
	restarts := restartCounts(t)

	big := make(map[string]string)
	for i := range 8 {
		big[fmt.Sprintf("blob-%d.bin", i)] = randomText(4 << 20)
	}
	newRepo(t, "big", big)
	gitRepository(t, cl, "default", "big", "big", time.Minute)
	kubetest.Eventually(t, 3*time.Minute, "big source failing on a full volume", func(ctx context.Context) error {
		var msgs []string
		for _, e := range events(t, "default", "big", "") {
			msgs = append(msgs, e.Reason+": "+e.Message)
		}
		for _, m := range msgs {
			if strings.Contains(m, "no space left on device") {
				t.Logf("Event %s", m)
				return nil
			}
		}
		return fmt.Errorf("no Event says the volume is full yet: %v", msgs)
	})
	var bigGR sourcev1.GitRepository
	if err := cl.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: "big"}, &bigGR); err != nil {
		t.Fatal(err)
	}
	if ready := apimeta.FindStatusCondition(bigGR.Status.Conditions, "Ready"); ready == nil || ready.Status != metav1.ConditionFalse ||
		!strings.Contains(ready.Message, "no space left on device") {
		t.Errorf("big source's Ready condition does not say the volume is full: %+v", ready)
	} else {
		t.Logf("kubectl get gitrepository big: Ready=False %s: %s", ready.Reason, ready.Message)
	}
	gr := small
	if err := cl.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: "small"}, gr); err != nil {
		t.Fatal(err)
	}
	digest, err := fetchArtifact(context.Background(), gr.Status.Artifact)
	if err != nil || digest != gr.Status.Artifact.Digest {
		t.Errorf("the artifact stored before the volume filled: %s, %v; want %s", digest, err, gr.Status.Artifact.Digest)
	}
	for name, n := range restartCounts(t) {
		if before, ok := restarts[name]; ok && n != before {
			t.Errorf("pod %s restarted while the volume was full (%d -> %d)", name, before, n)
		}
	}
}

// randomText is n bytes of base64 text that does not compress much.
func randomText(n int) string {
	b := make([]byte, n*3/4)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

// fluxInstalled makes what `flux install` leaves for the flux-system
// overlay: the namespace flux-system and Flux's source CRDs (the overlay
// installs neither; Headwater's deploy/crds are generated from the same
// API module), removed when the test ends. Headwater's own Subscription
// CRD is not among them: the overlay and the chart install it.
func fluxInstalled(t *testing.T) {
	t.Helper()
	useNamespace(t, "flux-system")
	files, err := filepath.Glob(filepath.Join(env.Deploy, "crds", "source.toolkit.fluxcd.io_*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("Flux's source CRDs in deploy/crds: %v (%d files)", err, len(files))
	}
	args := func(verb string, more ...string) []string {
		a := []string{verb}
		for _, f := range files {
			a = append(a, "-f", f)
		}
		return append(a, more...)
	}
	env.Kubectl(t, args("apply")...)
	t.Cleanup(func() {
		if out, err := env.C.Kubectl(context.Background(), args("delete", "--ignore-not-found", "--wait=true", "--timeout=3m")...).Run(); err != nil {
			t.Errorf("delete the CRDs: %v\n%s", err, out)
		}
	})
}
