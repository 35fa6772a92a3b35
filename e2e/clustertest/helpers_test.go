package clustertest

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// ns is where every overlay installs Headwater.
// ns is the namespace Headwater is installed in: the default install's,
// or, for the duration of a test that installs elsewhere, that one's
// (useNamespace). Tests of this package run one at a time.
var ns = "headwater-system"

// useNamespace installs into name for the rest of the test: it creates
// the namespace, as a user of an overlay without a Namespace object
// would, and restores the default when the test ends, after its
// uninstall.
func useNamespace(t *testing.T, name string) {
	t.Helper()
	old := ns
	ns = name
	t.Cleanup(func() { ns = old })
	ensureNamespace(t, name)
}

// eventually polls check every half second until it returns nil, failing
// t with the last error after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, check func(ctx context.Context) error) {
	t.Helper()
	if err := poll(context.Background(), timeout, check); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eventuallyEvery is eventually polling every interval: for a wait whose
// duration the test reports.
func eventuallyEvery(t *testing.T, timeout, interval time.Duration, what string, check func(ctx context.Context) error) {
	t.Helper()
	if err := pollEvery(context.Background(), timeout, interval, check); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func poll(ctx context.Context, timeout time.Duration, check func(ctx context.Context) error) error {
	return pollEvery(ctx, timeout, 500*time.Millisecond, check)
}

func pollEvery(ctx context.Context, timeout, interval time.Duration, check func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if last = check(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s: %w", timeout, last)
		case <-time.After(interval):
		}
	}
}

// kubectl runs kubectl with args and fails t on error.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := env.c.Kubectl(context.Background(), args...).Run()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// client is a controller-runtime client of the cluster that knows the
// Flux source kinds.
func client(t *testing.T) ctrlclient.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := sourcev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cl, err := ctrlclient.New(env.c.Config, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// install applies the kustomization at dir (relative to deploy/, or
// absolute) as a
// user would and waits until every pod of the namespace is Ready (the
// setup Job's pod: Succeeded). It returns how long that took, and
// uninstalls when the test ends.
func install(t *testing.T, dir string) time.Duration {
	t.Helper()
	start := time.Now()
	kubectl(t, "apply", "-k", deployPath(dir))
	t.Cleanup(func() { uninstall(t, dir) })
	waitPodsReady(t, 8*time.Minute)
	took := time.Since(start)
	t.Logf("%s: every pod Ready %s after kubectl apply -k", dir, took.Round(100*time.Millisecond))
	// Pods that start before NATS or the object store wait for them, not
	// crash: an install restarts nothing.
	for name, n := range restartCounts(t) {
		if n > 0 {
			tailLines := int64(5)
			logs, _ := env.c.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Previous: true, TailLines: &tailLines}).DoRaw(context.Background())
			t.Errorf("pod %s restarted %d times during the install; its previous container's last lines:\n%s", name, n, logs)
		}
	}
	return took
}

// deployPath is a kustomization over dir (inside deploy/, or dir itself
// when absolute: a kustomization of a test's own) that lets the services
// reach the test's servers, as an operator allows an in-cluster git
// server: the egress policy refuses private addresses to tenants' URLs by
// default, and the node's link and Services are private
// (cluster.TestServerRanges). The same dir always gives the same
// kustomization, so what an install applied its uninstall deletes.
func deployPath(dir string) string {
	target := dir
	if !filepath.IsAbs(dir) {
		target = filepath.Join(env.deploy, dir)
	}
	sum := sha256.Sum256([]byte(target))
	wrap := filepath.Join(env.kustomizations, hex.EncodeToString(sum[:8]))
	// kustomize takes only relative paths to other kustomizations.
	rel, err := filepath.Rel(wrap, target)
	if err != nil {
		panic(fmt.Sprintf("kustomization over %s: %v", target, err))
	}
	if err := os.MkdirAll(wrap, 0o755); err != nil {
		panic(fmt.Sprintf("kustomization over %s: %v", target, err))
	}
	if err := os.WriteFile(filepath.Join(wrap, "kustomization.yaml"), []byte(allowTestServers(rel)), 0o644); err != nil {
		panic(fmt.Sprintf("kustomization over %s: %v", target, err))
	}
	return wrap
}

// allowTestServers is a kustomization of resource (a relative path) that
// sets HEADWATER_ALLOWED_DESTINATIONS to the test servers' ranges in every
// Deployment that requests tenants' URLs it renders (docs/security.md,
// "Egress").
func allowTestServers(resource string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%q]\npatches:\n", resource)
	allowed := strings.Join(env.c.TestServerRanges(), ",")
	for _, d := range []string{"fetcher", "dispatcher", "httpsource-fetcher"} {
		fmt.Fprintf(&b, `  - target: {kind: Deployment, name: %[1]s}
    patch: |-
      {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": %[1]q},
       "spec": {"template": {"spec": {"containers": [{"name": %[1]q, "env": [{"name": "HEADWATER_ALLOWED_DESTINATIONS", "value": %[2]q}]}]}}}}
`, d, allowed)
	}
	return b.String()
}

// withTestServers returns the chart's values vals (nil: the defaults)
// with egress.allowedDestinations the test servers' ranges, as
// deployPath's kustomization sets them.
func withTestServers(vals map[string]any) map[string]any {
	out := map[string]any{"egress": map[string]any{"allowedDestinations": env.c.TestServerRanges()}}
	for k, v := range vals {
		out[k] = v
	}
	return out
}

// uninstall deletes every source first (the watcher must still be there
// to remove their finalizers), then what dir installed.
func uninstall(t *testing.T, dir string) {
	t.Helper()
	ctx := context.Background()
	for _, kind := range []string{"gitrepositories", "buckets", "helmcharts", "helmrepositories", "ocirepositories"} {
		_, _ = env.c.Kubectl(ctx, "delete", kind, "--all", "--all-namespaces", "--wait=true", "--timeout=3m").Run()
	}
	if out, err := env.c.Kubectl(ctx, "delete", "-k", deployPath(dir), "--ignore-not-found", "--wait=true", "--timeout=5m").Run(); err != nil {
		t.Errorf("uninstall %s: %v\n%s", dir, err, out)
	}
	// An overlay that installs into a namespace it does not own (Flux's
	// flux-system) leaves the namespace: the test made it, and removes it.
	removeNamespace(t, ns)
}

// waitPodsReady waits until the namespace has pods and every one is Ready
// (or, for a Job's pod, Succeeded).
func waitPodsReady(t *testing.T, timeout time.Duration) {
	t.Helper()
	if err := poll(context.Background(), timeout, podsReady); err != nil {
		t.Fatalf("every pod Ready: %v\n%s", err, diagnose())
	}
}

// diagnose is what an operator would look at when pods are not Ready:
// each such pod's container states, the tail of its logs (of the previous
// container when it restarted) and the namespace's Warning Events.
func diagnose() string {
	ctx := context.Background()
	var b strings.Builder
	list, err := env.c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for i := range list.Items {
		p := &list.Items[i]
		if podReady(p) || p.Status.Phase == corev1.PodSucceeded {
			continue
		}
		fmt.Fprintf(&b, "--- pod %s: %s%s\n", p.Name, p.Status.Phase, waiting(p))
		for _, cs := range p.Status.ContainerStatuses {
			if term := cs.LastTerminationState.Terminated; term != nil {
				fmt.Fprintf(&b, "    %s last exited %d (%s): %s\n", cs.Name, term.ExitCode, term.Reason, term.Message)
			}
			tailLines := int64(15)
			logs, err := env.c.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: cs.Name, TailLines: &tailLines, Previous: cs.RestartCount > 0}).DoRaw(ctx)
			if err != nil {
				fmt.Fprintf(&b, "    logs: %v\n", err)
				continue
			}
			for _, l := range strings.Split(strings.TrimSpace(string(logs)), "\n") {
				fmt.Fprintf(&b, "    | %s\n", l)
			}
		}
	}
	evs, err := env.c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err == nil {
		for _, e := range evs.Items {
			fmt.Fprintf(&b, "--- Warning %s %s/%s (x%d): %s\n", e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Count, e.Message)
		}
	}
	return b.String()
}

func podsReady(ctx context.Context) error {
	pods, err := env.c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	if len(pods.Items) == 0 {
		return fmt.Errorf("no pods in %s yet", ns)
	}
	var notReady []string
	for i := range pods.Items {
		p := &pods.Items[i]
		if isJobPod(p) {
			if p.Status.Phase != corev1.PodSucceeded {
				notReady = append(notReady, p.Name+" ("+string(p.Status.Phase)+waiting(p)+")")
			}
			continue
		}
		if p.DeletionTimestamp != nil || !podReady(p) {
			notReady = append(notReady, p.Name+" ("+string(p.Status.Phase)+waiting(p)+")")
		}
	}
	if len(notReady) > 0 {
		return fmt.Errorf("not Ready: %s", strings.Join(notReady, ", "))
	}
	return nil
}

func isJobPod(p *corev1.Pod) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == "Job" {
			return true
		}
	}
	return false
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waiting says why a pod's containers wait, if they do.
func waiting(p *corev1.Pod) string {
	var s []string
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			s = append(s, cs.Name+": "+w.Reason+" "+w.Message)
		}
	}
	if len(s) == 0 {
		return ""
	}
	return "; " + strings.Join(s, "; ")
}

// pods lists the pods of a component (app.kubernetes.io/name).
func pods(t *testing.T, name string) []corev1.Pod {
	t.Helper()
	list, err := env.c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// newRepo makes a served repository name with files on branch main and
// returns it with its head commit.
func newRepo(t *testing.T, name string, files map[string]string) (*gitserver.Repo, string) {
	t.Helper()
	if err := os.MkdirAll(env.gitRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := gitserver.NewRepo(env.gitRoot, name, filepath.Join(env.repoRoot, name), "main")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Write(files); err != nil {
		t.Fatal(err)
	}
	head, err := r.Commit("initial")
	if err != nil {
		t.Fatal(err)
	}
	repos.Store(name, r)
	return r, head
}

// repos are the repositories newRepo made, by name.
var repos sync.Map

// gitRepoFor returns the repository newRepo made as name, and its head.
func gitRepoFor(t *testing.T, name string) (*gitserver.Repo, string) {
	t.Helper()
	v, ok := repos.Load(name)
	if !ok {
		t.Fatalf("no repository %s", name)
	}
	r := v.(*gitserver.Repo)
	head, err := r.Output("rev-parse", "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	return r, head
}

// gitRepository creates a GitRepository in namespace for repo on main.
func gitRepository(t *testing.T, cl ctrlclient.Client, namespace, name, repo string, interval time.Duration) *sourcev1.GitRepository {
	t.Helper()
	ensureNamespace(t, namespace)
	gr := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: sourcev1.GitRepositorySpec{
			URL:       env.git.RepoURL(repo),
			Interval:  metav1.Duration{Duration: interval},
			Reference: &sourcev1.GitRepositoryRef{Branch: "main"},
		},
	}
	if err := cl.Create(context.Background(), gr); err != nil {
		t.Fatalf("create GitRepository %s/%s: %v", namespace, name, err)
	}
	return gr
}

func ensureNamespace(t *testing.T, name string) {
	t.Helper()
	_, err := env.c.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// readyAt waits until the GitRepository is Ready with an artifact of
// commit and returns it.
func readyAt(t *testing.T, cl ctrlclient.Client, namespace, name, commit string, timeout time.Duration) *sourcev1.GitRepository {
	t.Helper()
	var gr sourcev1.GitRepository
	eventually(t, timeout, fmt.Sprintf("GitRepository %s/%s Ready at %s", namespace, name, commit), func(ctx context.Context) error {
		return isReadyAt(ctx, cl, types.NamespacedName{Namespace: namespace, Name: name}, commit, &gr)
	})
	return &gr
}

func isReadyAt(ctx context.Context, cl ctrlclient.Client, key types.NamespacedName, commit string, gr *sourcev1.GitRepository) error {
	if err := cl.Get(ctx, key, gr); err != nil {
		return err
	}
	ready := apimeta.FindStatusCondition(gr.Status.Conditions, "Ready")
	if ready == nil || ready.Status != metav1.ConditionTrue {
		return fmt.Errorf("not Ready: %+v", ready)
	}
	if gr.Status.Artifact == nil || !strings.HasSuffix(gr.Status.Artifact.Revision, "sha1:"+commit) {
		return fmt.Errorf("artifact %+v, want revision main@sha1:%s", gr.Status.Artifact, commit)
	}
	return nil
}

// download runs the probe in a pod of namespace flux-system (where
// Flux's consumers run, and which the artifact-server's NetworkPolicy
// admits), which downloads url and checks its digest. It returns the
// probe's output.
func download(t *testing.T, url, digest string) string {
	t.Helper()
	ensureNamespace(t, "flux-system")
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: "flux-system"},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "probe", Image: cluster.ProbeImage, ImagePullPolicy: corev1.PullNever,
				Args: []string{"get", url, digest},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	pod, err := env.c.Client.CoreV1().Pods("flux-system").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.c.Client.CoreV1().Pods("flux-system").Delete(ctx, pod.Name, metav1.DeleteOptions{}) }()
	var phase corev1.PodPhase
	eventually(t, 2*time.Minute, "probe pod done", func(ctx context.Context) error {
		p, err := env.c.Client.CoreV1().Pods("flux-system").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		phase = p.Status.Phase
		if phase != corev1.PodSucceeded && phase != corev1.PodFailed {
			return fmt.Errorf("probe %s%s", phase, waiting(p))
		}
		return nil
	})
	logs, err := env.c.Client.CoreV1().Pods("flux-system").GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("probe logs (through the kubelet): %v", err)
	}
	if phase != corev1.PodSucceeded {
		t.Fatalf("probe in a pod could not download %s with digest %s:\n%s", url, digest, logs)
	}
	return string(logs)
}

// metric sums the samples of family in the Prometheus text at url
// (reached from the node), whose labels contain every one of match.
func metric(t *testing.T, url, family string, match ...string) float64 {
	t.Helper()
	v, err := scrape(context.Background(), url, family, match...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func scrape(ctx context.Context, url, family string, match ...string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := env.c.HTTPClient().Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	var sum float64
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		line := s.Text()
		if !strings.HasPrefix(line, family) || (len(line) > len(family) && line[len(family)] != '{' && line[len(family)] != ' ') {
			continue
		}
		ok := true
		for _, m := range match {
			if !strings.Contains(line, m) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", url, line, err)
		}
		sum += v
	}
	return sum, s.Err()
}
