package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	"sigs.k8s.io/yaml"
)

// root is the repository's root, from this module's directory.
const root = "../.."

// chartDir is the committed chart the tests check.
var chartDir = filepath.Join(root, "charts", "headwater")

// object is one rendered resource, normalized for comparison.
type object map[string]any

func (o object) key() string {
	md, _ := o["metadata"].(map[string]any)
	return fmt.Sprintf("%v %v/%v", o["kind"], md["namespace"], md["name"])
}

// helmTemplate renders the chart as `helm template` does (the values
// checked against values.schema.json) as the release headwater in
// namespace ns.
func helmTemplate(t *testing.T, ns string, values map[string]any) (map[string]object, error) {
	t.Helper()
	return helmTemplateRelease(t, chartDir, "headwater", ns, values)
}

// helmTemplateRelease renders the chart at path (a directory or a
// package) as release in namespace ns.
func helmTemplateRelease(t *testing.T, path, release, ns string, values map[string]any) (map[string]object, error) {
	t.Helper()
	chrt, err := loader.Load(path)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	install := action.NewInstall(&action.Configuration{})
	install.DryRun = true
	install.DryRunOption = "true"
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = release
	install.Namespace = ns
	install.IncludeCRDs = true
	rel, err := install.Run(chrt, values)
	if err != nil {
		return nil, err
	}
	objs := map[string]object{}
	for _, doc := range releaseutil.SplitManifests(rel.Manifest) {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("helm template: %v\n%s", err, doc)
		}
		if len(o) == 0 {
			continue
		}
		// The labels Helm adds (and the CRDs' resource policy, below), and
		// nothing else, are left out.
		if md, ok := o["metadata"].(map[string]any); ok {
			if l, ok := md["labels"].(map[string]any); ok {
				for name := range HelmLabels {
					if _, ok := l[name]; !ok {
						t.Errorf("%s: no label %s", o.key(), name)
					}
					delete(l, name)
				}
				if len(l) == 0 {
					delete(md, "labels")
				}
			}
		}
		if o["kind"] == "CustomResourceDefinition" {
			md := o["metadata"].(map[string]any)
			a, _ := md["annotations"].(map[string]any)
			for name, v := range CRDAnnotations {
				if a[name] != v {
					t.Errorf("%s: annotation %s is %v, want %s", o.key(), name, a[name], v)
				}
				delete(a, name)
			}
			if a != nil && len(a) == 0 {
				delete(md, "annotations")
			}
		}
		if _, dup := objs[o.key()]; dup {
			t.Errorf("helm template renders %s twice", o.key())
		}
		objs[o.key()] = o
	}
	return objs, nil
}

// kustomizeBuild renders a kustomization: dir under deploy/ as shipped,
// or (kustomization != "") one of the test's own beside deploy/. The
// Namespace is left out: Helm's is the release's (--create-namespace).
func kustomizeBuild(t *testing.T, dir, kustomization string) map[string]object {
	t.Helper()
	r, err := NewRenderer(root)
	if err != nil {
		t.Fatal(err)
	}
	var objs []Object
	if kustomization != "" {
		objs, err = r.Render(kustomization)
	} else {
		objs, err = r.RenderDir("/" + dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]object{}
	for _, o := range objs {
		if o.Kind == "Namespace" {
			continue
		}
		// Through JSON, so numbers are float64 on both sides.
		b, err := json.Marshal(o.Map)
		if err != nil {
			t.Fatal(err)
		}
		var n object
		if err := json.Unmarshal(b, &n); err != nil {
			t.Fatal(err)
		}
		out[n.key()] = n
	}
	return out
}

// compare reports every object one side renders and the other does not,
// and every object the two render differently, with the lines that
// differ.
func compare(t *testing.T, helm, kustomize map[string]object) {
	t.Helper()
	var keys []string
	for k := range kustomize {
		keys = append(keys, k)
	}
	for k := range helm {
		if _, ok := kustomize[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		h, inHelm := helm[k]
		c, inKustomize := kustomize[k]
		switch {
		case !inHelm:
			t.Errorf("%s: rendered by kustomize, not by the chart", k)
		case !inKustomize:
			t.Errorf("%s: rendered by the chart, not by kustomize", k)
		case !reflect.DeepEqual(map[string]any(h), map[string]any(c)):
			hy, _ := yaml.Marshal(h)
			cy, _ := yaml.Marshal(c)
			t.Errorf("%s differs (- chart, + kustomize):\n%s", k, lineDiff(string(hy), string(cy)))
		}
	}
	if len(kustomize) == 0 {
		t.Error("kustomize renders nothing")
	}
}

// lineDiff lists the lines only a has (-) and only b has (+), along their
// longest common subsequence.
func lineDiff(a, b string) string {
	merged := Merge([]Variant{
		{Lines: strings.Split(a, "\n"), In: Set{true, false}},
		{Lines: strings.Split(b, "\n"), In: Set{false, true}},
	})
	var out []string
	for _, l := range merged {
		switch {
		case l.In[0] && l.In[1]:
		case l.In[0]:
			out = append(out, "- "+l.Text)
		default:
			out = append(out, "+ "+l.Text)
		}
	}
	return strings.Join(out, "\n")
}

// TestChartRendersTheKustomizations renders the chart with the values
// that make each choice of deploy/ and compares every object, whole, with
// what kustomize renders for it: deploy/, each overlay, and the optional
// components on top of production.
func TestChartRendersTheKustomizations(t *testing.T) {
	// Fresh maps each time: Helm merges the defaults into the values it
	// is given.
	s3 := func() map[string]any {
		return map[string]any{"type": "s3", "s3": map[string]any{"existingSecret": S3Secret}}
	}
	on := func() map[string]any { return map[string]any{"enabled": true} }
	for _, tc := range []struct {
		name, dir, kustomization string
		ns                       string
		values                   map[string]any
	}{
		{name: "default", dir: "deploy", values: map[string]any{}},
		{name: "single-node", dir: "deploy/overlays/single-node",
			values: map[string]any{"storage": map[string]any{"type": "directory", "directory": map[string]any{"accessMode": "ReadWriteOnce"}}}},
		{name: "rwx", dir: "deploy/overlays/rwx",
			values: map[string]any{"storage": map[string]any{"type": "directory", "directory": map[string]any{"accessMode": "ReadWriteMany"}}}},
		{name: "s3", dir: "deploy/overlays/s3", values: map[string]any{"storage": s3()}},
		{name: "production", dir: "deploy/overlays/production",
			values: map[string]any{"storage": s3(), "nats": map[string]any{"cluster": on(), "tls": on()}}},
		{name: "flux-system", dir: "deploy/overlays/flux-system", ns: "flux-system",
			values: map[string]any{"fluxDropIn": on()}},
		{name: "rwx+external NATS+receivers+dispatcher",
			kustomization: "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../deploy/overlays/rwx\n" +
				"components:\n  - ../deploy/components/receivers\n  - ../deploy/components/dispatcher\n  - ../deploy/components/nats-external\n",
			values: map[string]any{"storage": map[string]any{"type": "directory", "directory": map[string]any{"accessMode": "ReadWriteMany"}},
				"nats": map[string]any{"external": on()}, "receivers": on(), "dispatcher": on()}},
		{name: "shards", kustomization: "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../deploy\n" +
			"components:\n  - ../deploy/components/shards\n",
			values: map[string]any{"shards": []any{"shard1", "shard2"}}},
		{name: "flux-system+shards", ns: "flux-system",
			kustomization: "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: flux-system\nresources:\n  - ../deploy/crds\n  - ../deploy/base\n" +
				"components:\n  - ../deploy/components/minio\n  - ../deploy/components/shards\n  - ../deploy/components/flux-dropin\n",
			values: map[string]any{"fluxDropIn": on(), "shards": []any{"shard1", "shard2"}}},
		{name: "production+receivers+dispatcher+monitoring",
			kustomization: "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../deploy/overlays/production\n" +
				"components:\n  - ../deploy/components/receivers\n  - ../deploy/components/dispatcher\n  - ../deploy/components/monitoring\n",
			values: map[string]any{"storage": s3(), "nats": map[string]any{"cluster": on(), "tls": on()},
				"receivers": on(), "dispatcher": on(), "monitoring": on()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.ns
			if ns == "" {
				ns = Namespace
			}
			lint(t, ns, tc.values)
			helm, err := helmTemplate(t, ns, tc.values)
			if err != nil {
				t.Fatalf("helm template: %v", err)
			}
			compare(t, helm, kustomizeBuild(t, tc.dir, tc.kustomization))
		})
	}
}

// lint runs `helm lint` on the chart with values; anything above INFO
// fails.
func lint(t *testing.T, ns string, values map[string]any) {
	t.Helper()
	l := action.NewLint()
	l.Namespace = ns
	res := l.Run([]string{chartDir}, values)
	for _, err := range res.Errors {
		t.Errorf("helm lint: %v", err)
	}
	for _, m := range res.Messages {
		if m.Severity > support.InfoSev {
			t.Errorf("helm lint: %s", m)
		}
	}
}

// TestChartParameters sets every parameter that is not a choice of
// kustomization (namespace, images, replicas, resources, the S3 Secret,
// the volume's size) and checks the objects carry them.
func TestChartParameters(t *testing.T) {
	// Both requests and limits, whole: Helm merges a default's keys into
	// a map that leaves them out.
	res := func() map[string]any {
		return map[string]any{"requests": map[string]any{"cpu": "1", "memory": "1Gi"}, "limits": map[string]any{"cpu": "2", "memory": "2Gi"}}
	}
	values := map[string]any{
		"image":   map[string]any{"repository": "registry.example.com/hw", "tag": "v9.9.9"},
		"fetcher": map[string]any{"replicas": 7, "resources": res()},
		"nats":    map[string]any{"image": "registry.example.com/nats:2", "resources": res()},
		"storage": map[string]any{"type": "directory", "directory": map[string]any{"accessMode": "ReadWriteMany", "size": "123Gi"}},
	}
	objs, err := helmTemplate(t, "gitops", values)
	if err != nil {
		t.Fatal(err)
	}
	for k, o := range objs {
		md := o["metadata"].(map[string]any)
		if ns, ok := md["namespace"]; ok && ns != "gitops" {
			t.Errorf("%s is in namespace %v", k, ns)
		}
		b, _ := json.Marshal(o)
		if strings.Contains(string(b), Namespace) {
			t.Errorf("%s names %s", k, Namespace)
		}
	}
	get := func(key string, path ...string) any {
		var v any = map[string]any(objs[key])
		for _, p := range path {
			switch x := v.(type) {
			case map[string]any:
				v = x[p]
			case []any:
				var i int
				fmt.Sscan(p, &i)
				v = x[i]
			}
		}
		return v
	}
	fetcher := "Deployment gitops/fetcher"
	if got := get(fetcher, "spec", "replicas"); got != float64(7) {
		t.Errorf("fetcher replicas %v, want 7", got)
	}
	if got := get(fetcher, "spec", "template", "spec", "containers", "0", "resources"); !reflect.DeepEqual(got, res()) {
		t.Errorf("fetcher resources %v, want %v", got, res())
	}
	if got := get(fetcher, "spec", "template", "spec", "containers", "0", "image"); got != "registry.example.com/hw/headwater:v9.9.9" {
		t.Errorf("fetcher image %v", got)
	}
	if got := get("StatefulSet gitops/nats", "spec", "template", "spec", "containers", "0", "image"); got != "registry.example.com/nats:2" {
		t.Errorf("nats image %v", got)
	}
	if got := get("PersistentVolumeClaim gitops/"+ArtifactsClaim, "spec", "resources", "requests", "storage"); got != "123Gi" {
		t.Errorf("claim size %v, want 123Gi", got)
	}
	if got := get("Deployment gitops/packager", "spec", "replicas"); got != float64(2) {
		t.Errorf("packager replicas %v, want the default, 2", got)
	}

	objs, err = helmTemplate(t, "gitops", map[string]any{"storage": map[string]any{"type": "s3", "s3": map[string]any{"existingSecret": "my-s3"}}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(objs["Deployment gitops/artifact-server"])
	if strings.Contains(string(b), S3Secret) || !strings.Contains(string(b), `"name":"my-s3"`) {
		t.Errorf("artifact-server does not read the S3 settings from my-s3:\n%s", b)
	}
	if strings.Contains(string(b), "OTEL_") {
		t.Errorf("artifact-server traces with tracing off:\n%s", b)
	}

	// tracing.enabled points every service at tracing.endpoint.
	const collector = "http://collector.example.com:4318"
	objs, err = helmTemplate(t, "gitops", map[string]any{"tracing": map[string]any{"enabled": true, "endpoint": collector}})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"watcher", "fetcher", "packager", "artifact-server"} {
		b, _ := json.Marshal(objs["Deployment gitops/"+d])
		if !strings.Contains(string(b), `{"name":"OTEL_EXPORTER_OTLP_ENDPOINT","value":"`+collector+`"}`) {
			t.Errorf("%s does not export traces to %s:\n%s", d, collector, b)
		}
	}

	// egress.allowedDestinations is every tenant-URL client's
	// -allowed-destinations, and the default allows nothing.
	b, _ = json.Marshal(objs["Deployment gitops/fetcher"])
	if !strings.Contains(string(b), `{"name":"`+AllowedDestinationsEnv+`","value":""}`) {
		t.Errorf("fetcher allows destinations by default:\n%s", b)
	}
	objs, err = helmTemplate(t, "gitops", map[string]any{"dispatcher": map[string]any{"enabled": true},
		"egress": map[string]any{"allowedDestinations": []any{"10.96.12.34:3000", "192.168.0.0/16"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"fetcher", "dispatcher"} {
		b, _ := json.Marshal(objs["Deployment gitops/"+d])
		if !strings.Contains(string(b), `{"name":"`+AllowedDestinationsEnv+`","value":"10.96.12.34:3000,192.168.0.0/16"}`) {
			t.Errorf("%s does not allow egress.allowedDestinations:\n%s", d, b)
		}
	}
}

// TestChartRejectsBadValues checks that a wrong type, an unknown key, S3
// storage without its Secret and shards that cannot be fail at render,
// saying what is wrong.
func TestChartRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   []string
	}{
		{"wrong type", map[string]any{"fetcher": map[string]any{"replicas": "three"}},
			[]string{"/fetcher/replicas", "integer"}},
		{"unknown key", map[string]any{"fetchers": map[string]any{"replicas": 3}},
			[]string{"fetchers", "not allowed"}},
		{"unknown nested key", map[string]any{"storage": map[string]any{"s3": map[string]any{"secret": "x"}}},
			[]string{"/storage/s3", "secret", "not allowed"}},
		{"storage type not offered", map[string]any{"storage": map[string]any{"type": "gcs"}},
			[]string{"/storage/type", "minio", "s3", "directory"}},
		{"s3 without its Secret", map[string]any{"storage": map[string]any{"type": "s3"}},
			[]string{"storage.s3.existingSecret", "endpoint, bucket, accesskey and secretkey"}},
		{"shards with receivers", map[string]any{"shards": []any{"shard1"}, "receivers": map[string]any{"enabled": true}},
			[]string{"shards and receivers.enabled are both set", "refuses"}},
		{"a shard name that is no DNS label", map[string]any{"shards": []any{"Shard_1"}},
			[]string{"/shards/0", "does not match pattern"}},
		{"a shard twice", map[string]any{"shards": []any{"shard1", "shard1"}},
			[]string{"/shards", "are equal"}},
		{"external NATS and a bundled cluster", map[string]any{"nats": map[string]any{
			"external": map[string]any{"enabled": true}, "cluster": map[string]any{"enabled": true}}},
			[]string{"nats.external.enabled and nats.cluster.enabled are both true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helmTemplate(t, Namespace, tc.values)
			if err == nil {
				t.Fatal("rendered; want an error")
			}
			t.Logf("helm template: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestChartShards renders three shards (components/shards has two) and
// checks each is the watcher of its own sources, under its own names, and
// that the main watcher takes the rest and knows the fleet.
func TestChartShards(t *testing.T) {
	values := map[string]any{"shards": []any{"a", "team-b", "c"},
		"watcher": map[string]any{"replicas": 3, "serviceAccount": map[string]any{"name": "hw"}}}
	objs, err := helmTemplate(t, "gitops", values)
	if err != nil {
		t.Fatal(err)
	}
	env := func(key string) map[string]any {
		o, ok := objs[key]
		if !ok {
			t.Fatalf("no %s", key)
		}
		c := o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
		out := map[string]any{}
		for _, e := range c["env"].([]any) {
			e := e.(map[string]any)
			out[e["name"].(string)] = e["value"]
		}
		return out
	}
	main := env("Deployment gitops/watcher")
	if got := main["HEADWATER_WATCH_LABEL_SELECTOR"]; got != "!sharding.fluxcd.io/key" {
		t.Errorf("main watcher's selector %v", got)
	}
	if got := main["HEADWATER_FLEET_SELECTORS"]; got != "!sharding.fluxcd.io/key;sharding.fluxcd.io/key in (a,team-b,c)" {
		t.Errorf("main watcher's fleet %v", got)
	}
	for _, shard := range []string{"a", "team-b", "c"} {
		d := "Deployment gitops/watcher-" + shard
		e := env(d)
		if got := e["HEADWATER_WATCH_LABEL_SELECTOR"]; got != "sharding.fluxcd.io/key in ("+shard+")" {
			t.Errorf("%s: selector %v", d, got)
		}
		if _, ok := e["HEADWATER_FLEET_SELECTORS"]; ok {
			t.Errorf("%s reports the fleet: only the main watcher does", d)
		}
		spec := objs[d]["spec"].(map[string]any)
		if spec["replicas"] != float64(3) {
			t.Errorf("%s: replicas %v, want the watcher's 3", d, spec["replicas"])
		}
		if got := spec["selector"].(map[string]any)["matchLabels"].(map[string]any)["app.kubernetes.io/name"]; got != "watcher-"+shard {
			t.Errorf("%s selects pods %v", d, got)
		}
		if got := spec["template"].(map[string]any)["spec"].(map[string]any)["serviceAccountName"]; got != "hw-"+shard {
			t.Errorf("%s runs as %v, want hw-%s", d, got, shard)
		}
		for _, key := range []string{"ServiceAccount gitops/hw-" + shard, "PodDisruptionBudget gitops/watcher-" + shard,
			"ClusterRoleBinding <nil>/headwater-watcher-" + shard, "RoleBinding gitops/headwater-watcher-leader-election-" + shard} {
			if _, ok := objs[key]; !ok {
				t.Errorf("no %s", key)
			}
		}
		subjects := objs["ClusterRoleBinding <nil>/headwater-watcher-"+shard]["subjects"].([]any)
		if got := subjects[0].(map[string]any)["name"]; got != "hw-"+shard {
			t.Errorf("ClusterRoleBinding of %s binds %v", shard, got)
		}
	}
	for k := range objs {
		if strings.Contains(k, "shard1") || strings.Contains(k, "shard2") {
			t.Errorf("%s: components/shards' own shard rendered", k)
		}
	}

	// No shards: no shard object, and the main watcher watches everything.
	objs, err = helmTemplate(t, "gitops", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := env("Deployment gitops/watcher")["HEADWATER_WATCH_LABEL_SELECTOR"]; ok {
		t.Error("without shards the watcher has a label selector")
	}
	for k := range objs {
		if strings.Contains(k, "watcher-") && !strings.Contains(k, "leader-election") && !strings.Contains(k, "receivers") {
			t.Errorf("without shards the chart renders %s", k)
		}
	}
}

// TestChartWorkloadIdentity: workloadIdentity.enabled turns the fetcher's
// ObjectLevelWorkloadIdentity gate on and grants it create on
// serviceaccounts/token; by default neither (components/workload-identity).
func TestChartWorkloadIdentity(t *testing.T) {
	const role = "ClusterRole <nil>/headwater-fetcher-workload-identity"
	objs, err := helmTemplate(t, "gitops", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := objs[role]; ok {
		t.Errorf("%s rendered by default", role)
	}
	if b, _ := json.Marshal(objs["Deployment gitops/fetcher"]); strings.Contains(string(b), "ObjectLevelWorkloadIdentity") {
		t.Errorf("fetcher has the gate on by default:\n%s", b)
	}
	objs, err = helmTemplate(t, "gitops", map[string]any{"workloadIdentity": map[string]any{"enabled": true}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(objs[role])
	if !strings.Contains(string(b), `"resources":["serviceaccounts/token"]`) || !strings.Contains(string(b), `"verbs":["create"]`) {
		t.Errorf("%s:\n%s", role, b)
	}
	b, _ = json.Marshal(objs["ClusterRoleBinding <nil>/headwater-fetcher-workload-identity"])
	if !strings.Contains(string(b), `"name":"fetcher","namespace":"gitops"`) {
		t.Errorf("the token role is not bound to the fetcher of the release's namespace:\n%s", b)
	}
	b, _ = json.Marshal(objs["Deployment gitops/fetcher"])
	if !strings.Contains(string(b), `{"name":"HEADWATER_FEATURE_GATES","value":"ObjectLevelWorkloadIdentity=true"}`) {
		t.Errorf("fetcher without the gate:\n%s", b)
	}
}
