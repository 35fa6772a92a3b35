package deployvalidate

import (
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestChecksCatchMistakes breaks the real rendering of deploy/ one way at a
// time and expects the checks to say so: a validator that passes anything
// would pass the real files too.
func TestChecksCatchMistakes(t *testing.T) {
	root := repoRoot(t)
	flags, err := AllServiceFlags(root)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(root, "deploy")
	fresh := func(t *testing.T) *Manifests {
		t.Helper()
		m, err := Build(base)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	deployment := func(m *Manifests, name string) *appsv1.Deployment {
		for i := range m.Deployments {
			if m.Deployments[i].Name == name {
				return &m.Deployments[i]
			}
		}
		t.Fatalf("no Deployment %s", name)
		return nil
	}
	containerOf := func(m *Manifests, name string) *corev1.Container {
		return &deployment(m, name).Spec.Template.Spec.Containers[0]
	}
	tests := []struct {
		name   string
		mutate func(m *Manifests)
		want   string
	}{
		{"no memory limit", func(m *Manifests) {
			delete(containerOf(m, "fetcher").Resources.Limits, corev1.ResourceMemory)
		}, "no memory limit"},
		{"zero cpu limit", func(m *Manifests) {
			containerOf(m, "packager").Resources.Limits[corev1.ResourceCPU] = resource.Quantity{}
		}, "no cpu limit"},
		{"runs as root", func(m *Manifests) {
			f := false
			containerOf(m, "watcher").SecurityContext.RunAsNonRoot = &f
		}, "runAsNonRoot is not true"},
		{"writable root filesystem", func(m *Manifests) {
			containerOf(m, "artifact-server").SecurityContext.ReadOnlyRootFilesystem = nil
		}, "readOnlyRootFilesystem is not true"},
		{"keeps capabilities", func(m *Manifests) {
			containerOf(m, "fetcher").SecurityContext.Capabilities = nil
		}, "capabilities do not drop ALL"},
		{"no seccomp profile", func(m *Manifests) {
			deployment(m, "packager").Spec.Template.Spec.SecurityContext.SeccompProfile = nil
		}, "seccomp profile is not RuntimeDefault"},
		{"env var of no flag", func(m *Manifests) {
			c := containerOf(m, "packager")
			c.Env = append(c.Env, corev1.EnvVar{Name: "HEADWATER_STORAGE_ADV_ADDR", Value: "x"})
		}, "HEADWATER_STORAGE_ADV_ADDR matches no flag"},
		{"env var for another service's flag", func(m *Manifests) {
			c := containerOf(m, "watcher")
			c.Env = append(c.Env, corev1.EnvVar{Name: "HEADWATER_STORAGE_PATH", Value: "/data"})
		}, "HEADWATER_STORAGE_PATH matches no flag"},
		{"misspelt argument", func(m *Manifests) {
			c := containerOf(m, "artifact-server")
			c.Args = append(c.Args, "--storage-adv-adr=x")
		}, `argument "--storage-adv-adr=x" names no flag`},
		{"probe on the metrics port (http-prom)", func(m *Manifests) {
			containerOf(m, "watcher").LivenessProbe.HTTPGet.Port = intstr.FromString("http-prom")
		}, "liveness probe on port 9100, but -health-addr listens on 9110"},
		{"probe on an undeclared port", func(m *Manifests) {
			containerOf(m, "fetcher").ReadinessProbe.HTTPGet.Port = intstr.FromInt32(8080)
		}, "port 8080 is not a declared container port"},
		{"wrong probe path", func(m *Manifests) {
			containerOf(m, "packager").ReadinessProbe.HTTPGet.Path = "/healthz"
		}, `readiness probe path "/healthz", want "/readyz"`},
		{"health address not set", func(m *Manifests) {
			c := containerOf(m, "fetcher")
			for i := range c.Env {
				if c.Env[i].Name == "HEADWATER_TELEMETRY_ADDR" {
					c.Env[i].Name = "UNUSED"
				}
			}
		}, "-telemetry-addr is not set"},
		{"undefined variable reference", func(m *Manifests) {
			c := containerOf(m, "artifact-server")
			for i := range c.Env {
				if c.Env[i].Name == "HEADWATER_STORAGE_ADV_ADDR" {
					c.Env[i].Value = "source-controller.$(NAMESPACE).svc"
				}
			}
		}, "refers to $(NAMESPACE)"},
		{"duplicate env var", func(m *Manifests) {
			c := containerOf(m, "fetcher")
			c.Env = append(c.Env, corev1.EnvVar{Name: "HOME", Value: "/"})
		}, "HOME is set twice"},
		{"mount of an undefined volume", func(m *Manifests) {
			d := deployment(m, "packager")
			d.Spec.Template.Spec.Volumes = d.Spec.Template.Spec.Volumes[1:]
		}, "which the pod does not define"},
		{"entrypoint replaced", func(m *Manifests) {
			containerOf(m, "watcher").Command = []string{"/bin/sh"}
		}, "overrides the image's entrypoint"},
		{"headwater env on nats", func(m *Manifests) {
			c := &m.StatefulSets[0].Spec.Template.Spec.Containers[0]
			c.Env = append(c.Env, corev1.EnvVar{Name: "HEADWATER_NATS_URL", Value: "x"})
		}, "is no Headwater service but sets HEADWATER_NATS_URL"},
		{"Service selects nothing", func(m *Manifests) {
			for i := range m.Services {
				if m.Services[i].Name == "source-controller" {
					m.Services[i].Spec.Selector = map[string]string{"app.kubernetes.io/name": "artifact-servers"}
				}
			}
		}, "Service source-controller selects no pods"},
		{"Service targets a missing port", func(m *Manifests) {
			for i := range m.Services {
				if m.Services[i].Name == "source-controller" {
					m.Services[i].Spec.Ports[0].TargetPort = intstr.FromString("https")
				}
			}
		}, "target https is no port"},
		{"missing claim", func(m *Manifests) {
			d := deployment(m, "packager")
			d.Spec.Template.Spec.Volumes = append(d.Spec.Template.Spec.Volumes, corev1.Volume{Name: "data",
				VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "headwater-artifacts"}}})
		}, "PersistentVolumeClaim headwater-artifacts does not exist"},
		{"undocumented image", func(m *Manifests) {
			containerOf(m, "fetcher").Image = "headwater/fetcher:dev"
		}, `image "headwater/fetcher:dev" is none of the documented`},
		{"the image's role not picked", func(m *Manifests) {
			containerOf(m, "fetcher").Args = nil
		}, `args [] do not start with -target=fetcher`},
		{"another role picked", func(m *Manifests) {
			containerOf(m, "packager").Args = []string{"-target=fetcher"}
		}, `args ["-target=fetcher"] do not start with -target=packager`},
		{"image pulled every start", func(m *Manifests) {
			containerOf(m, "watcher").ImagePullPolicy = corev1.PullAlways
		}, `imagePullPolicy "Always", want IfNotPresent`},
		{"no startup probe", func(m *Manifests) {
			containerOf(m, "packager").StartupProbe = nil
		}, "no startup probe"},
		{"startup probe gives up early", func(m *Manifests) {
			containerOf(m, "artifact-server").StartupProbe.FailureThreshold = 3
		}, "startup probe every 2s, 3 times"},
		{"no startup probe on MinIO", func(m *Manifests) {
			for i := range m.StatefulSets {
				if m.StatefulSets[i].Name == "minio" {
					m.StatefulSets[i].Spec.Template.Spec.Containers[0].StartupProbe = nil
				}
			}
		}, "StatefulSet/minio: container minio: no startup probe"},
		{"setup Job runs as root", func(m *Manifests) {
			zero := int64(0)
			m.Jobs[0].Spec.Template.Spec.Containers[0].SecurityContext.RunAsUser = &zero
		}, "Job/headwater-setup: container setup: runs as uid 0"},
		{"setup Job sets a flag it lacks", func(m *Manifests) {
			c := &m.Jobs[0].Spec.Template.Spec.Containers[0]
			c.Env = append(c.Env, corev1.EnvVar{Name: "HEADWATER_S3_BUKET", Value: "x"})
		}, "HEADWATER_S3_BUKET matches no flag"},
		{"missing ServiceAccount", func(m *Manifests) {
			deployment(m, "fetcher").Spec.Template.Spec.ServiceAccountName = "fetchers"
		}, "uses ServiceAccount fetchers, which does not exist"},
		{"binding to another namespace", func(m *Manifests) {
			m.ClusterRoleBindings[0].Subjects[0].Namespace = "default"
		}, "binds ServiceAccount default/"},
		{"object in another namespace", func(m *Manifests) {
			deployment(m, "packager").Namespace = "flux-system"
		}, `Deployment/packager is in namespace "flux-system"`},
		{"selector does not match the template", func(m *Manifests) {
			deployment(m, "watcher").Spec.Template.Labels = map[string]string{"app": "watcher"}
		}, "does not match the pod template's labels"},
		{"network policy for no pods", func(m *Manifests) {
			m.NetworkPolicies[0].Spec.PodSelector.MatchLabels = map[string]string{"app.kubernetes.io/name": "gone"}
		}, "selects no workload's pods"},
		{"network policy admits a label no pod has", func(m *Manifests) {
			for _, w := range m.Workloads() {
				delete(w.Template.Labels, "app.kubernetes.io/part-of")
			}
		}, "which no workload's pods have"},
		{"network policy admits a port the pods do not have", func(m *Manifests) {
			p := intstr.FromString("nope")
			m.NetworkPolicies[0].Spec.Ingress[0].Ports[0].Port = &p
		}, "port nope is no port of"},
		{"a Secret no one creates", func(m *Manifests) {
			deployment(m, "fetcher").Spec.Template.Spec.Volumes[0].Secret = &corev1.SecretVolumeSource{SecretName: "typo"}
		}, "Secret typo does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := fresh(t)
			tt.mutate(m)
			var problems []string
			for _, w := range m.Workloads() {
				problems = append(problems, CheckWorkload(w, flags)...)
			}
			problems = append(problems, CheckReferences(m, namespace, true, append([]string{s3Secret}, natsSecrets...))...)
			problems = append(problems, CheckNetworkPolicies(m)...)
			for _, p := range problems {
				if strings.Contains(p, tt.want) {
					return
				}
			}
			t.Errorf("no problem mentions %q; problems: %q", tt.want, problems)
		})
	}
}

func TestAddIsStrict(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{
			name: "misspelt field",
			doc: `apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec:
  template:
    spec:
      containers:
        - name: x
          securityContext:
            readOnlyRootFileSystem: true
`,
			want: "readOnlyRootFileSystem",
		},
		{
			name: "unknown kind",
			doc:  "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
			want: "unexpected kind v1/Pod",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := (&Manifests{}).Add([]byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Add = %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}
