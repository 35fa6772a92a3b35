package controller

import (
	"context"
	"slices"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestSourceConditionsReadOnScrape: headwater_source_condition is read
// from a real informer cache when the registry is gathered, only on the
// leader, at most once every Every (a gather sooner gets the last read),
// and follows a source's Ready status until the source is gone.
func TestSourceConditionsReadOnScrape(t *testing.T) {
	cfg, scheme, c := controlPlane(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	informers, err := cache.New(cfg, cache.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = informers.Start(ctx) }()

	reg := prometheus.NewRegistry()
	s := NewSourceConditions(reg, informers, scheme, time.Minute, testr.New(t))
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s.now = func() time.Time { return now }
	statuses := func() []string {
		t.Helper()
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range families {
			for _, m := range f.GetMetric() {
				l := map[string]string{}
				for _, p := range m.GetLabel() {
					l[p.GetName()] = p.GetValue()
				}
				if l["kind"] == "GitRepository" && l["name"] == "podinfo" && l["type"] == "Ready" && m.GetGauge().GetValue() == 1 {
					out = append(out, l["status"])
				}
			}
		}
		return out
	}
	waitFor := func(what string, want []string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !slices.Equal(statuses(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: statuses %q, want %q", what, statuses(), want)
			}
			// Past Every, so each gather reads the cache again.
			now = now.Add(time.Minute)
			time.Sleep(50 * time.Millisecond)
		}
	}

	repo := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default"},
		Spec: sourcev1.GitRepositorySpec{URL: "https://example.com/podinfo.git", Interval: metav1.Duration{Duration: time.Minute}}}
	if err := c.Create(ctx, repo); err != nil {
		t.Fatal(err)
	}
	if got := statuses(); len(got) != 0 {
		t.Fatalf("a replica that does not lead reports %q", got)
	}
	go func() { _ = s.Start(ctx) }()
	waitFor("the new source", []string{"Unknown"})

	base := client.MergeFrom(repo.DeepCopy())
	repo.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Failed", Message: "x",
		LastTransitionTime: metav1.Now()}}
	if err := c.Status().Patch(ctx, repo, base); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		var cached sourcev1.GitRepository
		if err := informers.Get(ctx, client.ObjectKeyFromObject(repo), &cached); err == nil && len(cached.Status.Conditions) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cache never saw the status")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Within Every the last read answers, however the cache changed.
	if got := statuses(); !slices.Equal(got, []string{"Unknown"}) {
		t.Fatalf("statuses %q within Every of the last read, want the last read's [Unknown]", got)
	}
	now = now.Add(time.Minute)
	if got := statuses(); !slices.Equal(got, []string{"False"}) {
		t.Fatalf("statuses %q after Every, want [False]", got)
	}

	if err := c.Delete(ctx, repo); err != nil {
		t.Fatal(err)
	}
	waitFor("the series gone with the source", nil)
}
