package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// fluxSource is a Flux source object the benchmark waits for.
type fluxSource interface {
	client.Object
	GetArtifact() *meta.Artifact
	GetConditions() []metav1.Condition
}

// readyWithArtifact is the end of a new object's first reconcile: Ready=True
// for its current generation, with status.artifact set.
func readyWithArtifact[T fluxSource](o T) bool {
	ready := apimeta.FindStatusCondition(o.GetConditions(), meta.ReadyCondition)
	return o.GetArtifact() != nil && ready != nil && ready.Status == metav1.ConditionTrue && ready.ObservedGeneration == o.GetGeneration()
}

// handled returns the end of a requested reconcile: token handled, and the
// object still Ready with an artifact.
func handled(token string) func(*sourcev1.GitRepository) bool {
	return func(o *sourcev1.GitRepository) bool {
		return o.Status.LastHandledReconcileAt == token && readyWithArtifact(o) && o.Status.ObservedGeneration == o.Generation
	}
}

// tracker follows the sources of one kind in a namespace with one list and
// watch (no polling, so it adds little load to the API server) and tells
// when want of them match.
type tracker[T fluxSource] struct {
	c       client.WithWatch
	ns      string
	want    int
	match   func(T) bool
	newList func() client.ObjectList

	mu      sync.Mutex
	matched map[string]bool
	last    time.Time // when the last matching object was seen
	// sinceCreated are, for each object that matched, the time from its
	// creationTimestamp to its Ready condition's lastTransitionTime: both
	// the API server's record (its clock and the watcher's, one machine),
	// in whole seconds; absent when the object has no Ready condition.
	sinceCreated []time.Duration
	// createdSince: sinceCreated counts the objects created from then on
	// only (those the measurement created); set before run.
	createdSince time.Time
	// firstCreated and lastReady span sinceCreated: the earliest
	// creationTimestamp and the latest Ready transition seen.
	firstCreated, lastReady time.Time
}

// newTracker returns a tracker waiting for want objects of the kind
// newList lists in ns to match.
func newTracker[T fluxSource](c client.WithWatch, ns string, want int, newList func() client.ObjectList, match func(T) bool) *tracker[T] {
	return &tracker[T]{c: c, ns: ns, want: want, match: match, newList: newList, matched: map[string]bool{}}
}

// count is how many objects match now.
func (t *tracker[T]) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.matched)
}

// run lists and watches until want objects match (returning when that was
// first seen) or ctx ends.
func (t *tracker[T]) run(ctx context.Context) (time.Time, error) {
	for {
		list := t.newList()
		if err := t.c.List(ctx, list, client.InNamespace(t.ns)); err != nil {
			if !sleep(ctx, time.Second) {
				return time.Time{}, fmt.Errorf("waiting for %d objects (%d matched; last list error: %w): %w", t.want, t.count(), err, ctx.Err())
			}
			continue
		}
		items, err := apimeta.ExtractList(list)
		if err != nil {
			return time.Time{}, err
		}
		for _, item := range items {
			if o, ok := item.(T); ok {
				t.update(o, false)
			}
		}
		if at, ok := t.reached(); ok {
			return at, nil
		}
		w, err := t.c.Watch(ctx, t.newList(), client.InNamespace(t.ns),
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}})
		if err != nil {
			sleep(ctx, time.Second)
			continue
		}
		at, ok := t.follow(w)
		w.Stop()
		if ok {
			return at, nil
		}
		if ctx.Err() != nil {
			return time.Time{}, fmt.Errorf("waiting for %d objects (%d matched): %w", t.want, t.count(), ctx.Err())
		}
	}
}

// follow applies watch events until want objects match or the watch ends.
func (t *tracker[T]) follow(w watch.Interface) (time.Time, bool) {
	for ev := range w.ResultChan() {
		o, ok := ev.Object.(T)
		switch {
		case ev.Type == watch.Error, !ok:
			return time.Time{}, false // relist
		case ev.Type == watch.Deleted:
			t.update(o, true)
		default:
			t.update(o, false)
		}
		if at, ok := t.reached(); ok {
			return at, true
		}
	}
	return time.Time{}, false
}

func (t *tracker[T]) update(o T, deleted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !deleted && t.match(o) {
		if !t.matched[o.GetName()] {
			t.matched[o.GetName()] = true
			t.last = time.Now()
			t.recordCreatedToReady(o)
		}
		return
	}
	delete(t.matched, o.GetName())
}

// recordCreatedToReady notes o's time from creation to Ready by the API
// server's own timestamps (t.mu held).
func (t *tracker[T]) recordCreatedToReady(o T) {
	ready := apimeta.FindStatusCondition(o.GetConditions(), meta.ReadyCondition)
	created := o.GetCreationTimestamp().Time
	if ready == nil || created.IsZero() || created.Before(t.createdSince) {
		return
	}
	at := ready.LastTransitionTime.Time
	t.sinceCreated = append(t.sinceCreated, at.Sub(created))
	if t.firstCreated.IsZero() || created.Before(t.firstCreated) {
		t.firstCreated = created
	}
	if at.After(t.lastReady) {
		t.lastReady = at
	}
}

// createdToReady summarises the matched objects' times from creation to
// Ready by the API server's timestamps, and the span from the first
// creation to the last Ready; nil when none was recorded.
func (t *tracker[T]) createdToReady() (*Latency, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := latencyOf("creationTimestamp -> Ready lastTransitionTime (API server's record, 1 s resolution)", t.sinceCreated)
	if l == nil {
		return nil, 0
	}
	return l, t.lastReady.Sub(t.firstCreated)
}

func (t *tracker[T]) reached() (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.last, len(t.matched) >= t.want
}

// sleep waits d or until ctx ends, reporting whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}
