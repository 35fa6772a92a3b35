// Package kubetest is what the test packages of a cluster (clustertest on
// one node, multinodetest on several) share: the cluster of package
// cluster started with a git server on the nodes' link, waits that poll the
// cluster, the Ready state of Headwater's pods and what an operator reads
// when they are not Ready, and what a user makes before an install (the
// S3 and NATS certificate Secrets, the egress allowance for in-cluster
// servers).
package kubetest

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// Env is a running cluster and the git server its sources fetch from, as
// every test of a package shares them.
type Env struct {
	// C is the cluster.
	C *cluster.Cluster
	// Git serves the repositories under GitRoot on the host's end of the
	// nodes' link (C.HostIP), where pods reach it.
	Git     *gitserver.Server
	GitRoot string
	// RepoRoot holds the working trees of the served repositories.
	RepoRoot string
	// Deploy is the repository's deploy/ directory.
	Deploy string
	// Kustomizations holds the kustomizations DeployPath writes over
	// Deploy's.
	Kustomizations string

	dir string
}

// Start starts a cluster of o, printing only the harness's progress
// unless verbose (then the nodes' components' output too), imports the
// probe image, and starts a git server on the host's end of the nodes'
// link. Stop ends it all.
func Start(ctx context.Context, o cluster.Options, verbose bool) (_ *Env, err error) {
	deploy, err := deployDir()
	if err != nil {
		return nil, err
	}
	o.Log = ProgressOnly{}
	if verbose {
		o.Log = os.Stderr
	}
	start := time.Now()
	c, err := cluster.Start(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("start the cluster: %w", err)
	}
	e := &Env{C: c, Deploy: deploy}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	fmt.Fprintf(os.Stderr, "kubetest: %d node(s) Ready with cluster DNS in %s\n", max(o.Nodes, 1), time.Since(start).Round(100*time.Millisecond))
	if err := c.ImportProbe(ctx); err != nil {
		return nil, err
	}
	if e.dir, err = os.MkdirTemp("", "headwater-kubetest"); err != nil {
		return nil, err
	}
	e.GitRoot = filepath.Join(e.dir, "git")
	e.RepoRoot = filepath.Join(e.dir, "work")
	e.Kustomizations = filepath.Join(e.dir, "kustomizations")
	git := &gitserver.Server{Root: e.GitRoot}
	if err := git.Start(c.HostIP + ":0"); err != nil {
		return nil, fmt.Errorf("git server: %w", err)
	}
	e.Git = git
	return e, nil
}

// Stop stops the git server and the cluster and removes what Start made.
func (e *Env) Stop() {
	if e.Git != nil {
		e.Git.Stop()
	}
	e.C.Stop()
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
}

// deployDir is the repository's deploy/ directory: beside go.work, in the
// first directory up from the working directory (a test's package) that
// has one.
func deployDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return filepath.Join(dir, "deploy"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.work above the working directory: run the tests inside the repository")
		}
		dir = parent
	}
}

// ProgressOnly is an Options.Log that prints the harness's own progress
// lines to standard error, not the components' output (whose lines start
// with '[').
type ProgressOnly struct{}

// Write prints p unless it is a component's line.
func (ProgressOnly) Write(p []byte) (int, error) {
	if len(p) > 0 && p[0] != '[' {
		_, _ = os.Stderr.Write(p)
	}
	return len(p), nil
}

var _ io.Writer = ProgressOnly{}

// PollEvery calls check every interval until it returns nil, returning
// its last error when timeout passes first.
func PollEvery(ctx context.Context, timeout, interval time.Duration, check func(ctx context.Context) error) error {
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

// Poll is PollEvery every half second.
func Poll(ctx context.Context, timeout time.Duration, check func(ctx context.Context) error) error {
	return PollEvery(ctx, timeout, 500*time.Millisecond, check)
}

// Eventually polls check every half second until it returns nil, failing
// t with the last error after timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, check func(ctx context.Context) error) {
	t.Helper()
	EventuallyEvery(t, timeout, 500*time.Millisecond, what, check)
}

// EventuallyEvery is Eventually polling every interval: for a wait whose
// duration the test reports.
func EventuallyEvery(t testing.TB, timeout, interval time.Duration, what string, check func(ctx context.Context) error) {
	t.Helper()
	if err := PollEvery(context.Background(), timeout, interval, check); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Kubectl runs kubectl with args against the cluster and fails t on error.
func (e *Env) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := e.C.Kubectl(context.Background(), args...).Run()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// Client is a controller-runtime client of the cluster that knows the
// built-in kinds and Flux's source kinds.
func (e *Env) Client(t testing.TB) ctrlclient.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := sourcev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cl, err := ctrlclient.New(e.C.Config, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// EnsureNamespace creates the namespace name unless it exists.
func (e *Env) EnsureNamespace(t testing.TB, name string) {
	t.Helper()
	_, err := e.C.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// PodsReady is nil when namespace ns has pods, none is being deleted and
// every one is Ready (a Job's: Succeeded); else it names those that are
// not, with their phase, node and why their containers wait.
func (e *Env) PodsReady(ctx context.Context, ns string) error {
	pods, err := e.C.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	if len(pods.Items) == 0 {
		return fmt.Errorf("no pods in %s yet", ns)
	}
	var notReady []string
	for i := range pods.Items {
		p := &pods.Items[i]
		if IsJobPod(p) {
			if p.Status.Phase != corev1.PodSucceeded {
				notReady = append(notReady, describe(p))
			}
			continue
		}
		if p.DeletionTimestamp != nil || !PodReady(p) {
			notReady = append(notReady, describe(p))
		}
	}
	if len(notReady) > 0 {
		return fmt.Errorf("not Ready: %s", strings.Join(notReady, ", "))
	}
	return nil
}

// describe is a pod's name, phase, node and why its containers wait.
func describe(p *corev1.Pod) string {
	s := p.Name + " (" + string(p.Status.Phase)
	if p.Spec.NodeName != "" {
		s += " on " + p.Spec.NodeName
	}
	return s + Waiting(p) + ")"
}

// IsJobPod reports whether a Job owns p.
func IsJobPod(p *corev1.Pod) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == "Job" {
			return true
		}
	}
	return false
}

// PodReady reports whether p's Ready condition is True.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Waiting says why p's containers wait, if they do ("; name: reason
// message" for each), or "".
func Waiting(p *corev1.Pod) string {
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

// Diagnose is what an operator would look at when the pods of namespace
// ns are not Ready: each such pod's container states, the tail of its logs
// (of the previous container when it restarted) and the namespace's
// Warning Events.
func (e *Env) Diagnose(ns string) string {
	ctx := context.Background()
	var b strings.Builder
	list, err := e.C.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for i := range list.Items {
		p := &list.Items[i]
		if PodReady(p) || p.Status.Phase == corev1.PodSucceeded {
			continue
		}
		fmt.Fprintf(&b, "--- pod %s: %s%s\n", p.Name, p.Status.Phase, Waiting(p))
		for _, cs := range p.Status.ContainerStatuses {
			if term := cs.LastTerminationState.Terminated; term != nil {
				fmt.Fprintf(&b, "    %s last exited %d (%s): %s\n", cs.Name, term.ExitCode, term.Reason, term.Message)
			}
			tailLines := int64(15)
			logs, err := e.C.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: cs.Name, TailLines: &tailLines, Previous: cs.RestartCount > 0}).DoRaw(ctx)
			if err != nil {
				fmt.Fprintf(&b, "    logs: %v\n", err)
				continue
			}
			for _, l := range strings.Split(strings.TrimSpace(string(logs)), "\n") {
				fmt.Fprintf(&b, "    | %s\n", l)
			}
		}
	}
	evs, err := e.C.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err == nil {
		for _, ev := range evs.Items {
			fmt.Fprintf(&b, "--- Warning %s %s/%s (x%d): %s\n", ev.Reason, ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Count, ev.Message)
		}
	}
	return b.String()
}
