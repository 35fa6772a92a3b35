package main

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// dig returns the value at path in v (map keys, or list indices).
func dig(v any, path ...string) any {
	for _, p := range path {
		switch x := v.(type) {
		case map[string]any:
			v = x[p]
		case object:
			v = x[p]
		case []any:
			var i int
			if _, err := fmt.Sscan(p, &i); err != nil || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

// jsonish turns Go values into what YAML decodes them to (numbers
// float64), for comparison with rendered objects.
func jsonish(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := map[string]any{}
		for k, e := range x {
			m[k] = jsonish(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = jsonish(e)
		}
		return l
	case int:
		return float64(x)
	}
	return v
}

// TestChartPodValues sets every pod setting, globally and for one
// workload, and checks the pods carry them: replaced where the chart
// replaces deploy/'s, added to deploy/'s lists and maps otherwise, and
// the other workloads keep deploy/'s (or take the global defaults).
func TestChartPodValues(t *testing.T) {
	tolerations := []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "gitops", "effect": "NoSchedule"}}
	affinity := map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
		"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{
			"key": "kubernetes.io/arch", "operator": "In", "values": []any{"arm64"}}}}}}}}
	spread := []any{map[string]any{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
		"labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "fetcher"}}}}
	podSC := map[string]any{"runAsNonRoot": true, "runAsUser": 1234, "fsGroup": 1234}
	sc := map[string]any{"readOnlyRootFilesystem": true, "runAsNonRoot": true}
	env := []any{map[string]any{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}}
	values := map[string]any{
		"imagePullSecrets":  []any{map[string]any{"name": "my-registry"}},
		"nodeSelector":      map[string]any{"pool": "system"},
		"priorityClassName": "system-cluster-critical",
		"podLabels":         map[string]any{"team": "platform"},
		"podAnnotations":    map[string]any{"example.com/global": "yes"},
		"fetcher": map[string]any{
			"nodeSelector":              map[string]any{"pool": "fetchers"},
			"tolerations":               tolerations,
			"affinity":                  affinity,
			"topologySpreadConstraints": spread,
			"priorityClassName":         "fetchers",
			"podLabels":                 map[string]any{"tier": "fetch"},
			"podAnnotations":            map[string]any{"example.com/fetcher": "yes"},
			"podSecurityContext":        podSC,
			"securityContext":           sc,
			"extraArgs":                 []any{"-log-level=debug", "-concurrency=8"},
			"extraEnv":                  env,
			"serviceAccount": map[string]any{
				"name":        "gitops-fetcher",
				"annotations": map[string]any{"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/fetcher"},
			},
		},
		"nats": map[string]any{"extraArgs": []any{"--max_payload=8MB"}, "tolerations": tolerations},
	}
	objs, err := helmTemplate(t, Namespace, values)
	if err != nil {
		t.Fatal(err)
	}
	defaults, err := helmTemplate(t, Namespace, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	key := func(kind, name string) string { return kind + " " + Namespace + "/" + name }
	fetcher := objs[key("Deployment", "fetcher")]
	pod := dig(fetcher, "spec", "template", "spec")
	c := dig(pod, "containers", "0")
	for _, tc := range []struct {
		what string
		got  any
		want any
	}{
		{"nodeSelector", dig(pod, "nodeSelector"), values["fetcher"].(map[string]any)["nodeSelector"]},
		{"tolerations", dig(pod, "tolerations"), tolerations},
		{"affinity", dig(pod, "affinity"), affinity},
		{"topologySpreadConstraints", dig(pod, "topologySpreadConstraints"), spread},
		{"priorityClassName", dig(pod, "priorityClassName"), "fetchers"},
		{"pod securityContext", dig(pod, "securityContext"), podSC},
		{"container securityContext", dig(c, "securityContext"), sc},
		{"imagePullSecrets", dig(pod, "imagePullSecrets"), values["imagePullSecrets"]},
		{"serviceAccountName", dig(pod, "serviceAccountName"), "gitops-fetcher"},
		{"label tier", dig(fetcher, "spec", "template", "metadata", "labels", "tier"), "fetch"},
		{"global label team", dig(fetcher, "spec", "template", "metadata", "labels", "team"), "platform"},
		{"deploy/'s label", dig(fetcher, "spec", "template", "metadata", "labels", "app.kubernetes.io/name"), "fetcher"},
		{"annotation", dig(fetcher, "spec", "template", "metadata", "annotations", "example.com/fetcher"), "yes"},
		{"global annotation", dig(fetcher, "spec", "template", "metadata", "annotations", "example.com/global"), "yes"},
		{"deploy/'s annotation", dig(fetcher, "spec", "template", "metadata", "annotations", "prometheus.io/port"), "9101"},
		{"args", dig(c, "args"), []any{"-target=fetcher", "-log-level=debug", "-concurrency=8"}},
	} {
		if !reflect.DeepEqual(jsonish(tc.got), jsonish(tc.want)) {
			t.Errorf("fetcher %s: got %v, want %v", tc.what, tc.got, tc.want)
		}
	}
	envs, _ := dig(c, "env").([]any)
	defEnvs, _ := dig(defaults[key("Deployment", "fetcher")], "spec", "template", "spec", "containers", "0", "env").([]any)
	if want := append(slices.Clone(defEnvs), env...); !reflect.DeepEqual(envs, want) {
		t.Errorf("fetcher env: got %v, want deploy/'s and then %v", envs, env)
	}

	// The ServiceAccount, renamed and annotated, and every binding's
	// subject with it.
	if _, ok := objs[key("ServiceAccount", "fetcher")]; ok {
		t.Error("the ServiceAccount fetcher is rendered beside gitops-fetcher")
	}
	sa := objs[key("ServiceAccount", "gitops-fetcher")]
	if got := dig(sa, "metadata", "annotations", "eks.amazonaws.com/role-arn"); got != "arn:aws:iam::111122223333:role/fetcher" {
		t.Errorf("ServiceAccount gitops-fetcher annotation: %v", got)
	}
	subject := dig(objs["ClusterRoleBinding <nil>/headwater-fetcher"], "subjects", "0", "name")
	if subject != "gitops-fetcher" {
		t.Errorf("ClusterRoleBinding headwater-fetcher binds %v, want gitops-fetcher", subject)
	}

	// The others: the global defaults, deploy/'s affinity and contexts.
	packager := objs[key("Deployment", "packager")]
	ppod := dig(packager, "spec", "template", "spec")
	dpod := dig(defaults[key("Deployment", "packager")], "spec", "template", "spec")
	for _, tc := range []struct {
		what string
		got  any
		want any
	}{
		{"nodeSelector", dig(ppod, "nodeSelector"), map[string]any{"pool": "system"}},
		{"priorityClassName", dig(ppod, "priorityClassName"), "system-cluster-critical"},
		{"tolerations", dig(ppod, "tolerations"), nil},
		{"affinity", dig(ppod, "affinity"), dig(dpod, "affinity")},
		{"securityContext", dig(ppod, "securityContext"), dig(dpod, "securityContext")},
		{"global label", dig(packager, "spec", "template", "metadata", "labels", "team"), "platform"},
		{"serviceAccountName", dig(ppod, "serviceAccountName"), "packager"},
	} {
		if !reflect.DeepEqual(jsonish(tc.got), jsonish(tc.want)) {
			t.Errorf("packager %s: got %v, want %v", tc.what, tc.got, tc.want)
		}
	}
	if dig(ppod, "affinity") == nil {
		t.Error("packager has no affinity by default")
	}
	nats := dig(objs[key("StatefulSet", "nats")], "spec", "template", "spec")
	if got := dig(nats, "containers", "0", "args"); !slices.Contains(got.([]any), "--max_payload=8MB") {
		t.Errorf("nats args %v lack --max_payload=8MB", got)
	}
	if got := dig(nats, "tolerations"); !reflect.DeepEqual(got, jsonish(tolerations)) {
		t.Errorf("nats tolerations %v", got)
	}
	setup := dig(objs[key("Job", "headwater-setup")], "spec", "template", "spec")
	if got := dig(setup, "imagePullSecrets"); !reflect.DeepEqual(got, values["imagePullSecrets"]) {
		t.Errorf("setup Job imagePullSecrets %v", got)
	}
}

// TestChartServiceAccountCreate checks that serviceAccount.create false
// leaves out the ServiceAccount and still binds its name.
func TestChartServiceAccountCreate(t *testing.T) {
	objs, err := helmTemplate(t, Namespace, map[string]any{
		"watcher": map[string]any{"serviceAccount": map[string]any{"create": false, "name": "existing"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for k := range objs {
		if strings.HasPrefix(k, "ServiceAccount ") && strings.HasSuffix(k, "/existing") || k == "ServiceAccount "+Namespace+"/watcher" {
			t.Errorf("%s rendered with serviceAccount.create false", k)
		}
	}
	if got := dig(objs["RoleBinding "+Namespace+"/headwater-watcher-leader-election"], "subjects", "0", "name"); got != "existing" {
		t.Errorf("leader election RoleBinding binds %v, want existing", got)
	}
	if got := dig(objs["Deployment "+Namespace+"/watcher"], "spec", "template", "spec", "serviceAccountName"); got != "existing" {
		t.Errorf("watcher runs as %v, want existing", got)
	}
}

// TestChartReleaseNames installs two releases into two namespaces and
// checks that they share no cluster-scoped object but the CRDs (left to
// the first with crds.install false on the second), that every
// ClusterRoleBinding refers to its release's ClusterRole, and that the
// Flux drop-in keeps Flux's Service name.
func TestChartReleaseNames(t *testing.T) {
	clusterScoped := func(objs map[string]object) map[string]object {
		out := map[string]object{}
		for k, o := range objs {
			if dig(o, "metadata", "namespace") == nil {
				out[k] = o
			}
		}
		return out
	}
	a, err := helmTemplateRelease(t, chartDir, "gitops", "team-a", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := helmTemplateRelease(t, chartDir, "other", "team-b", map[string]any{
		"fullnameOverride": "hw-b", "crds": map[string]any{"install": false}, "fluxDropIn": map[string]any{"enabled": true},
	})
	if err != nil {
		t.Fatal(err)
	}
	ca, cb := clusterScoped(a), clusterScoped(b)
	if len(cb) == 0 {
		t.Fatal("the second release renders no cluster-scoped object")
	}
	for k := range cb {
		if _, ok := ca[k]; ok {
			t.Errorf("both releases render %s", k)
		}
		if strings.HasPrefix(k, "CustomResourceDefinition ") {
			t.Errorf("crds.install false renders %s", k)
		}
	}
	for _, tc := range []struct {
		objs   map[string]object
		prefix string
	}{{ca, "gitops-headwater-"}, {cb, "hw-b-"}} {
		for k, o := range tc.objs {
			kind := dig(o, "kind")
			if kind != "ClusterRole" && kind != "ClusterRoleBinding" {
				continue
			}
			if name := dig(o, "metadata", "name").(string); !strings.HasPrefix(name, tc.prefix) {
				t.Errorf("%s is not named %s...", k, tc.prefix)
			}
			if kind == "ClusterRoleBinding" {
				ref := dig(o, "roleRef", "name")
				if _, ok := tc.objs["ClusterRole <nil>/"+ref.(string)]; !ok {
					t.Errorf("%s refers to ClusterRole %v, which the release does not render", k, ref)
				}
			}
		}
	}
	if _, ok := b["Service team-b/source-controller"]; !ok {
		t.Error("the drop-in release renders no Service source-controller")
	}
}

// TestChartRejectsBadPodValues checks that a wrong type of a pod setting
// fails at render, naming the value.
func TestChartRejectsBadPodValues(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   []string
	}{
		{"extraArgs a string", map[string]any{"fetcher": map[string]any{"extraArgs": "-log-level=debug"}},
			[]string{"/fetcher/extraArgs", "array"}},
		{"tolerations a map", map[string]any{"tolerations": map[string]any{"key": "x"}},
			[]string{"/tolerations", "array"}},
		{"nodeSelector a list", map[string]any{"nats": map[string]any{"nodeSelector": []any{"a"}}},
			[]string{"/nats/nodeSelector", "object"}},
		{"imagePullSecrets strings", map[string]any{"imagePullSecrets": []any{"my-registry"}},
			[]string{"/imagePullSecrets/0", "object"}},
		{"serviceAccount unknown key", map[string]any{"fetcher": map[string]any{"serviceAccount": map[string]any{"role": "x"}}},
			[]string{"/fetcher/serviceAccount", "role", "not allowed"}},
		{"extraEnv without a name", map[string]any{"watcher": map[string]any{"extraEnv": []any{map[string]any{"value": "x"}}}},
			[]string{"/watcher/extraEnv/0", "name"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helmTemplate(t, Namespace, tc.values)
			if err == nil {
				t.Fatal("rendered; want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
