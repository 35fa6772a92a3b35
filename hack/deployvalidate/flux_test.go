package deployvalidate

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// fluxOverlay is the drop-in for Flux's source-controller, under
// deploy/overlays, and fluxNamespace the namespace it installs into, as
// `flux install` does.
const (
	fluxOverlay   = "flux-system"
	fluxNamespace = "flux-system"
)

// rendering is what a kustomization renders: the decoded resources and the
// YAML they came from.
type rendering struct {
	*Manifests
	YAML string
}

// render builds the kustomization in dir of fsys, keeping its YAML.
func render(t *testing.T, fsys filesys.FileSystem, dir string) rendering {
	t.Helper()
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	y, err := rm.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	m := &Manifests{}
	for _, r := range rm.Resources() {
		doc, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Add(doc); err != nil {
			t.Fatalf("kustomize build %s: %v", dir, err)
		}
	}
	return rendering{Manifests: m, YAML: string(y)}
}

// TestFluxSystemOverlay renders deploy/overlays/flux-system as shipped and
// moved into another namespace by a kustomization on top (as a user with
// Flux installed elsewhere would), and checks that in both it is a drop-in
// for Flux's source-controller: everything in the one namespace, nothing
// left in headwater-system, every RoleBinding and ClusterRoleBinding
// subject in that namespace, the Service source-controller on port 80
// serving the artifact-servers, which advertise its cluster DNS name, and
// the watcher's events going to Flux's notification-controller; and that
// it takes nothing `flux install` owns: no Flux CRD, no Namespace, no
// Deployment source-controller.
func TestFluxSystemOverlay(t *testing.T) {
	for _, tc := range []struct {
		ns         string
		components []string
	}{
		{ns: fluxNamespace},
		{ns: "gitops-tenant"},
		// The optional components bring ServiceAccounts and bindings of
		// their own, and bind base's watcher.
		{ns: "gitops-tenant", components: []string{"receivers", "dispatcher", "monitoring"}},
	} {
		ns := tc.ns
		t.Run(strings.Join(append([]string{ns}, tc.components...), "+"), func(t *testing.T) {
			fsys := memDeploy(t)
			dir := "/deploy/overlays/" + fluxOverlay
			if ns != fluxNamespace || len(tc.components) > 0 {
				k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: %s\nresources:\n  - ../deploy/overlays/%s\ncomponents:\n", ns, fluxOverlay)
				for _, c := range tc.components {
					k += "  - ../deploy/components/" + c + "\n"
				}
				if err := fsys.WriteFile("/user/kustomization.yaml", []byte(k)); err != nil {
					t.Fatal(err)
				}
				dir = "/user"
			}
			r := render(t, fsys, dir)
			m, _ := checkManifestsIn(t, r.Manifests, ns, false)

			if strings.Contains(r.YAML, namespace) {
				for i, line := range strings.Split(r.YAML, "\n") {
					if strings.Contains(line, namespace) {
						t.Errorf("line %d still names %s: %s", i+1, namespace, strings.TrimSpace(line))
					}
				}
			}
			checkSubjectsIn(t, m, ns)
			checkDropInService(t, m, ns)
			checkFluxOwnsItsOwn(t, m)

			watcher, _ := container(t, m, "watcher")
			addr, ok := FlagValue(watcher, "events-addr")
			if want := "http://notification-controller." + ns + ".svc.cluster.local./"; !ok || Expand(addr, watcher.Env, ns) != want {
				t.Errorf("watcher -events-addr %q, want it to expand to %q", addr, want)
			}
			checkFluxGuard(t, m, watcher, ns)
			checkFluxTooling(t, m)
		})
	}
}

// checkFluxTooling checks what `flux check` and `flux logs` (flux2 v2.7,
// cmd/flux/check.go and logs.go) find: the Deployments of the namespace
// labelled app.kubernetes.io/part-of=flux (Headwater's four services'
// among them, MinIO's not), and for each one pod by its template's labels,
// whose only container is the one logs are read from (or one named
// "manager"). The pods keep part-of=headwater, which the NetworkPolicies
// admit to NATS.
func checkFluxTooling(t *testing.T, m *Manifests) {
	t.Helper()
	var flux []string
	for _, d := range m.Deployments {
		if d.Labels["app.kubernetes.io/part-of"] != "flux" {
			continue
		}
		flux = append(flux, d.Name)
		if d.Labels["app.kubernetes.io/component"] == "" || d.Spec.Template.Labels["app.kubernetes.io/component"] != d.Labels["app.kubernetes.io/component"] {
			t.Errorf("Deployment %s: component label %q, pods' %q", d.Name, d.Labels["app.kubernetes.io/component"], d.Spec.Template.Labels["app.kubernetes.io/component"])
		}
		if got := d.Spec.Template.Labels["app.kubernetes.io/part-of"]; got != "headwater" {
			t.Errorf("Deployment %s: pods part-of %q, want headwater (the NetworkPolicies admit it to NATS)", d.Name, got)
		}
		if cs := d.Spec.Template.Spec.Containers; len(cs) > 1 && !slices.ContainsFunc(cs, func(c corev1.Container) bool { return c.Name == "manager" }) {
			t.Errorf("Deployment %s: %d containers and none named manager: flux logs reads none", d.Name, len(cs))
		}
		// flux logs lists pods by the template's labels: only this
		// Deployment's.
		for _, w := range m.Workloads() {
			if w.Name != d.Name && labels.SelectorFromSet(d.Spec.Template.Labels).Matches(labels.Set(w.Template.Labels)) {
				t.Errorf("flux logs would read %s %s's pods for Deployment %s", w.Kind, w.Name, d.Name)
			}
		}
	}
	slices.Sort(flux)
	if want := []string{"artifact-server", "fetcher", "packager", "watcher"}; !slices.Equal(flux, want) {
		t.Errorf("Deployments labelled part-of=flux: %v, want %v", flux, want)
	}
}

// checkSubjectsIn checks that every RoleBinding and ClusterRoleBinding
// binds ServiceAccounts of ns that the rendering creates, and that each
// ServiceAccount a workload runs as is bound to something.
func checkSubjectsIn(t *testing.T, m *Manifests, ns string) {
	t.Helper()
	bound := map[string]bool{}
	check := func(id string, subjects []rbacv1.Subject) {
		if len(subjects) == 0 {
			t.Errorf("%s has no subjects", id)
		}
		for _, s := range subjects {
			if s.Kind != rbacv1.ServiceAccountKind {
				t.Errorf("%s binds %s %s; want ServiceAccounts only", id, s.Kind, s.Name)
				continue
			}
			if s.Namespace != ns {
				t.Errorf("%s binds ServiceAccount %s in namespace %q, want %q", id, s.Name, s.Namespace, ns)
			}
			if !m.Has("ServiceAccount", s.Name) {
				t.Errorf("%s binds ServiceAccount %s, which is not created", id, s.Name)
			}
			bound[s.Name] = true
		}
	}
	for _, b := range m.ClusterRoleBindings {
		check("ClusterRoleBinding/"+b.Name, b.Subjects)
	}
	for _, b := range m.RoleBindings {
		check("RoleBinding/"+b.Name, b.Subjects)
	}
	// The services that talk to the API server must be bound, or they
	// are Forbidden whatever the subjects say.
	for _, sa := range []string{"watcher", "fetcher", "setup"} {
		if !bound[sa] {
			t.Errorf("ServiceAccount %s is bound to no role", sa)
		}
	}
}

// checkDropInService checks the Service Flux's consumers download from,
// source-controller:80 in ns: it selects the artifact-servers and only
// them, targets the port they serve on, and is the host they put in every
// artifact URL; the artifact-servers' pods also carry app:
// source-controller, the selector of Flux's own Service; and their
// NetworkPolicy admits the namespace's pods (Flux's controllers).
// tenantURLClients are Headwater's workloads that request the URLs tenants
// write (sources, sinks, hooks): none of them may reach an artifact-server.
var tenantURLClients = []string{"fetcher", "httpsource-fetcher", "dispatcher", "receiver"}

func checkDropInService(t *testing.T, m *Manifests, ns string) {
	t.Helper()
	svc, ok := m.Service("source-controller")
	if !ok {
		t.Fatal("no Service source-controller")
	}
	var selected []string
	for _, w := range m.Workloads() {
		if len(svc.Spec.Selector) > 0 && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(w.Template.Labels)) {
			selected = append(selected, w.Kind+"/"+w.Name)
		}
	}
	if !slices.Equal(selected, []string{"Deployment/artifact-server"}) {
		t.Errorf("Service source-controller selects %v, want the artifact-servers alone", selected)
	}
	c, _ := container(t, m, "artifact-server")
	d, _ := m.Deployment("artifact-server")
	if got := d.Spec.Template.Labels["app"]; got != "source-controller" {
		t.Errorf("artifact-server pods are labelled app=%q; want source-controller, which Flux's own Service selects", got)
	}
	addr, ok := FlagValue(c, "storage-addr")
	if !ok {
		addr = ":9090"
	}
	listen, err := addrPort(addr)
	if err != nil {
		t.Fatalf("artifact-server -storage-addr %q: %v", addr, err)
	}
	var on80 bool
	for _, p := range svc.Spec.Ports {
		if p.Port != 80 {
			continue
		}
		on80 = true
		if port, err := ContainerPort(c, p.TargetPort); err != nil || port != listen {
			t.Errorf("Service source-controller:80 targets %v (%v), want the artifact-server's %d", p.TargetPort, err, listen)
		}
	}
	if !on80 {
		t.Error("Service source-controller has no port 80")
	}
	adv, _ := FlagValue(c, "storage-adv-addr")
	if want := "source-controller." + ns + ".svc.cluster.local."; Expand(adv, c.Env, ns) != want {
		t.Errorf("artifact-server -storage-adv-addr %q expands to %q, want %q", adv, Expand(adv, c.Env, ns), want)
	}

	// Flux's controllers (labelled as `flux install` labels them) reach
	// the artifact-servers; Headwater's pods that request tenants' URLs
	// do not (docs/security.md, "Egress").
	fluxController := labels.Set{"app": "kustomize-controller"}
	var admitted bool
	for _, np := range m.NetworkPolicies {
		if !labels.SelectorFromSet(np.Spec.PodSelector.MatchLabels).Matches(labels.Set(d.Spec.Template.Labels)) {
			continue
		}
		for _, in := range np.Spec.Ingress {
			for _, from := range in.From {
				if from.NamespaceSelector != nil || from.IPBlock != nil || from.PodSelector == nil {
					continue
				}
				sel, err := metav1.LabelSelectorAsSelector(from.PodSelector)
				if err != nil {
					t.Errorf("NetworkPolicy %s: %v", np.Name, err)
					continue
				}
				admitted = admitted || sel.Matches(fluxController)
				for _, w := range m.Workloads() {
					if slices.Contains(tenantURLClients, w.Name) && sel.Matches(labels.Set(w.Template.Labels)) {
						t.Errorf("NetworkPolicy %s admits %s/%s, which requests tenants' URLs, to the artifact-servers", np.Name, w.Kind, w.Name)
					}
				}
			}
		}
	}
	if !admitted {
		t.Error("no NetworkPolicy admits the namespace's pods (Flux's controllers) to the artifact-servers")
	}
}

// checkFluxOwnsItsOwn checks that the drop-in creates nothing `flux
// install` owns: the source.toolkit.fluxcd.io CRDs, the namespace, and
// Flux's source-controller Deployment, which must stay Flux's (scaled to
// 0) rather than be replaced or fought over.
func checkFluxOwnsItsOwn(t *testing.T, m *Manifests) {
	t.Helper()
	for _, c := range m.CRDs {
		if c.Spec.Group == "source.toolkit.fluxcd.io" {
			t.Errorf("installs Flux's CRD %s", c.Name)
		}
	}
	if !m.Has("CustomResourceDefinition", "subscriptions.events.headwater.dev") {
		t.Error("does not install Headwater's own CRD, subscriptions.events.headwater.dev")
	}
	if len(m.Namespaces) > 0 {
		t.Errorf("creates Namespaces %v, which are Flux's", m.Names("Namespace"))
	}
	if m.Has("Deployment", "source-controller") {
		t.Error("has a Deployment source-controller, Flux's name")
	}
}

// checkFluxGuard checks that the watcher looks for Flux's source-controller
// in the namespace it is installed into (and Flux's default), and may: a
// drop-in applied while Flux's controller runs must wait, not fight it.
func checkFluxGuard(t *testing.T, m *Manifests, watcher corev1.Container, ns string) {
	t.Helper()
	v, ok := FlagValue(watcher, "flux-source-controller-namespaces")
	namespaces := strings.Split(Expand(v, watcher.Env, ns), ",")
	if !ok || !slices.Contains(namespaces, ns) || !slices.Contains(namespaces, fluxNamespace) {
		t.Errorf("watcher -flux-source-controller-namespaces %q expands to %v, want %s and %s", v, namespaces, ns, fluxNamespace)
	}
	role, ok := m.ClusterRole("headwater-watcher")
	if !ok {
		t.Fatal("no ClusterRole headwater-watcher")
	}
	var named bool
	for _, r := range role.Rules {
		if matches(r.APIGroups, "apps") && matches(r.Resources, "deployments") {
			// Get and list, to find Flux's sharded source-controllers
			// (source-controller-<shard>) too; never a write.
			if !slices.Equal(r.Verbs, []string{"get", "list"}) || len(r.ResourceNames) != 0 {
				t.Errorf("the watcher may %v Deployments %v; want get and list, nothing else", r.Verbs, r.ResourceNames)
			}
			named = true
		}
	}
	if !named {
		t.Error("the watcher may not look for Flux's source-controller Deployments")
	}
}
