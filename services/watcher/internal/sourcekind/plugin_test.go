package sourcekind

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
)

var httpSource = schema.GroupVersionKind{Group: "source.headwater.dev", Version: "v1alpha1", Kind: "HTTPSource"}

func TestParseRegistrations(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []Registration
		wantErr string
	}{
		{in: "", want: nil},
		{in: "source.headwater.dev/v1alpha1/HTTPSource", want: []Registration{{GVK: httpSource, IntervalField: "interval"}}},
		{in: " source.headwater.dev/v1alpha1/HTTPSource:every , example.com/v1/Thing",
			want: []Registration{{GVK: httpSource, IntervalField: "every"},
				{GVK: schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Thing"}, IntervalField: "interval"}}},
		{in: "HTTPSource", wantErr: "want <group>/<version>/<Kind>"},
		{in: "a/b/", wantErr: "want <group>/<version>/<Kind>"},
		{in: "source.toolkit.fluxcd.io/v1/GitRepository", wantErr: "built-in kind"},
		{in: "a.io/v1/Thing,b.io/v1/thing", wantErr: "registered twice"},
	} {
		got, err := ParseRegistrations(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseRegistrations(%q) = %v, want an error with %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("ParseRegistrations(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("ParseRegistrations(%q)[%d] = %v, want %v", tc.in, i, got[i], tc.want[i])
			}
		}
	}
	if s := (Registration{GVK: httpSource, IntervalField: "every"}).String(); s != "source.headwater.dev/v1alpha1/HTTPSource:every" {
		t.Errorf("String() = %q", s)
	}
}

func TestPluginKind(t *testing.T) {
	reg := Registration{GVK: httpSource, IntervalField: "interval"}
	kind := Plugin(reg)
	set := NewSet([]Registration{reg})
	if k, ok := set.ByName("HTTPSource"); !ok || k.Plugin == nil {
		t.Fatalf("the set does not find the plug-in kind")
	}
	if _, ok := set.ByName("GitRepository"); !ok {
		t.Fatalf("the set lost the built-in kinds")
	}
	if _, ok := Set(nil).ByName("HTTPSource"); ok {
		t.Fatalf("a nil set holds a plug-in kind")
	}

	obj := kind.New().(*PluginObject)
	if obj.GroupVersionKind() != httpSource {
		t.Fatalf("New() kind %v", obj.GroupVersionKind())
	}
	for _, tc := range []struct {
		spec     string
		interval time.Duration
		suspend  bool
	}{
		{`{"url":"http://x","interval":"1m30s","suspend":true}`, 90 * time.Second, true},
		{`{"url":"http://x"}`, DefaultPluginInterval, false},
		{`{"interval":"never"}`, DefaultPluginInterval, false},
		{`{"interval":"-1m"}`, DefaultPluginInterval, false},
		{``, DefaultPluginInterval, false},
	} {
		obj.Spec = json.RawMessage(tc.spec)
		if got := obj.GetRequeueAfter(); got != tc.interval {
			t.Errorf("spec %s: interval %v, want %v", tc.spec, got, tc.interval)
		}
		if got := kind.Suspended(obj); got != tc.suspend {
			t.Errorf("spec %s: suspended %t, want %t", tc.spec, got, tc.suspend)
		}
	}
	other := Plugin(Registration{GVK: httpSource, IntervalField: "every"}).New().(*PluginObject)
	other.Spec = json.RawMessage(`{"every":"2m","interval":"1m"}`)
	if got := other.GetRequeueAfter(); got != 2*time.Minute {
		t.Errorf("interval field every: %v", got)
	}

	obj.Spec = json.RawMessage(`{"url":"http://example.com/a.tar.gz","interval":"1m"}`)
	obj.Generation = 2
	var req events.FetchRequested
	force, err := kind.Request(context.Background(), nil, obj, &req)
	if err != nil || force {
		t.Fatalf("Request without an artifact: force %t, %v", force, err)
	}
	if req.Plugin == nil || req.Plugin.APIVersion != "source.headwater.dev/v1alpha1" || req.Plugin.Kind != "HTTPSource" ||
		string(req.Plugin.Spec) != string(obj.Spec) {
		t.Fatalf("Request carries %+v", req.Plugin)
	}
	if req.Spec() == nil {
		t.Fatalf("FetchRequested.Spec() is nil for a plug-in job")
	}
	obj.Status.Artifact = &meta.Artifact{Revision: "sha256:1"}
	obj.Status.ObservedGeneration = 1
	if force, _ := kind.Request(context.Background(), nil, obj, &req); !force {
		t.Errorf("a new generation with an artifact does not force a rebuild")
	}
	obj.Status.ObservedGeneration = 2
	if force, _ := kind.Request(context.Background(), nil, obj, &req); force {
		t.Errorf("an observed generation forces a rebuild")
	}

	st := kind.Status(obj)
	*st.Artifact = &meta.Artifact{Revision: "sha256:2"}
	*st.ObservedGeneration = 3
	*st.LastHandledReconcileAt = "now"
	if obj.GetArtifact().Revision != "sha256:2" || obj.Status.ObservedGeneration != 3 || obj.Status.LastHandledReconcileAt != "now" {
		t.Errorf("Status does not point into the object: %+v", obj.Status)
	}
	obj.SetConditions([]metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Succeeded"}})
	cp := obj.DeepCopyObject().(*PluginObject)
	if !equality.Semantic.DeepEqual(cp, obj) {
		t.Fatalf("DeepCopyObject differs")
	}
	cp.Status.Conditions[0].Reason = "Changed"
	cp.Status.Artifact.Revision = "changed"
	cp.Spec[0] = ' '
	if obj.Status.Conditions[0].Reason != "Succeeded" || obj.Status.Artifact.Revision != "sha256:2" || obj.Spec[0] != '{' {
		t.Errorf("DeepCopyObject shares memory with the original")
	}
}

// TestPluginObjectLoadAndPatch: a PluginObject is read from its
// unstructured form, and a status patch computed from it holds what
// changed only, so the kind's own status fields are left alone.
func TestPluginObjectLoadAndPatch(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "source.headwater.dev/v1alpha1", "kind": "HTTPSource",
		"metadata": map[string]any{"name": "n", "namespace": "ns", "generation": int64(4), "resourceVersion": "7"},
		"spec":     map[string]any{"url": "http://example.com/f", "interval": "5m"},
		"status": map[string]any{
			"observedGeneration": int64(3), "kindOwnField": "kept",
			"artifact":   map[string]any{"path": "httpsource/ns/n/a.tar.gz", "revision": "etag:1", "digest": "sha256:ab", "url": "http://s/a", "lastUpdateTime": "2026-01-01T00:00:00Z"},
			"conditions": []any{map[string]any{"type": "Ready", "status": "True", "reason": "Succeeded", "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}},
		},
	}}
	p := NewPluginObject(Registration{GVK: httpSource, IntervalField: "interval"})
	if err := p.load(u); err != nil {
		t.Fatal(err)
	}
	if p.Name != "n" || p.Generation != 4 || p.Status.ObservedGeneration != 3 || p.GetArtifact().Revision != "etag:1" ||
		len(p.GetConditions()) != 1 || p.GetRequeueAfter() != 5*time.Minute || p.GroupVersionKind() != httpSource {
		t.Fatalf("loaded %+v", p)
	}
	before := p.DeepCopyObject().(*PluginObject)
	p.Status.ObservedGeneration = 4
	target, patch, err := pluginPatch(p, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := patch.Data(target)
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	want := `{"metadata":{"resourceVersion":"7"},"status":{"observedGeneration":4}}`
	if w, _ := json.Marshal(got); string(w) != want {
		t.Errorf("patch %s, want %s", w, want)
	}
	if target.GroupVersionKind() != httpSource || target.GetName() != "n" || target.GetNamespace() != "ns" {
		t.Errorf("patch target %v %s/%s", target.GroupVersionKind(), target.GetNamespace(), target.GetName())
	}
}

// TestBuiltinKindsOnTheBus: the built-in fetchers' consumer takes the jobs
// of exactly the kinds the watcher has built in, so every other kind's
// jobs are left to its plug-in fetcher.
func TestBuiltinKindsOnTheBus(t *testing.T) {
	var names []string
	for _, k := range Kinds() {
		names = append(names, k.Name)
	}
	if !slices.Equal(names, events.BuiltinKinds) {
		t.Errorf("watcher kinds %v, events.BuiltinKinds %v", names, events.BuiltinKinds)
	}
}
