package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	fluxmeta "github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
)

// helmReleaseImage is the image of e2e/cmd/helmrelease, in the archive
// `make flux-image-archive` writes beside Flux's controllers.
const helmReleaseImage = "ghcr.io/headwater-gitops/e2e-helmrelease:test"

// helmReleaseOutcome is the line e2e/cmd/helmrelease prints.
type helmReleaseOutcome struct {
	Release      string `json:"release"`
	Namespace    string `json:"namespace"`
	Revision     int    `json:"revision"`
	Status       string `json:"status"`
	Action       string `json:"action"`
	ChartVersion string `json:"chartVersion"`
	Digest       string `json:"digest"`
	URL          string `json:"url"`
}

// demoChart is a chart of one ConfigMap, <release>-greeting, holding the
// value greeting and the chart's version.
func demoChart(version string) map[string]string {
	return map[string]string{
		"charts/demo/Chart.yaml":  "apiVersion: v2\nname: demo\nversion: " + version + "\n",
		"charts/demo/values.yaml": "greeting: hello\n",
		"charts/demo/templates/configmap.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-greeting\n" +
			"data:\n  value: {{ .Values.greeting | quote }}\n  chart: {{ .Chart.Version | quote }}\n",
	}
}

// testHelmRelease does what helm-controller does with a HelmChart's
// artifact, from a pod, with the Helm v3 SDK (e2e/cmd/helmrelease as a
// Job under helm-controller's ServiceAccount): a HelmChart built by
// Headwater from a chart in a GitRepository is downloaded through the
// Service source-controller, checked against its digest and installed; a
// commit that bumps the chart's version gives the HelmChart a new
// artifact, and the release is upgraded from it.
func testHelmRelease(t *testing.T, cl ctrlclient.Client) {
	repo, _ := newRepo(t, "flux-charts", demoChart("0.1.0"))
	gr := gitRepository(t, cl, "flux-system", "charts", "flux-charts", time.Hour)
	hc := &sourcev1.HelmChart{
		ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: "flux-system"},
		Spec: sourcev1.HelmChartSpec{
			Chart: "./charts/demo", Interval: metav1.Duration{Duration: time.Hour},
			SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.GitRepositoryKind, Name: "charts"},
		},
	}
	start := time.Now()
	if err := cl.Create(context.Background(), hc); err != nil {
		t.Fatal(err)
	}
	art := helmChartReadyAt(t, cl, hc, "0.1.0")
	t.Logf("HelmChart Ready at %s (%s) %s after it was created", art.Revision, art.Digest, time.Since(start).Round(10*time.Millisecond))

	start = time.Now()
	out := runHelmRelease(t, "install", `{"greeting":"from a HelmChart"}`)
	t.Logf("helm install from the artifact: release %s revision %d %s, chart %s, %s after the Job was created",
		out.Release, out.Revision, out.Status, out.ChartVersion, time.Since(start).Round(10*time.Millisecond))
	checkRelease(t, out, "install", 1, "0.1.0", art)
	kubetest.Eventually(t, time.Minute, "the release's ConfigMap", allOf(
		configMapKeyIs("demo-greeting", "value", "from a HelmChart"), configMapKeyIs("demo-greeting", "chart", "0.1.0")))

	if err := repo.Write(demoChart("0.2.0")); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Commit("demo 0.2.0"); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	requestReconcile(t, cl, gr)
	art = helmChartReadyAt(t, cl, hc, "0.2.0")
	t.Logf("HelmChart Ready at %s (%s) %s after the GitRepository's reconcile request", art.Revision, art.Digest, time.Since(start).Round(10*time.Millisecond))
	out = runHelmRelease(t, "upgrade", `{"greeting":"from a HelmChart"}`)
	t.Logf("helm upgrade from the new artifact: release %s revision %d %s, chart %s", out.Release, out.Revision, out.Status, out.ChartVersion)
	checkRelease(t, out, "upgrade", 2, "0.2.0", art)
	kubetest.Eventually(t, time.Minute, "the release's ConfigMap upgraded", allOf(
		configMapKeyIs("demo-greeting", "value", "from a HelmChart"), configMapKeyIs("demo-greeting", "chart", "0.2.0")))
}

// helmChartReadyAt waits until the HelmChart is Ready with an artifact of
// chart version revision, and returns the artifact.
func helmChartReadyAt(t *testing.T, cl ctrlclient.Client, hc *sourcev1.HelmChart, revision string) *fluxmeta.Artifact {
	t.Helper()
	key := ctrlclient.ObjectKeyFromObject(hc)
	kubetest.EventuallyEvery(t, 3*time.Minute, fine, "HelmChart "+key.Name+" Ready at "+revision, func(ctx context.Context) error {
		if err := cl.Get(ctx, key, hc); err != nil {
			return err
		}
		ready := apimeta.FindStatusCondition(hc.Status.Conditions, fluxmeta.ReadyCondition)
		if ready == nil || ready.Status != metav1.ConditionTrue || hc.Status.Artifact == nil || hc.Status.Artifact.Revision != revision {
			return fmt.Errorf("Ready %+v, artifact %+v", ready, hc.Status.Artifact)
		}
		return nil
	})
	return hc.Status.Artifact
}

// checkRelease checks what e2e/cmd/helmrelease reports.
func checkRelease(t *testing.T, out helmReleaseOutcome, action string, revision int, version string, art *fluxmeta.Artifact) {
	t.Helper()
	if out.Action != action || out.Revision != revision || out.Status != "deployed" || out.ChartVersion != version ||
		out.Namespace != appsNamespace {
		t.Errorf("helmrelease: %+v, want %s to revision %d of chart %s deployed in %s", out, action, revision, version, appsNamespace)
	}
	if out.Digest != art.Digest || out.URL != art.URL {
		t.Errorf("helmrelease installed %s (%s), the HelmChart's artifact is %s (%s)", out.URL, out.Digest, art.URL, art.Digest)
	}
	if want := "http://source-controller.flux-system.svc.cluster.local./helmchart/flux-system/demo/"; !strings.HasPrefix(out.URL, want) {
		t.Errorf("artifact URL %s, want it under %s", out.URL, want)
	}
}

// runHelmRelease runs e2e/cmd/helmrelease as a Job in flux-system under
// helm-controller's ServiceAccount for the HelmChart demo, release demo
// in appsNamespace, with values, and returns what it reports.
func runHelmRelease(t *testing.T, name, values string) helmReleaseOutcome {
	t.Helper()
	ctx := context.Background()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "helmrelease-" + name, Namespace: "flux-system"},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "helm-controller"}},
				Spec: corev1.PodSpec{
					RestartPolicy:      corev1.RestartPolicyNever,
					ServiceAccountName: "helm-controller",
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65534),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name: "helmrelease", Image: helmReleaseImage, ImagePullPolicy: corev1.PullNever,
						Args: []string{"-chart-namespace", "flux-system", "-chart", "demo", "-release", "demo",
							"-target-namespace", appsNamespace, "-values", values, "-timeout", "2m"},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
							Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}},
					}},
					Volumes: []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
				},
			},
		},
	}
	jobs := env.C.Client.BatchV1().Jobs("flux-system")
	if _, err := jobs.Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = jobs.Delete(context.Background(), job.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	})
	var done *batchv1.Job
	kubetest.Eventually(t, 4*time.Minute, "Job "+job.Name+" finished", func(ctx context.Context) error {
		j, err := jobs.Get(ctx, job.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if j.Status.Succeeded+j.Status.Failed == 0 {
			return fmt.Errorf("active %d", j.Status.Active)
		}
		done = j
		return nil
	})
	pods, err := env.C.Client.CoreV1().Pods("flux-system").List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job.Name})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("the pod of Job %s: %v (%d pods)", job.Name, err, len(pods.Items))
	}
	logs, err := env.C.Client.CoreV1().Pods("flux-system").GetLogs(pods.Items[0].Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of Job %s (through the kubelet): %v", job.Name, err)
	}
	if done.Status.Succeeded == 0 {
		t.Fatalf("Job %s failed:\n%s", job.Name, logs)
	}
	for _, line := range strings.Split(string(logs), "\n") {
		var out helmReleaseOutcome
		if json.Unmarshal([]byte(line), &out) == nil && out.Action != "" {
			return out
		}
	}
	t.Fatalf("Job %s succeeded without reporting a release:\n%s", job.Name, logs)
	return helmReleaseOutcome{}
}

// configMapKeyIs checks that the ConfigMap name in appsNamespace holds
// value at key.
func configMapKeyIs(name, key, value string) func(context.Context) error {
	return func(ctx context.Context) error {
		cm, err := env.C.Client.CoreV1().ConfigMaps(appsNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("ConfigMap %s: %w", name, err)
		}
		if cm.Data[key] != value {
			return fmt.Errorf("ConfigMap %s: %s=%q, want %q", name, key, cm.Data[key], value)
		}
		return nil
	}
}
