package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster"
	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
	"github.com/headwater-gitops/headwater/e2e/promtext"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

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
	env.EnsureNamespace(t, name)
}

// install applies the kustomization at dir (relative to deploy/, or
// absolute) as a user would and waits until every pod of the namespace is Ready (the
// setup Job's pod: Succeeded). It returns how long that took, and
// uninstalls when the test ends.
func install(t *testing.T, dir string) time.Duration {
	t.Helper()
	start := time.Now()
	env.Kubectl(t, "apply", "-k", env.DeployPath(dir))
	t.Cleanup(func() { uninstall(t, dir) })
	waitPodsReady(t, 8*time.Minute)
	took := time.Since(start)
	t.Logf("%s: every pod Ready %s after kubectl apply -k", dir, took.Round(100*time.Millisecond))
	// Pods that start before NATS or the object store wait for them, not
	// crash: an install restarts nothing.
	for name, n := range restartCounts(t) {
		if n > 0 {
			tailLines := int64(5)
			logs, _ := env.C.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Previous: true, TailLines: &tailLines}).DoRaw(context.Background())
			t.Errorf("pod %s restarted %d times during the install; its previous container's last lines:\n%s", name, n, logs)
		}
	}
	return took
}

// uninstall deletes every source first (the watcher must still be there
// to remove their finalizers), then what dir installed.
func uninstall(t *testing.T, dir string) {
	t.Helper()
	ctx := context.Background()
	for _, kind := range []string{"gitrepositories", "buckets", "helmcharts", "helmrepositories", "ocirepositories"} {
		_, _ = env.C.Kubectl(ctx, "delete", kind, "--all", "--all-namespaces", "--wait=true", "--timeout=3m").Run()
	}
	if out, err := env.C.Kubectl(ctx, "delete", "-k", env.DeployPath(dir), "--ignore-not-found", "--wait=true", "--timeout=5m").Run(); err != nil {
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
	if err := kubetest.Poll(context.Background(), timeout, podsReady); err != nil {
		t.Fatalf("every pod Ready: %v\n%s", err, env.Diagnose(ns))
	}
}

// podsReady is nil when every pod of Headwater's namespace is Ready (a
// Job's: Succeeded) and none is being deleted.
func podsReady(ctx context.Context) error { return env.PodsReady(ctx, ns) }

// pods lists the pods of a component (app.kubernetes.io/name).
func pods(t *testing.T, name string) []corev1.Pod {
	t.Helper()
	list, err := env.C.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + name})
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
	if err := os.MkdirAll(env.GitRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := gitserver.NewRepo(env.GitRoot, name, filepath.Join(env.RepoRoot, name), "main")
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
	env.EnsureNamespace(t, namespace)
	gr := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: sourcev1.GitRepositorySpec{
			URL:       env.Git.RepoURL(repo),
			Interval:  metav1.Duration{Duration: interval},
			Reference: &sourcev1.GitRepositoryRef{Branch: "main"},
		},
	}
	if err := cl.Create(context.Background(), gr); err != nil {
		t.Fatalf("create GitRepository %s/%s: %v", namespace, name, err)
	}
	return gr
}

// readyAt waits until the GitRepository is Ready with an artifact of
// commit and returns it.
func readyAt(t *testing.T, cl ctrlclient.Client, namespace, name, commit string, timeout time.Duration) *sourcev1.GitRepository {
	t.Helper()
	var gr sourcev1.GitRepository
	kubetest.Eventually(t, timeout, fmt.Sprintf("GitRepository %s/%s Ready at %s", namespace, name, commit), func(ctx context.Context) error {
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
	env.EnsureNamespace(t, "flux-system")
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
	pod, err := env.C.Client.CoreV1().Pods("flux-system").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.C.Client.CoreV1().Pods("flux-system").Delete(ctx, pod.Name, metav1.DeleteOptions{}) }()
	var phase corev1.PodPhase
	kubetest.Eventually(t, 2*time.Minute, "probe pod done", func(ctx context.Context) error {
		p, err := env.C.Client.CoreV1().Pods("flux-system").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		phase = p.Status.Phase
		if phase != corev1.PodSucceeded && phase != corev1.PodFailed {
			return fmt.Errorf("probe %s%s", phase, kubetest.Waiting(p))
		}
		return nil
	})
	logs, err := env.C.Client.CoreV1().Pods("flux-system").GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("probe logs (through the kubelet): %v", err)
	}
	if phase != corev1.PodSucceeded {
		t.Fatalf("probe in a pod could not download %s with digest %s:\n%s", url, digest, logs)
	}
	return string(logs)
}

// metric sums the samples of family in the Prometheus text at url
// (reached from the node) whose labels include every one of match (each
// `key="value"`).
func metric(t *testing.T, url, family string, match ...string) float64 {
	t.Helper()
	v, err := scrape(context.Background(), url, family, match...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func scrape(ctx context.Context, url, family string, match ...string) (float64, error) {
	ss, err := promtext.Scrape(ctx, env.C.HTTPClient(), url)
	if err != nil {
		return 0, err
	}
	return ss.Sum(family, match...)
}
