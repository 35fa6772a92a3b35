package controller

import (
	"fmt"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// steadyObject is a GitRepository as its last unchanged outcome leaves it,
// its artifact served at base.
func steadyObject(uid, base string) *sourcev1.GitRepository {
	obj := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "default", UID: types.UID(uid), Generation: 2,
		Annotations: map[string]string{meta.ReconcileRequestAnnotation: "t1"}}}
	obj.Status.ObservedGeneration = 2
	obj.Status.LastHandledReconcileAt = "t1"
	path := "gitrepository/default/app/abc.tar.gz"
	obj.Status.Artifact = &meta.Artifact{Path: path, URL: base + path, Revision: "main@sha1:abc"}
	conditions.MarkTrue(obj, sourcev1.ArtifactInStorageCondition, meta.SucceededReason, "stored")
	conditions.MarkTrue(obj, meta.ReadyCondition, meta.SucceededReason, "stored")
	return obj
}

func TestSteadyQuiet(t *testing.T) {
	const base = "http://artifacts.example:80/"
	now := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	learned := &meta.Artifact{Path: "gitrepository/default/other/x.tar.gz", URL: base + "gitrepository/default/other/x.tar.gz"}

	cases := []struct {
		name   string
		learn  *meta.Artifact // what the artifact-server announced
		mutate func(*sourcev1.GitRepository)
		want   bool
	}{
		{name: "steady", learn: learned, want: true},
		{name: "address not learned yet", want: false},
		{name: "advertised address changed", learn: &meta.Artifact{Path: "p", URL: "http://new.example/p"}, want: false},
		{name: "new generation", learn: learned, mutate: func(o *sourcev1.GitRepository) { o.Generation = 3 }, want: false},
		{name: "reconcile requested", learn: learned, mutate: func(o *sourcev1.GitRepository) {
			o.Annotations[meta.ReconcileRequestAnnotation] = "t2"
		}, want: false},
		{name: "not ready", learn: learned, mutate: func(o *sourcev1.GitRepository) {
			conditions.MarkFalse(o, meta.ReadyCondition, sourcev1.GitOperationFailedReason, "failed")
		}, want: false},
		{name: "no artifact", learn: learned, mutate: func(o *sourcev1.GitRepository) { o.Status.Artifact = nil }, want: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSteady(10 * time.Minute)
			s.Learn(tc.learn)
			obj := steadyObject("u1", base)
			// The first job of a source announces: it is never quiet.
			if s.Quiet(sourceKind(), obj, now) {
				t.Fatal("the first job was quiet")
			}
			if tc.mutate != nil {
				tc.mutate(obj)
			}
			if got := s.Quiet(sourceKind(), obj, now.Add(time.Minute)); got != tc.want {
				t.Errorf("Quiet = %t, want %t", got, tc.want)
			}
		})
	}

	t.Run("announced every interval", func(t *testing.T) {
		s := NewSteady(10 * time.Minute)
		s.Learn(learned)
		obj := steadyObject("u1", base)
		var announced []int
		for minute := range 25 {
			if !s.Quiet(sourceKind(), obj, now.Add(time.Duration(minute)*time.Minute)) {
				announced = append(announced, minute)
			}
		}
		if fmt.Sprint(announced) != "[0 10 20]" {
			t.Errorf("announced at minutes %v, want [0 10 20]", announced)
		}
		s.Forget(obj.UID)
		if s.Quiet(sourceKind(), obj, now.Add(26*time.Minute)) {
			t.Error("a forgotten source's next job was quiet")
		}
	})

	t.Run("off", func(t *testing.T) {
		var none *Steady
		s := NewSteady(0)
		s.Learn(learned)
		obj := steadyObject("u1", base)
		for i := range 3 {
			if none.Quiet(sourceKind(), obj, now) || s.Quiet(sourceKind(), obj, now.Add(time.Duration(i)*time.Second)) {
				t.Fatal("a job was quiet with quiet jobs off")
			}
		}
	})
}

func TestUntilSlot(t *testing.T) {
	const interval = time.Minute
	start := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	phases := map[time.Duration]bool{}
	for r := range 20 {
		remote := fmt.Sprintf("https://git.example/repo-%d.git", r)
		var due time.Time
		for i := range 50 {
			// Sources of one remote reconciled at any moment are next
			// due at the same instant.
			now := start.Add(time.Duration(i) * 1137 * time.Millisecond)
			if now.Sub(start) >= interval {
				break
			}
			d := untilSlot(now, interval, remote)
			if d <= 0 || d > interval {
				t.Fatalf("%s at %s: %s, want in (0, %s]", remote, now, d, interval)
			}
			if at := now.Add(d); !due.IsZero() && !at.Equal(due) && !at.Equal(due.Add(interval)) {
				t.Fatalf("%s: due at %s and at %s", remote, due, at)
			} else if due.IsZero() {
				due = at
			}
		}
		// Reconciled at its slot, a source is due one interval later.
		if d := untilSlot(due, interval, remote); d != interval {
			t.Errorf("%s: reconciled at its slot, due again in %s, want %s", remote, d, interval)
		}
		phases[due.Sub(start)%interval] = true
	}
	if len(phases) < 15 {
		t.Errorf("20 remotes share %d phases: the slots do not spread the load", len(phases))
	}
}
