package clustertest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
)

// testBadInput makes each operator mistake the README's troubleshooting
// section describes and checks that the operator sees it where it says:
// pod status, Events, logs, readiness. Each case restores the install.
func testBadInput(t *testing.T, cl ctrlclient.Client, gr *sourcev1.GitRepository) {
	ctx := context.Background()
	t.Run("missing image", func(t *testing.T) {
		env.Kubectl(t, "-n", ns, "set", "image", "deployment/packager", "packager=ghcr.io/headwater-gitops/headwater:v0.0.0-missing")
		defer undo(t, "packager")
		p := waitPodWaiting(t, "packager", "ErrImagePull", "ImagePullBackOff")
		ev := waitEvent(t, p.Name, "Failed", "ghcr.io/headwater-gitops/headwater:v0.0.0-missing")
		t.Logf("kubectl get pods: %s %s; Event Failed: %s", p.Name, kubetest.Waiting(&p), ev.Message)
		// The old pod keeps serving: the rollout is stuck, not down.
		if len(readyPods(t, "packager")) == 0 {
			t.Error("no packager pod Ready while the new image cannot be pulled")
		}
	})
	t.Run("bad flag", func(t *testing.T) {
		env.Kubectl(t, "-n", ns, "patch", "deployment/fetcher", "--type=json",
			"-p", `[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"-no-such-flag"}]`)
		defer undo(t, "fetcher")
		p := waitPodWaiting(t, "fetcher", "CrashLoopBackOff")
		logs := podLogs(t, p.Name, true)
		if !strings.Contains(logs, "flag provided but not defined: -no-such-flag") {
			t.Errorf("kubectl logs --previous %s does not say which flag is wrong:\n%s", p.Name, logs)
		}
		t.Logf("kubectl logs --previous %s: %s", p.Name, firstLine(logs))
		if len(readyPods(t, "fetcher")) == 0 {
			t.Error("no fetcher pod Ready while the new pods crash")
		}
	})
	t.Run("NATS unreachable", func(t *testing.T) {
		restarts := restartCounts(t)
		env.Kubectl(t, "-n", ns, "scale", "statefulset/nats", "--replicas=0")
		restored := false
		restore := func() {
			if !restored {
				restored = true
				env.Kubectl(t, "-n", ns, "scale", "statefulset/nats", "--replicas=1")
				waitPodsReady(t, 5*time.Minute)
			}
		}
		defer restore()
		// The bus's clients go unready, saying why; the artifact-servers
		// stay Ready and keep serving what is stored; nothing restarts.
		for _, component := range []string{"watcher", "fetcher", "packager"} {
			kubetest.Eventually(t, 2*time.Minute, component+" not Ready while NATS is down", func(ctx context.Context) error {
				for _, p := range pods(t, component) {
					if kubetest.PodReady(&p) {
						return fmt.Errorf("%s still Ready", p.Name)
					}
				}
				return nil
			})
		}
		fetcher := pods(t, "fetcher")[0]
		body := readyz(t, fetcher.Status.PodIP, 9101)
		if !strings.Contains(body, "nats") {
			t.Errorf("fetcher /readyz while NATS is down does not name NATS: %q", body)
		}
		t.Logf("fetcher /readyz while NATS is down: %s", strings.TrimSpace(body))
		if len(readyPods(t, "artifact-server")) == 0 {
			t.Error("no artifact-server Ready while NATS is down: artifacts on storage should still be served")
		}
		digest, err := fetchArtifact(ctx, gr.Status.Artifact)
		if err != nil || digest != gr.Status.Artifact.Digest {
			t.Errorf("artifact while NATS is down: %s, %v; want %s", digest, err, gr.Status.Artifact.Digest)
		}
		for name, n := range restartCounts(t) {
			if before, ok := restarts[name]; ok && n != before && !strings.HasPrefix(name, "nats") {
				t.Errorf("pod %s restarted while NATS was down (%d -> %d restarts)", name, before, n)
			}
		}
		restore()
	})
	t.Run("missing bus Secret", func(t *testing.T) {
		env.Kubectl(t, "-n", ns, "delete", "secret", "headwater-nats-packager")
		for _, p := range pods(t, "packager") {
			if err := env.C.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		p := waitPodWaiting(t, "packager", "ContainerCreating")
		ev := waitEvent(t, p.Name, "FailedMount", `secret "headwater-nats-packager" not found`)
		t.Logf("kubectl get pods: %s ContainerCreating; Event FailedMount: %s", p.Name, ev.Message)
		// The documented repair: run the setup Job again (it makes only
		// what is missing), then restart NATS so it reads the new key.
		env.Kubectl(t, "-n", ns, "delete", "job", "headwater-setup", "--ignore-not-found")
		env.Kubectl(t, "apply", "-k", env.DeployPath("."))
		kubetest.Eventually(t, 2*time.Minute, "setup Job made the missing Secret", func(ctx context.Context) error {
			_, err := env.C.Client.CoreV1().Secrets(ns).Get(ctx, "headwater-nats-packager", metav1.GetOptions{})
			return err
		})
		env.Kubectl(t, "-n", ns, "rollout", "restart", "statefulset/nats")
		if err := env.C.WaitRollout(ctx, ns, "statefulset/nats", 5*time.Minute); err != nil {
			t.Fatal(err)
		}
		waitPodsReady(t, 5*time.Minute)
	})
	// After all of it, the source still follows its branch.
	r, head := gitRepoFor(t, gr.Name)
	if err := r.Write(map[string]string{"after-bad-input.txt": "ok\n"}); err != nil {
		t.Fatal(err)
	}
	if head, _ = r.Commit("after bad input"); head == "" {
		t.Fatal("commit failed")
	}
	requestReconcile(t, cl, gr)
	readyAt(t, cl, gr.Namespace, gr.Name, head, 3*time.Minute)
}

// undo rolls deployment d back and waits until it is rolled out.
func undo(t *testing.T, d string) {
	t.Helper()
	env.Kubectl(t, "-n", ns, "rollout", "undo", "deployment/"+d)
	if err := env.C.WaitRollout(context.Background(), ns, "deployment/"+d, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	waitPodsReady(t, 5*time.Minute)
}

// waitPodWaiting waits for a pod of component whose container waits for
// one of reasons, and returns it.
func waitPodWaiting(t *testing.T, component string, reasons ...string) corev1.Pod {
	t.Helper()
	var found corev1.Pod
	kubetest.Eventually(t, 3*time.Minute, component+" pod waiting with "+strings.Join(reasons, " or "), func(ctx context.Context) error {
		for _, p := range pods(t, component) {
			for _, cs := range p.Status.ContainerStatuses {
				if w := cs.State.Waiting; w != nil {
					for _, r := range reasons {
						if w.Reason == r {
							found = p
							return nil
						}
					}
				}
			}
			if p.Status.Phase == corev1.PodPending && len(p.Status.ContainerStatuses) > 0 {
				for _, r := range reasons {
					if w := p.Status.ContainerStatuses[0].State.Waiting; w != nil && w.Reason == r {
						found = p
						return nil
					}
				}
			}
		}
		return fmt.Errorf("no such pod yet")
	})
	return found
}

// waitEvent waits for an Event of pod with reason whose message contains
// text.
func waitEvent(t *testing.T, pod, reason, text string) corev1.Event {
	t.Helper()
	var found corev1.Event
	kubetest.Eventually(t, 3*time.Minute, fmt.Sprintf("Event %s of %s with %q", reason, pod, text), func(ctx context.Context) error {
		list, err := env.C.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod + ",reason=" + reason})
		if err != nil {
			return err
		}
		for _, e := range list.Items {
			if strings.Contains(e.Message, text) {
				found = e
				return nil
			}
		}
		return fmt.Errorf("%d %s Events, none with the text", len(list.Items), reason)
	})
	return found
}

func readyPods(t *testing.T, component string) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods(t, component) {
		if kubetest.PodReady(&p) {
			out = append(out, p)
		}
	}
	return out
}

func restartCounts(t *testing.T) map[string]int32 {
	m := map[string]int32{}
	list, err := env.C.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		for _, cs := range p.Status.ContainerStatuses {
			m[p.Name] += cs.RestartCount
		}
	}
	return m
}

// podLogs reads a pod's logs through the API server and its kubelet.
func podLogs(t *testing.T, pod string, previous bool) string {
	t.Helper()
	var logs []byte
	kubetest.Eventually(t, time.Minute, "logs of "+pod, func(ctx context.Context) error {
		var err error
		logs, err = env.C.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Previous: previous}).DoRaw(ctx)
		return err
	})
	return string(logs)
}

// readyz is the body of a pod's /readyz.
func readyz(t *testing.T, ip string, port int) string {
	t.Helper()
	body, err := readyzBody(context.Background(), ip, port)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// readyzBody is the body of a pod's /readyz, "ok" when it answers 200.
func readyzBody(ctx context.Context, ip string, port int) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s:%d/readyz", ip, port), nil)
	if err != nil {
		return "", err
	}
	resp, err := env.C.HTTPClient().Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode == http.StatusOK {
		return "ok", nil
	}
	return string(b), nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
