package deployvalidate

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// HealthFlag is the flag whose address serves a service's /healthz and
// /readyz: the watcher has its own, the others serve them with /metrics.
func HealthFlag(service string) string {
	if service == "watcher" {
		return "health-addr"
	}
	return "telemetry-addr"
}

// varRef matches a $(VAR) reference in an env value, a command or an arg.
var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// CheckWorkload checks one pod template: every container's image,
// security, resources, probes (but a Job's), environment and arguments. Containers named after a
// Headwater service are checked against that service's flags; no other
// container may set HEADWATER_* variables.
func CheckWorkload(w Workload, flags map[string]FlagSet) []string {
	var problems []string
	report := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf("%s/%s: ", w.Kind, w.Name)+fmt.Sprintf(format, args...))
	}
	pod := w.Template.Spec
	if w.Selector == nil {
		if w.LongRunning() {
			report("no selector")
		}
	} else if sel, err := metav1.LabelSelectorAsSelector(w.Selector); err != nil {
		report("selector: %v", err)
	} else if !sel.Matches(labels.Set(w.Template.Labels)) {
		report("selector %s does not match the pod template's labels", sel)
	}
	if pod.ServiceAccountName == "" {
		report("no serviceAccountName (the namespace's default account would be used)")
	}
	volumes := map[string]bool{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = true
		// A Secret readable by its group only is readable by a non-root
		// container only through fsGroup (the kubelet gives the files
		// that group).
		if v.Secret != nil && v.Secret.DefaultMode != nil && *v.Secret.DefaultMode&0o004 == 0 && !readableByOwner(pod) &&
			(pod.SecurityContext == nil || pod.SecurityContext.FSGroup == nil) {
			report("Secret volume %s is mode %#o and the pod sets no fsGroup: a non-root container cannot read it", v.Name, *v.Secret.DefaultMode)
		}
	}
	if w.Kind == "StatefulSet" {
		// volumeClaimTemplates are volumes too; their names are not in
		// the template, so accept any mount the pod does not define here.
		volumes["*"] = true
	}
	all := slices.Concat(pod.InitContainers, pod.Containers)
	if len(pod.Containers) == 0 {
		report("no containers")
	}
	if !w.LongRunning() {
		if pod.RestartPolicy != corev1.RestartPolicyOnFailure && pod.RestartPolicy != corev1.RestartPolicyNever {
			report("restartPolicy %q: a Job's pods must be OnFailure or Never", pod.RestartPolicy)
		}
	}
	for _, c := range all {
		for _, p := range checkContainer(pod, c, volumes, flags, w.LongRunning()) {
			report("container %s: %s", c.Name, p)
		}
	}
	return problems
}

// readableByOwner tells whether the pod runs as root, which reads any
// mounted file.
func readableByOwner(pod corev1.PodSpec) bool {
	return pod.SecurityContext != nil && pod.SecurityContext.RunAsUser != nil && *pod.SecurityContext.RunAsUser == 0
}

func checkContainer(pod corev1.PodSpec, c corev1.Container, volumes map[string]bool, flags map[string]FlagSet, longRunning bool) []string {
	var problems []string
	report := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	if !slices.Contains(Images(), c.Image) {
		report("image %q is none of the documented %v", c.Image, Images())
	}
	if c.ImagePullPolicy != corev1.PullIfNotPresent {
		report("imagePullPolicy %q, want IfNotPresent (a tagged release; preloaded images are used)", c.ImagePullPolicy)
	}

	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Limits[r]; !ok || q.IsZero() {
			report("no %s limit", r)
		}
		if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
			report("no %s request", r)
		}
	}

	psc := pod.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	sc := c.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	if nonRoot := firstBool(sc.RunAsNonRoot, psc.RunAsNonRoot); nonRoot == nil || !*nonRoot {
		report("runAsNonRoot is not true")
	}
	if uid := firstInt(sc.RunAsUser, psc.RunAsUser); uid != nil && *uid == 0 {
		report("runs as uid 0")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		report("readOnlyRootFilesystem is not true")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		report("allowPrivilegeEscalation is not false")
	}
	if sc.Privileged != nil && *sc.Privileged {
		report("privileged")
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		report("capabilities do not drop ALL")
	} else if len(sc.Capabilities.Add) > 0 {
		report("adds capabilities %v", sc.Capabilities.Add)
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil {
		seccomp = psc.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		report("seccomp profile is not RuntimeDefault")
	}

	for _, m := range c.VolumeMounts {
		if !volumes[m.Name] && !volumes["*"] {
			report("mounts volume %q, which the pod does not define", m.Name)
		}
	}

	// Environment: no duplicates, $(VAR) only to variables defined before.
	seen := map[string]bool{}
	var names []string
	for _, e := range c.Env {
		if seen[e.Name] {
			report("environment variable %s is set twice", e.Name)
		}
		for _, ref := range varRef.FindAllStringSubmatch(e.Value, -1) {
			if !seen[ref[1]] {
				report("environment variable %s refers to $(%s), which is not defined before it", e.Name, ref[1])
			}
		}
		seen[e.Name] = true
		names = append(names, e.Name)
	}
	for _, a := range slices.Concat(c.Command, c.Args) {
		for _, ref := range varRef.FindAllStringSubmatch(a, -1) {
			if !seen[ref[1]] {
				report("argument %q refers to $(%s), which is not defined", a, ref[1])
			}
		}
	}

	service := c.Name
	if !IsService(service) {
		for _, n := range names {
			if strings.HasPrefix(n, EnvPrefix) {
				report("is no Headwater service but sets %s", n)
			}
		}
		if longRunning {
			problems = append(problems, checkProbes(c, "", nil)...)
		}
		return problems
	}
	fs, ok := flags[service]
	if !ok {
		return append(problems, fmt.Sprintf("no flags known for service %s", service))
	}
	if !strings.Contains(c.Image, "headwater") {
		report("image %q is not the headwater image", c.Image)
	}
	if len(c.Command) > 0 {
		report("overrides the image's entrypoint with %v", c.Command)
	}
	problems = append(problems, CheckEnv(service, fs, names)...)
	// The image holds every service: the first argument picks this one.
	args, ok := TargetArgs(service, c.Args)
	if !ok {
		report("args %q do not start with -target=%s (the headwater image runs the service -target names)", c.Args, service)
	}
	if slices.Contains(Commands, service) && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		// A command's first argument names what it does (setup ensure).
		args = args[1:]
	}
	problems = append(problems, CheckArgs(service, fs, args)...)
	if longRunning {
		problems = append(problems, checkProbes(c, service, fs)...)
	}
	return problems
}

// checkProbes checks that the container has startup, liveness and
// readiness probes on one of its ports and, for a Headwater service, that
// they are on the port its health flag listens on, at /healthz (startup,
// liveness) and /readyz, the startup probe allowing two minutes.
func checkProbes(c corev1.Container, service string, fs FlagSet) []string {
	var problems []string
	report := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	wantPort := -1
	if service != "" {
		flag := HealthFlag(service)
		addr, ok := FlagValue(c, flag)
		if !ok {
			report("-%s is not set (env %s or argument), so its probes cannot be checked", flag, EnvName(flag))
		} else if port, err := addrPort(addr); err != nil {
			report("-%s %q: %v", flag, addr, err)
		} else {
			wantPort = port
		}
	}
	for _, p := range []struct {
		kind  string
		probe *corev1.Probe
		path  string
	}{{"startup", c.StartupProbe, "/healthz"}, {"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil {
			report("no %s probe", p.kind)
			continue
		}
		if p.probe.HTTPGet == nil {
			if service != "" {
				report("%s probe is not an HTTP GET", p.kind)
			}
			continue
		}
		port, err := ContainerPort(c, p.probe.HTTPGet.Port)
		if err != nil {
			report("%s probe: %v", p.kind, err)
			continue
		}
		if service == "" {
			continue
		}
		if wantPort >= 0 && port != wantPort {
			report("%s probe on port %d, but -%s listens on %d", p.kind, port, HealthFlag(service), wantPort)
		}
		if path, _, _ := strings.Cut(p.probe.HTTPGet.Path, "?"); path != p.path {
			report("%s probe path %q, want %q", p.kind, p.probe.HTTPGet.Path, p.path)
		}
		// Two minutes to start, checked every two seconds: a service
		// waiting for NATS or the storage is not restarted, and is Ready
		// soon after they are.
		if p.kind == "startup" && (p.probe.PeriodSeconds != 2 || p.probe.FailureThreshold != 60) {
			report("startup probe every %ds, %d times; want every 2s, 60 times", p.probe.PeriodSeconds, p.probe.FailureThreshold)
		}
	}
	return problems
}

// FlagValue returns the value container c gives a flag: its argument, which
// wins, else its literal HEADWATER_* environment variable.
func FlagValue(c corev1.Container, flag string) (string, bool) {
	if v, ok := ArgValue(c.Args, flag); ok {
		return v, true
	}
	return EnvValue(c, EnvName(flag))
}

// ContainerPort resolves a probe's or Service's target port against the
// container's declared ports; a named port must be declared, a number must
// be too.
func ContainerPort(c corev1.Container, p intstr.IntOrString) (int, error) {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("port %s is not a declared container port", p.String())
}

// addrPort returns the port of a listen address such as ":9100".
func addrPort(addr string) (int, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(port)
}

// CheckReferences checks what the resources refer to among themselves:
// namespaces, Service selectors and target ports, ServiceAccounts, volumes'
// PersistentVolumeClaims, ConfigMaps and Secrets, and RBAC bindings. Secrets
// named in external exist outside the manifests (created by the user).
// createsNamespace says whether the rendering owns its namespace (deploy/
// and its overlays) or installs into one that is someone else's (the
// flux-system of `flux install`), which it then must not create.
func CheckReferences(m *Manifests, namespace string, createsNamespace bool, external []string) []string {
	var problems []string
	report := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	for id, ns := range m.namespaced() {
		if ns != namespace {
			report("%s is in namespace %q, want %q", id, ns, namespace)
		}
	}
	switch created := m.Has("Namespace", namespace); {
	case createsNamespace && !created:
		report("namespace %s is not created", namespace)
	case !createsNamespace && created:
		report("namespace %s is created, but it belongs to another installation", namespace)
	}

	workloads := m.Workloads()
	for _, s := range m.Services {
		if len(s.Spec.Selector) == 0 {
			report("Service %s has no selector", s.Name)
			continue
		}
		var backends []Workload
		for _, w := range workloads {
			if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(w.Template.Labels)) {
				backends = append(backends, w)
			}
		}
		if len(backends) == 0 {
			report("Service %s selects no pods", s.Name)
			continue
		}
		for _, sp := range s.Spec.Ports {
			target := sp.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(sp.Port)
			}
			for _, w := range backends {
				found := false
				for _, c := range w.Template.Spec.Containers {
					if _, err := ContainerPort(c, target); err == nil {
						found = true
					}
				}
				if !found {
					report("Service %s port %d: target %s is no port of %s/%s", s.Name, sp.Port, target.String(), w.Kind, w.Name)
				}
			}
		}
	}

	secrets := slices.Concat(m.Names("Secret"), external)
	for _, w := range workloads {
		id := w.Kind + "/" + w.Name
		pod := w.Template.Spec
		if sa := pod.ServiceAccountName; sa != "" && !m.Has("ServiceAccount", sa) {
			report("%s uses ServiceAccount %s, which does not exist", id, sa)
		}
		for _, v := range pod.Volumes {
			switch {
			case v.PersistentVolumeClaim != nil && !m.Has("PersistentVolumeClaim", v.PersistentVolumeClaim.ClaimName):
				report("%s volume %s: PersistentVolumeClaim %s does not exist", id, v.Name, v.PersistentVolumeClaim.ClaimName)
			case v.ConfigMap != nil && !m.Has("ConfigMap", v.ConfigMap.Name):
				report("%s volume %s: ConfigMap %s does not exist", id, v.Name, v.ConfigMap.Name)
			case v.Secret != nil && !slices.Contains(secrets, v.Secret.SecretName):
				report("%s volume %s: Secret %s does not exist", id, v.Name, v.Secret.SecretName)
			}
		}
		for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
			for _, e := range c.Env {
				if e.ValueFrom == nil {
					continue
				}
				if r := e.ValueFrom.SecretKeyRef; r != nil && !slices.Contains(secrets, r.Name) {
					report("%s container %s: %s refers to Secret %s, which does not exist", id, c.Name, e.Name, r.Name)
				}
				if r := e.ValueFrom.ConfigMapKeyRef; r != nil && !m.Has("ConfigMap", r.Name) {
					report("%s container %s: %s refers to ConfigMap %s, which does not exist", id, c.Name, e.Name, r.Name)
				}
			}
		}
	}

	checkSubjects := func(id string, subjects []rbacv1.Subject) {
		for _, s := range subjects {
			if s.Kind != "ServiceAccount" {
				continue
			}
			if !m.Has("ServiceAccount", s.Name) || s.Namespace != namespace {
				report("%s binds ServiceAccount %s/%s, which does not exist", id, s.Namespace, s.Name)
			}
		}
	}
	for _, b := range m.ClusterRoleBindings {
		if b.RoleRef.Kind != "ClusterRole" || !m.Has("ClusterRole", b.RoleRef.Name) {
			report("ClusterRoleBinding %s refers to %s %s, which is not defined here", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		checkSubjects("ClusterRoleBinding/"+b.Name, b.Subjects)
	}
	for _, b := range m.RoleBindings {
		if !(b.RoleRef.Kind == "Role" && m.Has("Role", b.RoleRef.Name)) && !(b.RoleRef.Kind == "ClusterRole" && m.Has("ClusterRole", b.RoleRef.Name)) {
			report("RoleBinding %s refers to %s %s, which is not defined here", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		checkSubjects("RoleBinding/"+b.Name, b.Subjects)
	}
	return problems
}

func firstBool(vs ...*bool) *bool {
	for _, v := range vs {
		if v != nil {
			return v
		}
	}
	return nil
}

func firstInt(vs ...*int64) *int64 {
	for _, v := range vs {
		if v != nil {
			return v
		}
	}
	return nil
}

// CheckNetworkPolicies checks that every NetworkPolicy selects at least one
// workload's pods, that the ports it admits are ports of those pods, and
// that every pod selector of its peers (in the namespace) selects some
// workload: a policy that selects nothing, or admits by a label no pod has,
// silently blocks or opens traffic.
func CheckNetworkPolicies(m *Manifests) []string {
	var problems []string
	report := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	workloads := m.Workloads()
	selected := func(sel metav1.LabelSelector) []Workload {
		s, err := metav1.LabelSelectorAsSelector(&sel)
		if err != nil {
			return nil
		}
		var out []Workload
		for _, w := range workloads {
			if s.Matches(labels.Set(w.Template.Labels)) {
				out = append(out, w)
			}
		}
		return out
	}
	for _, np := range m.NetworkPolicies {
		targets := selected(np.Spec.PodSelector)
		if len(targets) == 0 {
			report("NetworkPolicy %s selects no workload's pods", np.Name)
			continue
		}
		for _, rule := range np.Spec.Ingress {
			for _, peer := range rule.From {
				if peer.PodSelector != nil && peer.NamespaceSelector == nil && len(selected(*peer.PodSelector)) == 0 {
					report("NetworkPolicy %s admits pods by %v, which no workload's pods have", np.Name, peer.PodSelector.MatchLabels)
				}
			}
			for _, p := range rule.Ports {
				if p.Port == nil {
					continue
				}
				for _, w := range targets {
					found := false
					for _, c := range w.Template.Spec.Containers {
						if _, err := ContainerPort(c, *p.Port); err == nil {
							found = true
						}
					}
					if !found {
						report("NetworkPolicy %s: port %s is no port of %s/%s", np.Name, p.Port.String(), w.Kind, w.Name)
					}
				}
			}
		}
	}
	return problems
}
