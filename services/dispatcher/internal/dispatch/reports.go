package dispatch

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// EventPublisher publishes an event that belongs to no job; *bus.Publisher
// is one.
type EventPublisher interface {
	PublishEvent(ctx context.Context, subject, eventType, id, ceSubject string, data any) error
}

// Reports gathers what happened to each Subscription and publishes it to
// the watcher as TypeDeliveryReported, at most once per Interval per
// Subscription (a dead letter or a new problem at once), so a busy sink
// costs the API server one status write every few seconds, not one per
// event.
type Reports struct {
	// Publisher publishes the reports.
	Publisher EventPublisher
	// Dispatcher names this replica in reports and their message IDs,
	// which must be unique across replicas and restarts.
	Dispatcher string
	// Interval is the longest a report waits; default 2s.
	Interval time.Duration
	// Log reports publishing failures.
	Log logr.Logger

	mu       sync.Mutex
	pending  map[types.UID]*events.DeliveryReport
	problems map[types.UID]*events.Failure
	gens     map[types.UID]int64
	seq      uint64
	kick     chan struct{}
	once     sync.Once
}

func (r *Reports) init() {
	r.once.Do(func() {
		r.pending = map[types.UID]*events.DeliveryReport{}
		r.problems = map[types.UID]*events.Failure{}
		r.gens = map[types.UID]int64{}
		r.kick = make(chan struct{}, 1)
	})
}

// entry returns the pending report of ref, creating it; r.mu is held.
func (r *Reports) entry(ref events.SubscriptionRef) *events.DeliveryReport {
	uid := types.UID(ref.UID)
	p, ok := r.pending[uid]
	if !ok {
		p = &events.DeliveryReport{Dispatcher: r.Dispatcher}
		r.pending[uid] = p
	}
	p.Subscription = ref
	return p
}

func (r *Reports) now() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Delivered counts an event the sink accepted at t.
func (r *Reports) Delivered(ref events.SubscriptionRef, t time.Time) {
	r.init()
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.entry(ref)
	p.Delivered++
	p.LastDelivered = &t
}

// Failed counts a failed attempt.
func (r *Reports) Failed(ref events.SubscriptionRef) {
	r.init()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entry(ref).Failed++
}

// DeadLetter records an event given up, and reports at once.
func (r *Reports) DeadLetter(ref events.SubscriptionRef, dl events.DeadLetter) {
	r.init()
	r.mu.Lock()
	p := r.entry(ref)
	p.DeadLettered++
	p.LastDeadLetter = &dl
	r.mu.Unlock()
	r.now()
}

// Problem sets (or, with nil, clears) what keeps a Subscription from being
// served at ref's generation; every report carries it. A change is
// reported at once, and so is a Subscription seen for the first time or at
// a new generation, so its status says whether it is served as it is now.
func (r *Reports) Problem(ref events.SubscriptionRef, p *events.Failure) {
	r.init()
	r.mu.Lock()
	uid := types.UID(ref.UID)
	old, known := r.problems[uid]
	changed := !known || (old == nil) != (p == nil) || (p != nil && *old != *p) || r.gens[uid] != ref.Generation
	r.problems[uid] = p
	r.gens[uid] = ref.Generation
	_, pending := r.pending[uid]
	if changed || pending {
		r.entry(ref)
	}
	r.mu.Unlock()
	if changed {
		r.now()
	}
}

// Forget drops a deleted Subscription's pending report.
func (r *Reports) Forget(uid types.UID) {
	r.init()
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pending, uid)
	delete(r.problems, uid)
	delete(r.gens, uid)
}

// Run publishes reports until ctx ends, then publishes what is pending.
func (r *Reports) Run(ctx context.Context) {
	r.init()
	every := r.Interval
	if every <= 0 {
		every = 2 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			r.Flush(flushCtx)
			cancel()
			return
		case <-t.C:
		case <-r.kick:
		}
		r.Flush(ctx)
	}
}

// Flush publishes every pending report; a report that cannot be published
// is merged back and tried again next time.
func (r *Reports) Flush(ctx context.Context) {
	r.init()
	r.mu.Lock()
	batch := r.pending
	r.pending = map[types.UID]*events.DeliveryReport{}
	problems := maps.Clone(r.problems)
	r.mu.Unlock()
	for uid, rep := range batch {
		rep.Problem = problems[uid]
		r.mu.Lock()
		r.seq++
		id := fmt.Sprintf("%s/%d", r.Dispatcher, r.seq)
		r.mu.Unlock()
		s := rep.Subscription
		err := r.Publisher.PublishEvent(ctx, events.DeliverySubject(s.Namespace, s.Name), events.TypeDeliveryReported, id,
			"subscription/"+s.Namespace+"/"+s.Name, rep)
		if err != nil {
			r.Log.Error(err, "publishing a delivery report; keeping it for the next one", "namespace", s.Namespace, "name", s.Name)
			r.merge(rep)
		}
	}
}

// merge adds an unpublished report back into the pending one.
func (r *Reports) merge(rep *events.DeliveryReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.entry(rep.Subscription)
	p.Delivered += rep.Delivered
	p.Failed += rep.Failed
	p.DeadLettered += rep.DeadLettered
	if p.LastDelivered == nil {
		p.LastDelivered = rep.LastDelivered
	}
	if p.LastDeadLetter == nil {
		p.LastDeadLetter = rep.LastDeadLetter
	}
}
