package multinodetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/headwater-gitops/headwater/e2e/cluster"
	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
)

// TestNodes proves the cluster is one: every node Ready, a pod on each,
// and from a pod on every node the cluster DNS answers, every other node's
// pod answers at its pod address, and the API server answers through the
// kubernetes Service; from every node's own namespace a ClusterIP Service
// reaches the pods behind it.
func TestNodes(t *testing.T) {
	c := requireCluster(t)
	ctx := context.Background()
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range nodes.Items {
		names = append(names, n.Name)
	}
	sort.Strings(names)
	var want []string
	for _, n := range c.Nodes {
		want = append(want, n.Name)
	}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("nodes %v, want %v", names, want)
	}

	const ns = "mesh"
	env.Kubectl(t, "create", "namespace", ns)
	t.Cleanup(func() { _, _ = c.Kubectl(context.Background(), "delete", "namespace", ns, "--wait=false").Run() })
	labels := map[string]string{"app": "mesh"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "mesh", Namespace: ns},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name: "serve", Image: cluster.ProbeImage, ImagePullPolicy: corev1.PullNever,
						Args:  []string{"serve", ":8080"},
						Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
						Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
							FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
							HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(8080)}}, PeriodSeconds: 2},
						Resources: tiny(),
					}},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, svc := range []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "mesh", Namespace: ns},
			Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Port: 8080}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "mesh-vip", Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}},
	} {
		if _, err := c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kubetest.Eventually(t, 3*time.Minute, "a ready mesh pod on every node", func(ctx context.Context) error {
		d, err := c.Client.AppsV1().DaemonSets(ns).Get(ctx, "mesh", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.NumberReady != int32(len(c.Nodes)) {
			return fmt.Errorf("%d of %d ready", d.Status.NumberReady, len(c.Nodes))
		}
		return nil
	})

	// A pod on every node checks DNS, every node's pod and the API server.
	for _, n := range c.Nodes {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "check-" + n.Name, Namespace: ns},
			Spec: corev1.PodSpec{
				NodeName:      n.Name,
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "mesh", Image: cluster.ProbeImage, ImagePullPolicy: corev1.PullNever,
					Args:      []string{"mesh", "mesh." + ns + ".svc.cluster.local", "8080", fmt.Sprint(len(c.Nodes))},
					Resources: tiny(),
				}},
			},
		}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Nodes {
		name := "check-" + n.Name
		kubetest.Eventually(t, 3*time.Minute, name+" to finish", func(ctx context.Context) error {
			p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			switch p.Status.Phase {
			case corev1.PodSucceeded:
				return nil
			case corev1.PodFailed:
				return fmt.Errorf("failed: %s", podLog(ctx, c, ns, name))
			}
			return fmt.Errorf("phase %s", p.Status.Phase)
		})
		out := podLog(ctx, c, ns, name)
		seen := map[string]bool{}
		for _, line := range strings.Split(out, "\n") {
			if _, node, ok := strings.Cut(line, " node="); ok && strings.HasPrefix(line, "pod ") {
				seen[node] = true
			}
		}
		for _, m := range c.Nodes {
			if !seen[m.Name] {
				t.Errorf("the pod on %s did not reach the pod on %s:\n%s", n.Name, m.Name, out)
			}
		}
		if !strings.Contains(out, "apiserver ok") {
			t.Errorf("the pod on %s did not reach the API server:\n%s", n.Name, out)
		}
		t.Logf("%s:\n%s", n.Name, out)
	}

	// Each node's kube-proxy routes the ClusterIP to pods on every node.
	url, err := serviceURL(ctx, c, ns, "mesh-vip")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		// A new connection each time, so kube-proxy picks a pod each time.
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: n.DialContext, DisableKeepAlives: true}}
		seen := map[string]bool{}
		kubetest.Eventually(t, time.Minute, "the Service from "+n.Name+" to reach every node's pod", func(ctx context.Context) error {
			body, err := get(ctx, hc, url)
			if err != nil {
				return err
			}
			seen[body] = true
			if len(seen) < len(c.Nodes) {
				return fmt.Errorf("reached %d nodes' pods so far", len(seen))
			}
			return nil
		})
	}
}

// tiny is what the tests' own pods request: next to nothing, on a machine
// shared with others.
func tiny() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("16Mi")}}
}

func podLog(ctx context.Context, c *cluster.Cluster, ns, name string) string {
	out, err := c.Kubectl(ctx, "-n", ns, "logs", name).Run()
	if err != nil {
		return fmt.Sprintf("(no log: %v: %s)", err, out)
	}
	return out
}

func serviceURL(ctx context.Context, c *cluster.Cluster, ns, name string) (string, error) {
	return c.ServiceURL(ctx, ns, name, "")
}

func get(ctx context.Context, hc *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := io.Copy(&b, io.LimitReader(resp.Body, 1<<20)); err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b.String(), nil
}
