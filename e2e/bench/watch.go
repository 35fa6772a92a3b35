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

// readyWithArtifact is the end of a new object's first reconcile: Ready=True
// for its current generation, with status.artifact set.
func readyWithArtifact(o *sourcev1.GitRepository) bool {
	return o.Status.ObservedGeneration == o.Generation && o.Status.Artifact != nil &&
		apimeta.IsStatusConditionTrue(o.Status.Conditions, meta.ReadyCondition)
}

// handled returns the end of a requested reconcile: token handled, and the
// object still Ready with an artifact.
func handled(token string) func(*sourcev1.GitRepository) bool {
	return func(o *sourcev1.GitRepository) bool {
		return o.Status.LastHandledReconcileAt == token && readyWithArtifact(o)
	}
}

// tracker follows the GitRepositories of a namespace with one list and
// watch (no polling, so it adds little load to the API server) and tells
// when want of them match.
type tracker struct {
	c     client.WithWatch
	ns    string
	want  int
	match func(*sourcev1.GitRepository) bool

	mu      sync.Mutex
	matched map[string]bool
	last    time.Time // when the last matching object was seen
}

// newTracker returns a tracker waiting for want objects in ns to match.
func newTracker(c client.WithWatch, ns string, want int, match func(*sourcev1.GitRepository) bool) *tracker {
	return &tracker{c: c, ns: ns, want: want, match: match, matched: map[string]bool{}}
}

// count is how many objects match now.
func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.matched)
}

// run lists and watches until want objects match (returning when that was
// first seen) or ctx ends.
func (t *tracker) run(ctx context.Context) (time.Time, error) {
	for {
		var list sourcev1.GitRepositoryList
		if err := t.c.List(ctx, &list, client.InNamespace(t.ns)); err != nil {
			if !sleep(ctx, time.Second) {
				return time.Time{}, fmt.Errorf("waiting for %d objects (%d matched; last list error: %w): %w", t.want, t.count(), err, ctx.Err())
			}
			continue
		}
		for i := range list.Items {
			t.update(&list.Items[i], false)
		}
		if at, ok := t.reached(); ok {
			return at, nil
		}
		w, err := t.c.Watch(ctx, &sourcev1.GitRepositoryList{}, client.InNamespace(t.ns),
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
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
func (t *tracker) follow(w watch.Interface) (time.Time, bool) {
	for ev := range w.ResultChan() {
		o, ok := ev.Object.(*sourcev1.GitRepository)
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

func (t *tracker) update(o *sourcev1.GitRepository, deleted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !deleted && t.match(o) {
		if !t.matched[o.Name] {
			t.matched[o.Name] = true
			t.last = time.Now()
		}
		return
	}
	delete(t.matched, o.Name)
}

func (t *tracker) reached() (time.Time, bool) {
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
