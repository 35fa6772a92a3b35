package controller

import (
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestTriggersRateLimitAndCoalesce checks the per-source limit: the first
// hook reconciles at once, the next within MinInterval waits for its end,
// and every further one until then joins it; another source is not held
// back; the job is fresh until it is published.
func TestTriggersRateLimitAndCoalesce(t *testing.T) {
	tr := &Triggers{MinInterval: 300 * time.Millisecond, New: func() client.Object { return &sourcev1.GitRepository{} }}
	tr.init()
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	b := types.NamespacedName{Namespace: "ns", Name: "b"}
	next := func(within time.Duration) (types.NamespacedName, bool) {
		select {
		case e := <-tr.ch:
			return client.ObjectKeyFromObject(e.Object), true
		case <-time.After(within):
			return types.NamespacedName{}, false
		}
	}

	if tr.Trigger(t.Context(), a) {
		t.Fatal("first hook coalesced")
	}
	if got, ok := next(5 * time.Second); !ok || got != a {
		t.Fatalf("first hook: enqueued %v (%v), want %v at once", got, ok, a)
	}
	if !tr.Fresh(a) {
		t.Error("a triggered source's job is not fresh")
	}
	start := time.Now()
	if tr.Trigger(t.Context(), a) {
		t.Error("second hook coalesced, want it scheduled")
	}
	if !tr.Trigger(t.Context(), a) || !tr.Trigger(t.Context(), a) {
		t.Error("hooks within the interval not coalesced into the scheduled one")
	}
	if tr.Trigger(t.Context(), b) {
		t.Error("another source's hook coalesced")
	}
	if got, ok := next(5 * time.Second); !ok || got != b {
		t.Fatalf("other source: enqueued %v (%v), want %v at once", got, ok, b)
	}
	if got, ok := next(5 * time.Second); !ok || got != a {
		t.Fatalf("scheduled hook: enqueued %v (%v), want %v", got, ok, a)
	}
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Errorf("scheduled hook enqueued after %v, before the interval's end", waited)
	}
	if got, ok := next(500 * time.Millisecond); ok {
		t.Errorf("coalesced hooks enqueued %v again", got)
	}
	tr.Published(a)
	if tr.Fresh(a) {
		t.Error("job still fresh after it was published")
	}
	var nilTriggers *Triggers
	if nilTriggers.Fresh(a) {
		t.Error("nil Triggers reports a fresh job")
	}
}
