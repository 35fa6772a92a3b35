package controller

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Backoff bounds of Retries, controller-runtime's default per-item rate
// limiter's, which Flux's source-controller requeues a failed reconcile
// with.
const (
	// DefaultRetryBase is the first retry's delay.
	DefaultRetryBase = 5 * time.Millisecond
	// DefaultRetryMax caps the delay.
	DefaultRetryMax = 1000 * time.Second
)

// retryJitter is the largest share of a delay added to it at random, so
// that the sources one outage failed together do not retry in step.
const retryJitter = 0.1

// Retries schedules the reconcile of a source whose fetch failed for a
// reason that passes (a 429, a 5xx, a timeout), for one source kind: on an
// exponential backoff per object, with jitter, as Flux requeues a failed
// reconcile, instead of at the next interval; or, for a source rate limited
// by its host, when the host allows the next attempt (jittered as well). An outcome
// that succeeds forgets the object's failures. A nil *Retries schedules
// nothing.
//
// Each retry that fires is numbered, and the job the retried reconcile
// publishes carries the number in its ID (Attempt, Published): a retry
// made within the second of the job it retries, from the same inputs, is
// a job of its own, not a duplicate the bus drops (which would leave the
// source alone until its interval).
type Retries struct {
	// Base and Max bound the backoff; DefaultRetryBase and
	// DefaultRetryMax when zero.
	Base, Max time.Duration
	// New returns an empty object of the kind.
	New func() client.Object
	// Kind names the kind in Metrics.
	Kind string
	// Metrics, when set, counts the retries that fire.
	Metrics *Metrics

	once    sync.Once
	ch      chan event.GenericEvent
	limiter workqueue.TypedRateLimiter[types.NamespacedName]
	mu      sync.Mutex
	timers  map[types.NamespacedName]*time.Timer
	// seq numbers the retries fired; attempts holds, per object, the
	// number of the retry fired and not yet published as a job.
	seq      uint64
	attempts map[types.NamespacedName]uint64
}

func (r *Retries) init() {
	r.once.Do(func() {
		base, maxDelay := r.Base, r.Max
		if base <= 0 {
			base = DefaultRetryBase
		}
		if maxDelay <= 0 {
			maxDelay = DefaultRetryMax
		}
		r.ch = make(chan event.GenericEvent, 1024)
		r.limiter = workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](base, maxDelay)
		r.timers = map[types.NamespacedName]*time.Timer{}
		r.attempts = map[types.NamespacedName]uint64{}
		r.Metrics.initRetried(r.Kind)
	})
}

// Source is the controller source the retries come from.
func (r *Retries) Source() source.Source {
	r.init()
	return source.Channel(r.ch, &handler.EnqueueRequestForObject{})
}

// Failed counts a failure of key that passes and schedules its next
// reconcile: after the backoff of its failures so far, or after at when at
// is positive (the host's own word, not counted as a failure), both with
// up to a tenth more of jitter. It returns the delay, and zero when r is
// nil.
func (r *Retries) Failed(ctx context.Context, key types.NamespacedName, at time.Duration) time.Duration {
	if r == nil {
		return 0
	}
	r.init()
	d, after := at, retriedAfterRateLimited
	if d <= 0 {
		d, after = r.limiter.When(key), retriedAfterFailure
	}
	// Jittered, a host's own delay too: the sources one hold stopped
	// together must not all return the moment it ends, or their first
	// requests spend the host's burst and the next refusal holds every
	// fetch half done again, round after round.
	d += time.Duration(rand.Float64() * retryJitter * float64(d))
	r.mu.Lock()
	defer r.mu.Unlock()
	if t := r.timers[key]; t != nil {
		t.Stop()
	}
	// The caller's context may be a bus job's, which ends with the job
	// (bus.Worker's deadline): the retry outlives it.
	later := context.WithoutCancel(ctx)
	r.timers[key] = time.AfterFunc(d, func() { r.fire(later, key, after) })
	return d
}

// Failures returns how many failures of key the backoff counts.
func (r *Retries) Failures(key types.NamespacedName) int {
	if r == nil {
		return 0
	}
	r.init()
	return r.limiter.NumRequeues(key)
}

// Succeeded forgets key's failures and its scheduled retry.
func (r *Retries) Succeeded(key types.NamespacedName) {
	if r == nil {
		return
	}
	r.init()
	r.limiter.Forget(key)
	r.mu.Lock()
	defer r.mu.Unlock()
	if t := r.timers[key]; t != nil {
		t.Stop()
		delete(r.timers, key)
	}
}

// Attempt returns the number of the retry that asked for key's
// reconcile and whose job is not published yet, and 0 when there is none:
// the reconcile's job ID includes it.
func (r *Retries) Attempt(key types.NamespacedName) uint64 {
	if r == nil {
		return 0
	}
	r.init()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts[key]
}

// Published records that the job of key's retry attempt is on the bus. A
// retry fired since keeps its own number.
func (r *Retries) Published(key types.NamespacedName, attempt uint64) {
	if r == nil || attempt == 0 {
		return
	}
	r.init()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.attempts[key] == attempt {
		delete(r.attempts, key)
	}
}

// fire numbers key's retry, counts it by what it comes after, and
// enqueues its reconcile.
func (r *Retries) fire(ctx context.Context, key types.NamespacedName, after string) {
	r.Metrics.retried(r.Kind, after)
	r.mu.Lock()
	delete(r.timers, key)
	r.seq++
	r.attempts[key] = r.seq
	r.mu.Unlock()
	obj := r.New()
	obj.SetNamespace(key.Namespace)
	obj.SetName(key.Name)
	select {
	case r.ch <- event.GenericEvent{Object: obj}:
	case <-ctx.Done():
	}
}
