package controller

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
)

// histogram is what a test reads of one histogram series.
type histogram struct {
	count  uint64
	sum    float64
	bounds []float64
}

// fluxDurations returns the gotk_reconcile_duration_seconds series of reg
// by "kind/namespace/name".
func fluxDurations(t *testing.T, reg *prometheus.Registry) map[string]histogram {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]histogram{}
	for _, f := range families {
		if f.GetName() != "gotk_reconcile_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if len(labels) != 3 {
				t.Errorf("labels %v, want Flux's kind, name, namespace", labels)
			}
			h := histogram{count: m.GetHistogram().GetSampleCount(), sum: m.GetHistogram().GetSampleSum()}
			for _, b := range m.GetHistogram().GetBucket() {
				h.bounds = append(h.bounds, b.GetUpperBound())
			}
			got[labels["kind"]+"/"+labels["namespace"]+"/"+labels["name"]] = h
		}
	}
	return got
}

// TestFluxReconcileDuration: each reconcile is recorded under Flux's name,
// labels and buckets, per object, and an object's series goes with it.
func TestFluxReconcileDuration(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	a := types.NamespacedName{Namespace: "flux-system", Name: "podinfo"}
	b := types.NamespacedName{Namespace: "apps", Name: "charts"}
	start := time.Now().Add(-2 * time.Second)
	m.observe("GitRepository", a, start, false)
	m.observe("GitRepository", a, start, false)
	m.observe("HelmRepository", b, start, false)

	got := fluxDurations(t, reg)
	if len(got) != 2 || got["GitRepository/flux-system/podinfo"].count != 2 || got["HelmRepository/apps/charts"].count != 1 {
		t.Fatalf("series %v, want podinfo observed twice and charts once", got)
	}
	h := got["GitRepository/flux-system/podinfo"]
	if h.sum < 4 {
		t.Errorf("sum %v, want at least the 2 x 2s observed", h.sum)
	}
	if b := h.bounds; len(b) != 10 || math.Abs(b[0]-0.01) > 1e-9 || math.Abs(b[9]-1800) > 1e-6 {
		t.Errorf("buckets %v, want Flux's ten from 10ms to 1800s", b)
	}

	m.observe("GitRepository", a, start, true)
	got = fluxDurations(t, reg)
	if _, ok := got["GitRepository/flux-system/podinfo"]; ok || len(got) != 1 {
		t.Errorf("series after podinfo is gone: %v, want only charts", got)
	}
}
