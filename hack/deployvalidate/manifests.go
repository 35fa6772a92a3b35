package deployvalidate

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// CRD is the part of a CustomResourceDefinition the checks read.
type CRD struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Group string `json:"group"`
		Names struct {
			Kind string `json:"kind"`
		} `json:"names"`
	} `json:"spec"`
}

// PodMonitor is the part of a Prometheus Operator PodMonitor
// (monitoring.coreos.com/v1) components/monitoring writes; decoding is
// strict, so a field outside it is an error.
type PodMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			Interval    string `json:"interval"`
			HonorLabels bool   `json:"honorLabels"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// PrometheusRule is the part of a Prometheus Operator PrometheusRule
// (monitoring.coreos.com/v1) components/monitoring writes.
type PrometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// Manifests are the resources a kustomization renders, decoded into the
// Kubernetes API types.
type Manifests struct {
	Namespaces          []corev1.Namespace
	ServiceAccounts     []corev1.ServiceAccount
	Services            []corev1.Service
	ConfigMaps          []corev1.ConfigMap
	Secrets             []corev1.Secret
	PVCs                []corev1.PersistentVolumeClaim
	Deployments         []appsv1.Deployment
	StatefulSets        []appsv1.StatefulSet
	Jobs                []batchv1.Job
	ClusterRoles        []rbacv1.ClusterRole
	ClusterRoleBindings []rbacv1.ClusterRoleBinding
	Roles               []rbacv1.Role
	RoleBindings        []rbacv1.RoleBinding
	PDBs                []policyv1.PodDisruptionBudget
	NetworkPolicies     []networkingv1.NetworkPolicy
	CRDs                []CRD
	PodMonitors         []PodMonitor
	PrometheusRules     []PrometheusRule
	// Count is the number of resources rendered.
	Count int
}

// Build renders the kustomization in dir (on disk) and decodes it.
func Build(dir string) (*Manifests, error) {
	return BuildFS(filesys.MakeFsOnDisk(), dir)
}

// BuildFS renders the kustomization in dir of fsys and decodes it.
func BuildFS(fsys filesys.FileSystem, dir string) (*Manifests, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	m := &Manifests{}
	for _, r := range rm.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		if err := m.Add(y); err != nil {
			return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
		}
	}
	return m, nil
}

// Add decodes one resource, strictly: a field the API type does not have
// (a typo such as readOnlyRootFileSystem) is an error, and so is a kind the
// checks do not know.
func (m *Manifests) Add(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return fmt.Errorf("decode resource: %w", err)
	}
	var err error
	switch gvk := tm.APIVersion + "/" + tm.Kind; gvk {
	case "v1/Namespace":
		err = decodeInto(doc, &m.Namespaces)
	case "v1/ServiceAccount":
		err = decodeInto(doc, &m.ServiceAccounts)
	case "v1/Service":
		err = decodeInto(doc, &m.Services)
	case "v1/ConfigMap":
		err = decodeInto(doc, &m.ConfigMaps)
	case "v1/Secret":
		err = decodeInto(doc, &m.Secrets)
	case "v1/PersistentVolumeClaim":
		err = decodeInto(doc, &m.PVCs)
	case "apps/v1/Deployment":
		err = decodeInto(doc, &m.Deployments)
	case "apps/v1/StatefulSet":
		err = decodeInto(doc, &m.StatefulSets)
	case "batch/v1/Job":
		err = decodeInto(doc, &m.Jobs)
	case "rbac.authorization.k8s.io/v1/ClusterRole":
		err = decodeInto(doc, &m.ClusterRoles)
	case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
		err = decodeInto(doc, &m.ClusterRoleBindings)
	case "rbac.authorization.k8s.io/v1/Role":
		err = decodeInto(doc, &m.Roles)
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		err = decodeInto(doc, &m.RoleBindings)
	case "policy/v1/PodDisruptionBudget":
		err = decodeInto(doc, &m.PDBs)
	case "networking.k8s.io/v1/NetworkPolicy":
		err = decodeInto(doc, &m.NetworkPolicies)
	case "monitoring.coreos.com/v1/PodMonitor":
		err = decodeInto(doc, &m.PodMonitors)
	case "monitoring.coreos.com/v1/PrometheusRule":
		err = decodeInto(doc, &m.PrometheusRules)
	case "apiextensions.k8s.io/v1/CustomResourceDefinition":
		var crd CRD
		if err = yaml.Unmarshal(doc, &crd); err == nil {
			m.CRDs = append(m.CRDs, crd)
		}
	default:
		return fmt.Errorf("resource of unexpected kind %s", gvk)
	}
	if err != nil {
		return fmt.Errorf("decode %s: %w", tm.Kind, err)
	}
	m.Count++
	return nil
}

// decodeInto decodes doc into a new T and appends it to list. Field names
// match case-sensitively, as the API server's do; an unknown or duplicate
// field is an error.
func decodeInto[T any](doc []byte, list *[]T) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	var v T
	strict, err := kjson.UnmarshalStrict(j, &v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		return errors.Join(strict...)
	}
	*list = append(*list, v)
	return nil
}

// Workload is a pod template with the object that owns it.
type Workload struct {
	// Kind and Name identify the owner (Deployment, StatefulSet or Job).
	Kind, Name string
	// Namespace is the owner's namespace.
	Namespace string
	// Replicas is the owner's replica count (1 when unset).
	Replicas int32
	// Selector is the owner's label selector (nil for a Job, whose
	// selector the API server makes).
	Selector *metav1.LabelSelector
	// Template is the pod template.
	Template corev1.PodTemplateSpec
}

// Workloads returns every Deployment, StatefulSet and Job.
func (m *Manifests) Workloads() []Workload {
	var out []Workload
	replicas := func(r *int32) int32 {
		if r == nil {
			return 1
		}
		return *r
	}
	for _, d := range m.Deployments {
		out = append(out, Workload{Kind: "Deployment", Name: d.Name, Namespace: d.Namespace,
			Replicas: replicas(d.Spec.Replicas), Selector: d.Spec.Selector, Template: d.Spec.Template})
	}
	for _, s := range m.StatefulSets {
		out = append(out, Workload{Kind: "StatefulSet", Name: s.Name, Namespace: s.Namespace,
			Replicas: replicas(s.Spec.Replicas), Selector: s.Spec.Selector, Template: s.Spec.Template})
	}
	for _, j := range m.Jobs {
		out = append(out, Workload{Kind: "Job", Name: j.Name, Namespace: j.Namespace,
			Replicas: 1, Selector: j.Spec.Selector, Template: j.Spec.Template})
	}
	return out
}

// LongRunning reports whether the workload's pods serve until stopped
// (and so need probes), unlike a Job's, which run to completion.
func (w Workload) LongRunning() bool { return w.Kind != "Job" }

// Job returns the Job named name.
func (m *Manifests) Job(name string) (batchv1.Job, bool) {
	return find(m.Jobs, func(j batchv1.Job) bool { return j.Name == name })
}

// Deployment returns the Deployment named name.
func (m *Manifests) Deployment(name string) (appsv1.Deployment, bool) {
	return find(m.Deployments, func(d appsv1.Deployment) bool { return d.Name == name })
}

// Service returns the Service named name.
func (m *Manifests) Service(name string) (corev1.Service, bool) {
	return find(m.Services, func(s corev1.Service) bool { return s.Name == name })
}

// ClusterRole returns the ClusterRole named name.
func (m *Manifests) ClusterRole(name string) (rbacv1.ClusterRole, bool) {
	return find(m.ClusterRoles, func(r rbacv1.ClusterRole) bool { return r.Name == name })
}

// Role returns the Role named name.
func (m *Manifests) Role(name string) (rbacv1.Role, bool) {
	return find(m.Roles, func(r rbacv1.Role) bool { return r.Name == name })
}

// ConfigMap returns the ConfigMap named name.
func (m *Manifests) ConfigMap(name string) (corev1.ConfigMap, bool) {
	return find(m.ConfigMaps, func(c corev1.ConfigMap) bool { return c.Name == name })
}

// Has reports whether a resource of kind is named name.
func (m *Manifests) Has(kind, name string) bool {
	return slices.Contains(m.Names(kind), name)
}

// Names returns the names of the resources of kind.
func (m *Manifests) Names(kind string) []string {
	var out []string
	add := func(om metav1.ObjectMeta) { out = append(out, om.Name) }
	switch kind {
	case "Namespace":
		each(m.Namespaces, func(o corev1.Namespace) { add(o.ObjectMeta) })
	case "ServiceAccount":
		each(m.ServiceAccounts, func(o corev1.ServiceAccount) { add(o.ObjectMeta) })
	case "Service":
		each(m.Services, func(o corev1.Service) { add(o.ObjectMeta) })
	case "ConfigMap":
		each(m.ConfigMaps, func(o corev1.ConfigMap) { add(o.ObjectMeta) })
	case "Secret":
		each(m.Secrets, func(o corev1.Secret) { add(o.ObjectMeta) })
	case "PersistentVolumeClaim":
		each(m.PVCs, func(o corev1.PersistentVolumeClaim) { add(o.ObjectMeta) })
	case "Deployment":
		each(m.Deployments, func(o appsv1.Deployment) { add(o.ObjectMeta) })
	case "StatefulSet":
		each(m.StatefulSets, func(o appsv1.StatefulSet) { add(o.ObjectMeta) })
	case "Job":
		each(m.Jobs, func(o batchv1.Job) { add(o.ObjectMeta) })
	case "ClusterRole":
		each(m.ClusterRoles, func(o rbacv1.ClusterRole) { add(o.ObjectMeta) })
	case "ClusterRoleBinding":
		each(m.ClusterRoleBindings, func(o rbacv1.ClusterRoleBinding) { add(o.ObjectMeta) })
	case "Role":
		each(m.Roles, func(o rbacv1.Role) { add(o.ObjectMeta) })
	case "RoleBinding":
		each(m.RoleBindings, func(o rbacv1.RoleBinding) { add(o.ObjectMeta) })
	case "PodDisruptionBudget":
		each(m.PDBs, func(o policyv1.PodDisruptionBudget) { add(o.ObjectMeta) })
	case "NetworkPolicy":
		each(m.NetworkPolicies, func(o networkingv1.NetworkPolicy) { add(o.ObjectMeta) })
	case "CustomResourceDefinition":
		each(m.CRDs, func(o CRD) { add(o.ObjectMeta) })
	}
	return out
}

// namespaced returns kind/name and namespace of every namespaced resource.
func (m *Manifests) namespaced() map[string]string {
	out := map[string]string{}
	add := func(kind string, om metav1.ObjectMeta) { out[kind+"/"+om.Name] = om.Namespace }
	each(m.ServiceAccounts, func(o corev1.ServiceAccount) { add("ServiceAccount", o.ObjectMeta) })
	each(m.Services, func(o corev1.Service) { add("Service", o.ObjectMeta) })
	each(m.ConfigMaps, func(o corev1.ConfigMap) { add("ConfigMap", o.ObjectMeta) })
	each(m.Secrets, func(o corev1.Secret) { add("Secret", o.ObjectMeta) })
	each(m.PVCs, func(o corev1.PersistentVolumeClaim) { add("PersistentVolumeClaim", o.ObjectMeta) })
	each(m.Deployments, func(o appsv1.Deployment) { add("Deployment", o.ObjectMeta) })
	each(m.StatefulSets, func(o appsv1.StatefulSet) { add("StatefulSet", o.ObjectMeta) })
	each(m.Jobs, func(o batchv1.Job) { add("Job", o.ObjectMeta) })
	each(m.Roles, func(o rbacv1.Role) { add("Role", o.ObjectMeta) })
	each(m.RoleBindings, func(o rbacv1.RoleBinding) { add("RoleBinding", o.ObjectMeta) })
	each(m.PDBs, func(o policyv1.PodDisruptionBudget) { add("PodDisruptionBudget", o.ObjectMeta) })
	each(m.NetworkPolicies, func(o networkingv1.NetworkPolicy) { add("NetworkPolicy", o.ObjectMeta) })
	return out
}

func find[T any](list []T, match func(T) bool) (T, bool) {
	for _, v := range list {
		if match(v) {
			return v, true
		}
	}
	var zero T
	return zero, false
}

func each[T any](list []T, f func(T)) {
	for _, v := range list {
		f(v)
	}
}

// Allows reports whether rules grant verb on resource in group.
func Allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if matches(r.APIGroups, group) && matches(r.Resources, resource) && matches(r.Verbs, verb) {
			return true
		}
	}
	return false
}

func matches(list []string, v string) bool {
	return slices.Contains(list, v) || slices.Contains(list, "*")
}

// EnvValue returns the literal value of the environment variable name in
// container c.
func EnvValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom == nil {
			return e.Value, true
		}
	}
	return "", false
}

// EnvVar returns the environment variable name of container c.
func EnvVar(c corev1.Container, name string) (corev1.EnvVar, bool) {
	return find(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
}

// Expand replaces $(VAR) references in s with the literal values of the
// variables in env, as the kubelet does; fieldRef metadata.namespace
// resolves to namespace.
func Expand(s string, env []corev1.EnvVar, namespace string) string {
	for _, e := range env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
				continue
			}
			v = namespace
		}
		s = strings.ReplaceAll(s, "$("+e.Name+")", v)
	}
	return s
}
