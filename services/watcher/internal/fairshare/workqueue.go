package fairshare

import (
	"slices"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// NewQueueFunc makes a controller's work queue (controller-runtime's
// controller.Options.NewQueue).
type NewQueueFunc = func(controllerName string, rateLimiter workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request]

// NewWorkQueue is the reconcilers' work queue when fair share is on (nil,
// controller-runtime's own queue, when it is off): a request is taken
// round-robin across namespaces, and in the order it came within its
// namespace. A reconcile is where a fetch job is made, so a namespace
// whose thousand sources were just created must not hold another's few
// behind it on their way to the admission (Queue): without this, the
// small namespace's sources waited in the watcher's first-come queue
// behind the big one's reconciles (the API server's writes of their
// finalizers and conditions) for most of its time to Ready
// (docs/design.md, "Fair share between namespaces").
//
// The queue is client-go's work queue (its dedup, its processing set, its
// delays and rate limits, its metrics under controllerName) over a
// round-robin store in place of its FIFO.
func (o Options) NewWorkQueue() NewQueueFunc {
	if o.MaxInFlight <= 0 {
		return nil
	}
	return func(name string, rateLimiter workqueue.TypedRateLimiter[reconcile.Request]) workqueue.TypedRateLimitingInterface[reconcile.Request] {
		store := newRoundRobin(func(r reconcile.Request) string { return r.Namespace })
		queue := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[reconcile.Request]{Name: name, Queue: store})
		delaying := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[reconcile.Request]{Name: name, Queue: queue})
		return workqueue.NewTypedRateLimitingQueueWithConfig(rateLimiter,
			workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{Name: name, DelayingQueue: delaying})
	}
}

// roundRobin is a workqueue.Queue that pops across its items' groups in
// turn, first in first out within a group. Its caller (the work queue)
// holds a lock around every call.
type roundRobin[T comparable] struct {
	group  func(T) string
	queues map[string]*fifo[T]
	// turns are the groups with items, in the order they take turns;
	// next is the index of the group whose turn is next.
	turns []string
	next  int
	len   int
}

func newRoundRobin[T comparable](group func(T) string) *roundRobin[T] {
	return &roundRobin[T]{group: group, queues: map[string]*fifo[T]{}}
}

// Touch keeps an item added again where it is: its group's turn comes
// round soon enough.
func (r *roundRobin[T]) Touch(T) {}

// Push adds item at the end of its group's queue; a group that had none
// takes its turn after every group waiting.
func (r *roundRobin[T]) Push(item T) {
	g := r.group(item)
	q, ok := r.queues[g]
	if !ok {
		q = &fifo[T]{}
		r.queues[g] = q
		r.turns = append(r.turns, g)
	}
	q.push(item)
	r.len++
}

// Len is the number of items.
func (r *roundRobin[T]) Len() int { return r.len }

// Pop takes the first item of the group whose turn it is. The work queue
// calls it only when Len is positive.
func (r *roundRobin[T]) Pop() T {
	g := r.turns[r.next]
	q := r.queues[g]
	item := q.pop()
	r.len--
	if q.len() == 0 {
		delete(r.queues, g)
		r.turns = slices.Delete(r.turns, r.next, r.next+1)
	} else {
		r.next++
	}
	if r.next >= len(r.turns) {
		r.next = 0
	}
	return item
}

// fifo is a first-in first-out queue of items.
type fifo[T any] struct{ items []T }

func (q *fifo[T]) push(item T) { q.items = append(q.items, item) }

func (q *fifo[T]) len() int { return len(q.items) }

func (q *fifo[T]) pop() T {
	item := q.items[0]
	var zero T
	q.items[0] = zero // let the item be collected
	q.items = q.items[1:]
	return item
}
