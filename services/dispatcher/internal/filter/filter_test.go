package filter

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/events"
)

func TestSubjects(t *testing.T) {
	many := make([]string, 70)
	for i := range many {
		many[i] = string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	tests := []struct {
		name    string
		sources v1alpha1.SourceSelector
		want    []string
	}{
		{"everything", v1alpha1.SourceSelector{}, []string{"headwater.events.*.*.*"}},
		{"one kind", v1alpha1.SourceSelector{Kinds: []string{"GitRepository"}}, []string{"headwater.events.gitrepository.*.*"}},
		{"kinds by namespaces", v1alpha1.SourceSelector{Kinds: []string{"GitRepository", "Bucket"}, Namespaces: []string{"a", "b"}},
			[]string{"headwater.events.bucket.a.*", "headwater.events.bucket.b.*", "headwater.events.gitrepository.a.*", "headwater.events.gitrepository.b.*"}},
		{"dotted name", v1alpha1.SourceSelector{Names: []string{"podinfo.v2"}}, []string{"headwater.events.*.*.podinfo_v2"}},
		{"labels need no subject", v1alpha1.SourceSelector{LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}},
			[]string{"headwater.events.*.*.*"}},
		{"too many combinations", v1alpha1.SourceSelector{Namespaces: many}, []string{"headwater.events.>"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := New(v1alpha1.SubscriptionSpec{Sources: tc.sources})
			if err != nil {
				t.Fatal(err)
			}
			if got := f.Subjects(); !slices.Equal(got, tc.want) {
				t.Errorf("Subjects = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestMatch(t *testing.T) {
	podinfo := events.ObjectRef{Kind: "GitRepository", Namespace: "apps", Name: "podinfo", Labels: map[string]string{"team": "a", "tier": "web"}}
	unlabelled := events.ObjectRef{Kind: "Bucket", Namespace: "apps", Name: "data"}
	tests := []struct {
		name   string
		spec   v1alpha1.SubscriptionSpec
		typ    string
		object events.ObjectRef
		want   bool
	}{
		{"everything, default types", v1alpha1.SubscriptionSpec{}, events.TypeArtifactStored, podinfo, true},
		{"internal types never", v1alpha1.SubscriptionSpec{}, events.TypePackaged, podinfo, false},
		{"type listed", v1alpha1.SubscriptionSpec{Types: []string{events.TypeArtifactFailed}}, events.TypeArtifactFailed, podinfo, true},
		{"type not listed", v1alpha1.SubscriptionSpec{Types: []string{events.TypeArtifactFailed}}, events.TypeArtifactStored, podinfo, false},
		{"kind", v1alpha1.SubscriptionSpec{Sources: v1alpha1.SourceSelector{Kinds: []string{"GitRepository"}}}, events.TypeArtifactStored, podinfo, true},
		{"other kind", v1alpha1.SubscriptionSpec{Sources: v1alpha1.SourceSelector{Kinds: []string{"GitRepository"}}}, events.TypeArtifactStored, unlabelled, false},
		{"namespace", v1alpha1.SubscriptionSpec{Sources: v1alpha1.SourceSelector{Namespaces: []string{"other"}}}, events.TypeArtifactStored, podinfo, false},
		{"name", v1alpha1.SubscriptionSpec{Sources: v1alpha1.SourceSelector{Names: []string{"podinfo"}}}, events.TypeArtifactStored, podinfo, true},
		{"labels match", v1alpha1.SubscriptionSpec{Sources: v1alpha1.SourceSelector{LabelSelector: &metav1.LabelSelector{
			MatchLabels:      map[string]string{"team": "a"},
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"web", "api"}}},
		}}}, events.TypeArtifactStored, podinfo, true},
		{"labels differ", v1alpha1.SubscriptionSpec{Sources: v1alpha1.SourceSelector{LabelSelector: &metav1.LabelSelector{
			MatchLabels: map[string]string{"team": "b"}}}}, events.TypeArtifactStored, podinfo, false},
		{"no labels", v1alpha1.SubscriptionSpec{Sources: v1alpha1.SourceSelector{LabelSelector: &metav1.LabelSelector{
			MatchLabels: map[string]string{"team": "a"}}}}, events.TypeArtifactStored, unlabelled, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := New(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if got := f.Match(tc.typ, tc.object); got != tc.want {
				t.Errorf("Match = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	for name, spec := range map[string]v1alpha1.SubscriptionSpec{
		"internal type": {Types: []string{events.TypePackaged}},
		"bad selector": {Sources: v1alpha1.SourceSelector{LabelSelector: &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}}},
	} {
		if _, err := New(spec); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}

// TestConfine: under -no-cross-namespace-refs a Subscription that names
// no namespace selects its own namespace's events only, one that names
// its own is unchanged, and one that names another is refused.
func TestConfine(t *testing.T) {
	sub := types.NamespacedName{Namespace: "tenant-a", Name: "sink"}
	own := events.ObjectRef{Kind: "GitRepository", Namespace: "tenant-a", Name: "app"}
	other := events.ObjectRef{Kind: "GitRepository", Namespace: "tenant-b", Name: "app"}
	for _, namespaces := range [][]string{nil, {"tenant-a"}} {
		f, err := New(v1alpha1.SubscriptionSpec{Sources: v1alpha1.SourceSelector{Namespaces: namespaces}})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Confine(sub); err != nil {
			t.Fatalf("namespaces %q: %v", namespaces, err)
		}
		if got, want := f.Subjects(), []string{"headwater.events.*.tenant-a.*"}; !slices.Equal(got, want) {
			t.Errorf("namespaces %q: Subjects = %q, want %q", namespaces, got, want)
		}
		if !f.Match(events.TypeArtifactStored, own) || f.Match(events.TypeArtifactStored, other) {
			t.Errorf("namespaces %q: matches own %v, other %v; want true, false", namespaces,
				f.Match(events.TypeArtifactStored, own), f.Match(events.TypeArtifactStored, other))
		}
	}
	f, err := New(v1alpha1.SubscriptionSpec{Sources: v1alpha1.SourceSelector{Namespaces: []string{"tenant-a", "tenant-b"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := "subscription 'tenant-a/sink' can't select events from namespace 'tenant-b', cross-namespace references have been blocked"
	if err := f.Confine(sub); err == nil || err.Error() != want {
		t.Errorf("Confine = %v, want %q", err, want)
	}
}
