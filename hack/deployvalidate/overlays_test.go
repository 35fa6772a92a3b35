package deployvalidate

import (
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// setupJob is the Job of deploy/base that makes the Secrets.
const setupJob = "headwater-setup"

// usersSecret is the Secret of the users' public keys, the one Secret the
// setup Job may change.
const usersSecret = "headwater-nats-users"

// TestEveryKustomization builds every overlay as shipped and deploy/base
// with every component, runs the checks every rendering passes, and checks
// their storage: no storageClassName anywhere (the cluster's default, or
// the pre-created volumes of a cluster without one, are used), and no
// ReadWriteMany claim but in overlays/rwx (and components/dir-storage,
// which that overlay uses as it is).
func TestEveryKustomization(t *testing.T) {
	root := repoRoot(t)
	for _, kind := range []string{"overlays", "components"} {
		entries, err := os.ReadDir(filepath.Join(root, "deploy", kind))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			t.Run(kind+"/"+e.Name(), func(t *testing.T) {
				var m *Manifests
				if kind == "overlays" {
					if e.Name() == fluxOverlay {
						// Into Flux's namespace, which it must not create.
						m, _ = checkManifestsIn(t, render(t, memDeploy(t), "/deploy/overlays/"+fluxOverlay).Manifests, fluxNamespace, false)
					} else {
						m, _ = build(t, filepath.Join("deploy", kind, e.Name()))
					}
					// An overlay is a whole installation.
					if len(m.CRDs) == 0 || !m.Has("Job", setupJob) {
						t.Errorf("installs %d CRDs and Jobs %v: want the CRDs and the setup Job", len(m.CRDs), m.Names("Job"))
					}
				} else if e.Name() == "flux-dropin" {
					// Beside base, still in headwater-system, but a
					// drop-in leaves the namespace to Flux.
					f := memDeploy(t)
					k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../deploy/base\ncomponents:\n  - ../deploy/components/flux-dropin\n"
					if err := f.WriteFile("/user/kustomization.yaml", []byte(k)); err != nil {
						t.Fatal(err)
					}
					m, _ = checkManifestsIn(t, render(t, f, "/user").Manifests, namespace, false)
				} else {
					m, _ = buildWith(t, e.Name())
				}
				checkClaims(t, m, e.Name() == "rwx" || (kind == "components" && e.Name() == "dir-storage"))
				checkSetupRole(t, m)
			})
		}
	}
}

// checkClaims checks every PersistentVolumeClaim and volume claim
// template: no storageClassName, and ReadWriteMany only where rwx.
func checkClaims(t *testing.T, m *Manifests, rwx bool) {
	t.Helper()
	claims := map[string]corev1.PersistentVolumeClaimSpec{}
	for _, p := range m.PVCs {
		claims["PersistentVolumeClaim "+p.Name] = p.Spec
	}
	for _, s := range m.StatefulSets {
		for _, p := range s.Spec.VolumeClaimTemplates {
			claims["StatefulSet "+s.Name+" claim "+p.Name] = p.Spec
		}
	}
	for id, spec := range claims {
		if spec.StorageClassName != nil {
			t.Errorf("%s: storageClassName %q; leave it to the cluster's default", id, *spec.StorageClassName)
		}
		if slices.Contains(spec.AccessModes, corev1.ReadWriteMany) && !rwx {
			t.Errorf("%s: access modes %v; ReadWriteMany only in overlays/rwx", id, spec.AccessModes)
		}
		if len(spec.AccessModes) == 0 {
			t.Errorf("%s: no access mode", id)
		}
	}
}

// checkSetupRole checks what the setup Job may do: get and create Secrets
// in its namespace, update and patch headwater-nats-users alone, nothing
// else; and that only its ServiceAccount is given that.
func checkSetupRole(t *testing.T, m *Manifests) {
	t.Helper()
	role, ok := m.Role(setupJob)
	if !ok {
		t.Fatalf("no Role %s", setupJob)
	}
	for _, verb := range []string{"get", "create", "update"} {
		if !Allows(role.Rules, "", "secrets", verb) {
			t.Errorf("the setup Job cannot %s Secrets", verb)
		}
	}
	for _, r := range role.Rules {
		if !slices.Equal(r.APIGroups, []string{""}) || !slices.Equal(r.Resources, []string{"secrets"}) || len(r.NonResourceURLs) > 0 {
			t.Errorf("Role %s grants %v of groups %v, want Secrets only", setupJob, r.Resources, r.APIGroups)
		}
		named := len(r.ResourceNames) > 0
		for _, verb := range r.Verbs {
			switch {
			case (verb == "get" || verb == "create") && !named:
			case (verb == "update" || verb == "patch") && slices.Equal(r.ResourceNames, []string{usersSecret}):
			default:
				t.Errorf("Role %s grants %s on Secrets %v; want get and create, and update and patch of %s only", setupJob, verb, r.ResourceNames, usersSecret)
			}
		}
	}
	for _, b := range m.RoleBindings {
		bindsSetup := slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool { return s.Kind == "ServiceAccount" && s.Name == "setup" })
		if b.RoleRef.Name == setupJob && (b.RoleRef.Kind != "Role" || len(b.Subjects) != 1 || !bindsSetup) {
			t.Errorf("RoleBinding %s gives Role %s to %v, want the ServiceAccount setup alone", b.Name, setupJob, b.Subjects)
		}
		if bindsSetup && b.RoleRef.Name != setupJob {
			t.Errorf("RoleBinding %s gives the setup ServiceAccount %s %s too", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
	}
	for _, b := range m.ClusterRoleBindings {
		if slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool { return s.Kind == "ServiceAccount" && s.Name == "setup" }) {
			t.Errorf("ClusterRoleBinding %s gives the setup ServiceAccount rights across namespaces", b.Name)
		}
	}
}

// checkSetup checks the setup Job: `setup ensure` in the Job's namespace
// with a token for the setup ServiceAccount, a retry budget, and removal
// after it finishes (a Job's template is immutable, so a re-apply with a
// new image needs the old Job gone). With s3 it also makes headwater-s3,
// pointing at the minio Service.
func checkSetup(t *testing.T, m *Manifests, s3 bool) {
	t.Helper()
	checkSetupRole(t, m)
	job, ok := m.Job(setupJob)
	if !ok {
		t.Fatalf("no Job %s", setupJob)
	}
	if job.Spec.TTLSecondsAfterFinished == nil || job.Spec.BackoffLimit == nil {
		t.Errorf("Job %s: ttlSecondsAfterFinished %v, backoffLimit %v: want both", setupJob, job.Spec.TTLSecondsAfterFinished, job.Spec.BackoffLimit)
	}
	pod := job.Spec.Template.Spec
	if pod.ServiceAccountName != "setup" || pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Errorf("Job %s: ServiceAccount %q, token mounted %v; want setup's token", setupJob, pod.ServiceAccountName, pod.AutomountServiceAccountToken)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("Job %s: %d containers", setupJob, len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Name != "setup" || len(c.Args) < 2 || c.Args[0] != "-target=setup" || c.Args[1] != "ensure" {
		t.Errorf("Job %s: container %s runs %v, want -target=setup ensure", setupJob, c.Name, c.Args)
	}
	if v, ok := FlagValue(c, "namespace"); ok {
		t.Errorf("Job %s: -namespace %q is fixed; want the Job's own (HEADWATER_NAMESPACE from metadata.namespace)", setupJob, v)
	}
	if e, ok := EnvVar(c, EnvName("namespace")); !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("Job %s: %s does not come from metadata.namespace", setupJob, EnvName("namespace"))
	}
	secret, _ := FlagValue(c, "s3-secret")
	if !s3 {
		if secret != "" {
			t.Errorf("Job %s makes the S3 Secret %s; here the user does", setupJob, secret)
		}
		return
	}
	if secret != s3Secret {
		t.Errorf("Job %s: -s3-secret %q, want %s", setupJob, secret, s3Secret)
	}
	if b, _ := FlagValue(c, "s3-bucket"); b == "" {
		t.Errorf("Job %s: no -s3-bucket", setupJob)
	}
	endpoint, _ := FlagValue(c, "s3-endpoint")
	endpoint = Expand(endpoint, c.Env, namespace)
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "http" {
		t.Fatalf("Job %s: -s3-endpoint %q is not an http:// URL (MinIO serves plain HTTP)", setupJob, endpoint)
	}
	host, port, err := net.SplitHostPort(u.Host)
	name, rest, _ := strings.Cut(host, ".")
	svc, ok := m.Service(name)
	if err != nil || !ok || (rest != "" && rest != namespace+".svc.cluster.local") ||
		!slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return itoa(p.Port) == port }) {
		t.Errorf("Job %s: -s3-endpoint %q is no port of a Service in %s", setupJob, endpoint, namespace)
	}
}

// checkMinIO checks components/minio: one non-root server on a
// ReadWriteOnce claim, its root credentials those the services use, its
// health probes, and only Headwater's pods admitted.
func checkMinIO(t *testing.T, m *Manifests) {
	t.Helper()
	i := slices.IndexFunc(m.StatefulSets, func(s appsv1.StatefulSet) bool { return s.Name == "minio" })
	if i < 0 {
		t.Fatal("no StatefulSet minio")
	}
	sts := m.StatefulSets[i]
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 1 {
		t.Errorf("minio: replicas %v, want 1", sts.Spec.Replicas)
	}
	if len(sts.Spec.VolumeClaimTemplates) != 1 || !slices.Equal(sts.Spec.VolumeClaimTemplates[0].Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) {
		t.Errorf("minio: want one ReadWriteOnce volume claim template")
	}
	c := sts.Spec.Template.Spec.Containers[0]
	if c.Image != MinIOImage {
		t.Errorf("minio: image %q, want %s", c.Image, MinIOImage)
	}
	for name, key := range map[string]string{"MINIO_ROOT_USER": "accesskey", "MINIO_ROOT_PASSWORD": "secretkey"} {
		e, ok := EnvVar(c, name)
		if !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != s3Secret || e.ValueFrom.SecretKeyRef.Key != key {
			t.Errorf("minio: %s does not come from Secret %s key %s", name, s3Secret, key)
		}
	}
	for kind, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		want := "/minio/health/live"
		if kind == "readiness" {
			want = "/minio/health/ready"
		}
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want {
			t.Errorf("minio: %s probe is not an HTTP GET of %s", kind, want)
		}
	}
	svc, ok := m.Service("minio")
	if !ok || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9000 {
		t.Errorf("no Service minio on port 9000")
	}
	admitted := false
	for _, np := range m.NetworkPolicies {
		sel, _ := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if !sel.Matches(labels.Set(sts.Spec.Template.Labels)) {
			continue
		}
		for _, r := range np.Spec.Ingress {
			for _, peer := range r.From {
				if peer.NamespaceSelector != nil || peer.IPBlock != nil || peer.PodSelector == nil ||
					peer.PodSelector.MatchLabels["app.kubernetes.io/part-of"] != "headwater" {
					t.Errorf("NetworkPolicy %s admits %+v to MinIO; Headwater's pods only", np.Name, peer)
				}
			}
			if len(r.From) == 0 {
				t.Errorf("NetworkPolicy %s admits anyone to MinIO", np.Name)
			}
			admitted = admitted || len(r.From) > 0
		}
	}
	if !admitted {
		t.Errorf("minio: no NetworkPolicy admits Headwater's pods (and only them)")
	}
}

// checkSelfSufficient checks that every Secret a pod needs is one the
// setup Job makes, so the installation starts with nothing else.
func checkSelfSufficient(t *testing.T, m *Manifests) {
	t.Helper()
	made := slices.Clone(natsSecrets)
	if job, ok := m.Job(setupJob); ok {
		if s, ok := FlagValue(job.Spec.Template.Spec.Containers[0], "s3-secret"); ok {
			made = append(made, s)
		}
	}
	for _, w := range m.Workloads() {
		pod := w.Template.Spec
		var needs []string
		for _, v := range pod.Volumes {
			if v.Secret != nil && (v.Secret.Optional == nil || !*v.Secret.Optional) {
				needs = append(needs, v.Secret.SecretName)
			}
		}
		for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && (e.ValueFrom.SecretKeyRef.Optional == nil || !*e.ValueFrom.SecretKeyRef.Optional) {
					needs = append(needs, e.ValueFrom.SecretKeyRef.Name)
				}
			}
			for _, e := range c.EnvFrom {
				if e.SecretRef != nil && (e.SecretRef.Optional == nil || !*e.SecretRef.Optional) {
					needs = append(needs, e.SecretRef.Name)
				}
			}
		}
		for _, n := range needs {
			if !slices.Contains(made, n) {
				t.Errorf("%s/%s needs Secret %s, which the setup Job does not make", w.Kind, w.Name, n)
			}
		}
	}
}

// checkWatcherPDB checks that a drain leaves a watcher running.
func checkWatcherPDB(t *testing.T, m *Manifests) {
	t.Helper()
	d, _ := m.Deployment("watcher")
	for _, p := range m.PDBs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			continue
		}
		if (p.Spec.MaxUnavailable != nil && p.Spec.MaxUnavailable.IntValue() == 1) ||
			(p.Spec.MinAvailable != nil && p.Spec.MinAvailable.IntValue() == 1 && *d.Spec.Replicas >= 2) {
			return
		}
	}
	t.Errorf("watcher: no PodDisruptionBudget keeps one replica through a drain")
}

// checkDirStorage checks that every storage service uses the dir backend
// on the PVC headwater-artifacts at /data, with access mode mode, and reads
// no S3 Secret.
func checkDirStorage(t *testing.T, m *Manifests, mode corev1.PersistentVolumeAccessMode) {
	t.Helper()
	i := slices.IndexFunc(m.PVCs, func(p corev1.PersistentVolumeClaim) bool { return p.Name == "headwater-artifacts" })
	if i < 0 {
		t.Fatalf("no PVC headwater-artifacts (have %v)", m.Names("PersistentVolumeClaim"))
	}
	if got := m.PVCs[i].Spec.AccessModes; !slices.Equal(got, []corev1.PersistentVolumeAccessMode{mode}) {
		t.Errorf("PVC headwater-artifacts: access modes %v, want %s", got, mode)
	}
	for _, s := range storageServices {
		c, pod := container(t, m, s)
		if claim := mountedClaim(c, pod, "/data"); claim != "headwater-artifacts" {
			t.Errorf("%s: /data is %q, want the PVC headwater-artifacts", s, claim)
		}
		if v, _ := FlagValue(c, "storage-backend"); v != "dir" {
			t.Errorf("%s: -storage-backend=%q, want dir", s, v)
		}
		if v, ok := FlagValue(c, "storage-path"); ok && v != "/data" {
			t.Errorf("%s: -storage-path=%q, want /data", s, v)
		}
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, EnvName("storage-s3")) {
				t.Errorf("%s: sets %s on the dir backend", s, e.Name)
			}
		}
	}
}

// TestDeployRWXOverlay checks overlays/rwx: directory storage on a
// ReadWriteMany volume, nothing needed beyond what the setup Job makes.
func TestDeployRWXOverlay(t *testing.T) {
	m, _ := build(t, filepath.Join("deploy", "overlays", "rwx"))
	checkDirStorage(t, m, corev1.ReadWriteMany)
	checkSetup(t, m, false)
	checkSelfSufficient(t, m)
}

// TestDeploySingleNodeOverlay checks overlays/single-node: directory
// storage on one ReadWriteOnce volume, and every pod that mounts it
// required on the node of the others (or, the first, of itself).
func TestDeploySingleNodeOverlay(t *testing.T) {
	m, _ := build(t, filepath.Join("deploy", "overlays", "single-node"))
	checkDirStorage(t, m, corev1.ReadWriteOnce)
	checkSetup(t, m, false)
	checkSelfSufficient(t, m)
	for _, s := range storageServices {
		d, _ := m.Deployment(s)
		a := d.Spec.Template.Spec.Affinity
		if a == nil || a.PodAffinity == nil || len(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 {
			t.Errorf("%s: no required pod affinity", s)
			continue
		}
		term := a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0]
		if term.TopologyKey != "kubernetes.io/hostname" {
			t.Errorf("%s: pod affinity by %q, want kubernetes.io/hostname", s, term.TopologyKey)
		}
		sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		if err != nil {
			t.Fatal(err)
		}
		// The term matches every pod that mounts the volume, its own
		// included: the first one scheduled is admitted anywhere.
		for _, other := range storageServices {
			o, _ := m.Deployment(other)
			if !sel.Matches(labels.Set(o.Spec.Template.Labels)) {
				t.Errorf("%s: pod affinity %s does not match the pods of %s", s, sel, other)
			}
		}
	}
}

// ids lists every rendered resource as Kind/name.
func ids(m *Manifests) []string {
	var out []string
	for id := range m.namespaced() {
		out = append(out, id)
	}
	for _, kind := range []string{"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"} {
		for _, n := range m.Names(kind) {
			out = append(out, kind+"/"+n)
		}
	}
	return out
}

// TestImagesMatchTheMakefile checks that the images the manifests run are
// the ones `make images` builds, where the Makefile says which
// (IMAGE_REGISTRY ?= ..., IMAGE_TAG ?= ...).
func TestImagesMatchTheMakefile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"IMAGE_REGISTRY": ImageRegistry, "IMAGE_TAG": ImageTag} {
		m := regexp.MustCompile(`(?m)^` + name + `\s*\??=\s*(\S+)\s*$`).FindSubmatch(b)
		if m == nil {
			t.Logf("the Makefile sets no %s", name)
			continue
		}
		if string(m[1]) != want {
			t.Errorf("Makefile: %s = %s, the manifests run %s", name, m[1], want)
		}
	}
}
