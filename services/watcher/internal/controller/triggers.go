package controller

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// DefaultHookInterval is the default of Triggers.MinInterval (the
// watcher's -hook-min-interval).
const DefaultHookInterval = time.Second

// Triggers queues the reconciles webhooks ask for, for one source kind: a
// triggered object is reconciled at once, outside its interval, and its
// fetch job is fresh (events.FetchRequested.Fresh), so no reference listing
// made before the hook answers it. Each object is triggered at most once
// per MinInterval: a hook within the interval of the last one is
// coalesced into one reconcile at the interval's end, which sees every
// push made until then. A nil *Triggers triggers nothing.
type Triggers struct {
	// MinInterval is the least time between two triggered reconciles of
	// one object; DefaultHookInterval when zero.
	MinInterval time.Duration
	// New returns an empty object of the kind.
	New func() client.Object

	once    sync.Once
	ch      chan event.GenericEvent
	mu      sync.Mutex
	last    map[types.NamespacedName]time.Time
	pending map[types.NamespacedName]bool
	fresh   map[types.NamespacedName]bool
}

func (t *Triggers) init() {
	t.once.Do(func() {
		t.ch = make(chan event.GenericEvent, 1024)
		t.last = map[types.NamespacedName]time.Time{}
		t.pending = map[types.NamespacedName]bool{}
		t.fresh = map[types.NamespacedName]bool{}
	})
}

// Source is the controller source the triggered reconciles come from.
func (t *Triggers) Source() source.Source {
	t.init()
	return source.Channel(t.ch, &handler.EnqueueRequestForObject{})
}

// Trigger asks for a fresh reconcile of key, now or, within MinInterval
// of the last one, at its end. It reports whether the hook was coalesced
// into a reconcile already scheduled.
func (t *Triggers) Trigger(ctx context.Context, key types.NamespacedName) (coalesced bool) {
	t.init()
	every := t.MinInterval
	if every <= 0 {
		every = DefaultHookInterval
	}
	t.mu.Lock()
	if t.pending[key] {
		t.mu.Unlock()
		return true
	}
	now := time.Now()
	for k, at := range t.last {
		// Forget objects triggered long ago (deleted ones included).
		if now.Sub(at) > every && !t.pending[k] && len(t.last) > 1024 {
			delete(t.last, k)
		}
	}
	wait := every - now.Sub(t.last[key])
	t.pending[key] = true
	t.mu.Unlock()
	if wait <= 0 {
		t.fire(ctx, key)
		return false
	}
	// The caller's context may be a bus job's, which ends with the job
	// (bus.Worker's deadline): the trigger outlives it.
	later := context.WithoutCancel(ctx)
	time.AfterFunc(wait, func() { t.fire(later, key) })
	return false
}

// fire marks key fresh and enqueues its reconcile.
func (t *Triggers) fire(ctx context.Context, key types.NamespacedName) {
	t.mu.Lock()
	delete(t.pending, key)
	t.last[key] = time.Now()
	t.fresh[key] = true
	t.mu.Unlock()
	obj := t.New()
	obj.SetNamespace(key.Namespace)
	obj.SetName(key.Name)
	select {
	case t.ch <- event.GenericEvent{Object: obj}:
	case <-ctx.Done():
	}
}

// Fresh reports whether key's next job must be fresh: a hook triggered it
// and no job has been published since.
func (t *Triggers) Fresh(key types.NamespacedName) bool {
	if t == nil {
		return false
	}
	t.init()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fresh[key]
}

// Published records that key's fresh job is on the bus.
func (t *Triggers) Published(key types.NamespacedName) {
	if t == nil {
		return
	}
	t.init()
	t.mu.Lock()
	delete(t.fresh, key)
	t.mu.Unlock()
}
