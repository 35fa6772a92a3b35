package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCreatedToReady: the tracker takes each matched object's time from
// its creationTimestamp to its Ready transition, for the objects created
// since the measurement started only, and once per object.
func TestCreatedToReady(t *testing.T) {
	start := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	obj := func(name string, created time.Time, ready time.Duration) *sourcev1.GitRepository {
		o := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)}}
		o.Status.Artifact = &meta.Artifact{}
		o.Status.Conditions = []metav1.Condition{{Type: meta.ReadyCondition, Status: metav1.ConditionTrue,
			LastTransitionTime: metav1.NewTime(created.Add(ready))}}
		return o
	}
	tr := newTracker(nil, namespace, 3, nil, readyWithArtifact[*sourcev1.GitRepository])
	tr.createdSince = start
	tr.update(obj("a", start, 2*time.Second), false)
	tr.update(obj("a", start, 2*time.Second), false) // seen again: not counted twice
	tr.update(obj("b", start.Add(time.Second), 5*time.Second), false)
	tr.update(obj("c", start.Add(3*time.Second), 9*time.Second), false)
	tr.update(obj("old", start.Add(-time.Hour), time.Second), false) // created before: matched, not timed
	l, span := tr.createdToReady()
	if l == nil || l.N != 3 || l.P50 != 5*time.Second || l.Max != 9*time.Second {
		t.Fatalf("created -> Ready = %+v, want 3 samples, p50 5s, max 9s", l)
	}
	if span != 12*time.Second {
		t.Errorf("first created -> last Ready = %s, want 12s", span)
	}
	if n := tr.count(); n != 4 {
		t.Errorf("%d matched, want 4", n)
	}

	m := &Measurement{CreatedToReady: l, Usage: []Usage{{Name: "kube-apiserver", CPU: 6 * time.Second}},
		AfterApply: &AfterApply{Wall: 10 * time.Second, APIServerCPU: 3 * time.Second,
			Requests: map[string]float64{"PATCH/200": 5, "GET/200": 1, "PUT/409": 4}}}
	got := afterApplyString(m)
	for _, want := range []string{"(10, 9 writes)", "300.00 ms of kube-apiserver CPU per request", "1000.00 ms after the apply", "2000.00 ms over the whole window"} {
		if !strings.Contains(got, want) {
			t.Errorf("afterApplyString = %q, want it to contain %q", got, want)
		}
	}
	if afterApplyString(&Measurement{}) != "" {
		t.Error("afterApplyString of a measurement without AfterApply is not empty")
	}
}
