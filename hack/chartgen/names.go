package main

import (
	"fmt"
	"strings"
)

// ClusterPrefix starts the name of every cluster-scoped object of deploy/
// (its ClusterRoles and ClusterRoleBindings). The chart replaces it with
// the release's full name (templates/_helpers.tpl, headwater.fullname),
// which is "headwater" for a release named headwater: two releases in two
// namespaces then own two sets of them, and the release headwater renders
// deploy/'s names. Namespaced objects keep deploy/'s names (one release
// per namespace): the Service source-controller is the name Flux's
// consumers use, and the setup Job's Secrets are named by the services.
const ClusterPrefix = "headwater-"

// workloadBySA returns the workload whose pods run as ServiceAccount sa.
func workloadBySA(sa string) (Workload, bool) {
	for _, w := range Workloads {
		if w.ServiceAccount == sa {
			return w, true
		}
	}
	return Workload{}, false
}

// serviceAccountName is the token of the name of w's ServiceAccount:
// .Values.<key>.serviceAccount.name, or deploy/'s; for a watcher shard,
// that name and "-<shard>".
func (p *Parameterizer) serviceAccountName(w Workload) string {
	if isShardTemplate(w.ServiceAccount) {
		// A shard's: the watcher's, suffixed with the shard's name.
		base := strings.TrimSuffix(w.ServiceAccount, "-"+ShardTemplate)
		return p.token("inline", "serviceaccount."+w.ServiceAccount,
			fmt.Sprintf("{{ printf \"%%s-%%s\" (.Values.%s.serviceAccount.name | default %q) $shard }}", w.Key, base))
	}
	return p.token("inline", "serviceaccount."+w.ServiceAccount,
		fmt.Sprintf("{{ .Values.%s.serviceAccount.name | default %q }}", w.Key, w.ServiceAccount))
}

// clusterName is the token of the name of a cluster-scoped object: the
// release's full name in place of ClusterPrefix.
func (p *Parameterizer) clusterName(name string) (string, error) {
	suffix, ok := strings.CutPrefix(name, ClusterPrefix)
	if !ok {
		return "", fmt.Errorf("cluster-scoped name %s does not start with %s: the chart could not give each release its own", name, ClusterPrefix)
	}
	return p.token("inline", "cluster."+suffix, `{{ include "headwater.fullname" . }}-`+suffix), nil
}

// releaseNames puts the tokens of the names a release owns into o: its
// ServiceAccounts' names (and annotations), the cluster-scoped names, and
// the references to both.
func (p *Parameterizer) releaseNames(o Object) error {
	md, err := mapAt(o.Map, "metadata")
	if err != nil {
		return fmt.Errorf("%s: %w", o.Key(), err)
	}
	switch o.Kind {
	case "ServiceAccount":
		w, ok := workloadBySA(o.Name)
		if !ok {
			return fmt.Errorf("%s: no workload runs as it (hack/chartgen Workloads)", o.Key())
		}
		md["name"] = p.serviceAccountName(w)
		if err := p.addEntries(md, "annotations", w.Key+".serviceAccount.annotations",
			".Values."+w.Key+".serviceAccount.annotations"); err != nil {
			return fmt.Errorf("%s: %w", o.Key(), err)
		}
	case "ClusterRole", "ClusterRoleBinding":
		if md["name"], err = p.clusterName(o.Name); err != nil {
			return err
		}
	}
	if o.Kind != "ClusterRoleBinding" && o.Kind != "RoleBinding" {
		return nil
	}
	ref, err := mapAt(o.Map, "roleRef")
	if err != nil {
		return fmt.Errorf("%s: %w", o.Key(), err)
	}
	if ref["kind"] == "ClusterRole" {
		name, _ := ref["name"].(string)
		if ref["name"], err = p.clusterName(name); err != nil {
			return fmt.Errorf("%s: %w", o.Key(), err)
		}
	}
	subjects, _ := o.Map["subjects"].([]any)
	for _, s := range subjects {
		s, ok := s.(map[string]any)
		if !ok || s["kind"] != "ServiceAccount" {
			continue
		}
		name, _ := s["name"].(string)
		w, ok := workloadBySA(name)
		if !ok {
			return fmt.Errorf("%s: subject ServiceAccount %s: no workload runs as it", o.Key(), name)
		}
		s["name"] = p.serviceAccountName(w)
	}
	return nil
}

// ObjectCond is the condition on the values, beside the choices, under
// which the chart renders object kind/name ("" for always): a
// ServiceAccount with its serviceAccount.create, a CRD with crds.install.
func ObjectCond(kind, name string) string {
	switch kind {
	case "ServiceAccount":
		if w, ok := workloadBySA(name); ok {
			return ".Values." + w.Key + ".serviceAccount.create"
		}
	case "CustomResourceDefinition":
		return ".Values.crds.install"
	}
	return ""
}
