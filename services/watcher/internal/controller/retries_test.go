package controller

import (
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestRetriesBackoff checks the per-source backoff: each failure doubles
// the delay from Base (plus at most a tenth of jitter) up to Max, another
// source keeps its own count, a host's own delay is taken as it is (plus
// jitter) and not counted, and a success starts the count again.
func TestRetriesBackoff(t *testing.T) {
	r := &Retries{Base: time.Hour, Max: 8 * time.Hour, New: func() client.Object { return &sourcev1.GitRepository{} }}
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	b := types.NamespacedName{Namespace: "ns", Name: "b"}
	defer r.Succeeded(a)
	defer r.Succeeded(b)
	within := func(d, want time.Duration) bool { return d >= want && d <= want+want/10 }
	for i, want := range []time.Duration{time.Hour, 2 * time.Hour, 4 * time.Hour, 8 * time.Hour, 8 * time.Hour} {
		if d := r.Failed(t.Context(), a, 0); !within(d, want) {
			t.Errorf("failure %d: delay %v, want %v plus at most 10%%", i+1, d, want)
		}
	}
	if got := r.Failures(a); got != 5 {
		t.Errorf("failures of a = %d, want 5", got)
	}
	if d := r.Failed(t.Context(), b, 0); !within(d, time.Hour) {
		t.Errorf("another source's first failure: delay %v, want %v", d, time.Hour)
	}
	if d := r.Failed(t.Context(), b, 40*time.Second); !within(d, 40*time.Second) {
		t.Errorf("the host's own delay: %v, want 40s plus at most 10%%", d)
	}
	if got := r.Failures(b); got != 1 {
		t.Errorf("failures of b = %d, want 1 (a host's delay is not counted)", got)
	}
	r.Succeeded(a)
	if got := r.Failures(a); got != 0 {
		t.Errorf("failures after a success = %d, want 0", got)
	}
	if d := r.Failed(t.Context(), a, 0); !within(d, time.Hour) {
		t.Errorf("first failure after a success: delay %v, want %v", d, time.Hour)
	}
	var nilRetries *Retries
	if d := nilRetries.Failed(t.Context(), a, 0); d != 0 {
		t.Errorf("nil Retries scheduled a retry after %v", d)
	}
}

// TestRetriesFire checks that a scheduled retry enqueues the source's
// reconcile once, and that a success cancels a scheduled one.
func TestRetriesFire(t *testing.T) {
	r := &Retries{Base: time.Millisecond, New: func() client.Object { return &sourcev1.GitRepository{} }}
	r.init()
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	r.Failed(t.Context(), a, 0)
	select {
	case e := <-r.ch:
		if got := client.ObjectKeyFromObject(e.Object); got != a {
			t.Fatalf("enqueued %v, want %v", got, a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the retry was not enqueued")
	}
	b := types.NamespacedName{Namespace: "ns", Name: "b"}
	r.Failed(t.Context(), b, time.Hour)
	r.Succeeded(b)
	r.mu.Lock()
	pending := len(r.timers)
	r.mu.Unlock()
	if pending != 0 {
		t.Errorf("%d retries still scheduled after the success", pending)
	}
}

// TestRetriesAttempt checks the numbers retries give their jobs: none
// before a retry fires, a new one for every retry fired (so no retry's
// job repeats an earlier job's ID), kept until that retry's job is
// published, and not cleared by the publication of an older one.
func TestRetriesAttempt(t *testing.T) {
	r := &Retries{Base: time.Millisecond, New: func() client.Object { return &sourcev1.GitRepository{} }}
	r.init()
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	if n := r.Attempt(a); n != 0 {
		t.Fatalf("attempt before any retry = %d, want 0", n)
	}
	fired := func() uint64 {
		t.Helper()
		r.Failed(t.Context(), a, time.Millisecond)
		select {
		case <-r.ch:
		case <-time.After(10 * time.Second):
			t.Fatal("the retry was not enqueued")
		}
		return r.Attempt(a)
	}
	first := fired()
	if first == 0 {
		t.Fatal("a fired retry has no attempt number")
	}
	if again := r.Attempt(a); again != first {
		t.Errorf("attempt read twice: %d then %d", first, again)
	}
	second := fired()
	if second == first {
		t.Errorf("two retries share attempt %d", first)
	}
	r.Published(a, first)
	if n := r.Attempt(a); n != second {
		t.Errorf("after the older retry's job: attempt %d, want %d kept", n, second)
	}
	r.Published(a, second)
	if n := r.Attempt(a); n != 0 {
		t.Errorf("after its job was published: attempt %d, want 0", n)
	}
	var nilRetries *Retries
	if n := nilRetries.Attempt(a); n != 0 {
		t.Errorf("nil Retries: attempt %d", n)
	}
	nilRetries.Published(a, 1)
}
