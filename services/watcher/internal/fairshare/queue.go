// Package fairshare admits the watcher's fetch jobs to the bus fairly
// between namespaces (tenants): at most MaxInFlight jobs of one namespace
// are on the bus at once; the others wait in the watcher, in one queue per
// namespace, and are published round-robin across the namespaces as slots
// free. The fetch stream is first come, first served, so without this a
// namespace that makes thousands of jobs at once puts all of them ahead of
// another namespace's few (docs/design.md, "Fair share between
// namespaces").
//
// A slot is taken when a job is published and freed when its outcome
// arrives (Done), when its object is deleted (Forget), when its deadline
// passes (Timeout: an outcome lost, or a job that makes none) or when the
// watcher stops leading (Start returns): no slot outlives its job.
package fairshare

import (
	"context"
	"flag"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// Flag names, for the tools that read flags from the source.
const (
	MaxInFlightFlag = "max-jobs-in-flight-per-namespace"
	TimeoutFlag     = "fair-share-slot-timeout"
)

// DefaultMaxInFlight is the default of -max-jobs-in-flight-per-namespace:
// enough to keep every worker of a few fetcher replicas (4 jobs each) and
// packagers busy for one namespace alone, few enough that another
// namespace's first job waits behind a few seconds of work at most.
const DefaultMaxInFlight = 16

// Options are the queue's flags.
type Options struct {
	// MaxInFlight is the most jobs of one namespace on the bus at once;
	// zero or less admits every job at once (no fair share).
	MaxInFlight int
	// Timeout is how long a slot is held at most without its job's
	// outcome.
	Timeout time.Duration
	// FetchBacklog is the fetch consumer's undelivered jobs at which a
	// namespace that has jobs in flight holds its next ones (gate.go);
	// zero or less turns the gate off. It needs MaxInFlight and
	// Queue.Backlog.
	FetchBacklog int
}

// BindFlags binds the options to fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.MaxInFlight, MaxInFlightFlag, DefaultMaxInFlight,
		"Most fetch jobs of one namespace on the bus at once; the others wait in the watcher and are published round-robin across namespaces, "+
			"so that a namespace with many sources due does not delay another's (docs/design.md). 0 publishes every job at once, first come first served.")
	fs.DurationVar(&o.Timeout, TimeoutFlag, bus.DefaultJobTimeout,
		"Longest time a fetch job holds its namespace's slot without an outcome (a lost outcome, a job that reports none); "+
			"the workers' -job-timeout, from which a job that has not ended has failed.")
	fs.IntVar(&o.FetchBacklog, FetchBacklogFlag, DefaultFetchBacklog,
		"Fetch jobs left on the fetch stream undelivered at which a namespace that already has jobs in flight holds its next ones in the watcher, "+
			"published fairly as the fetchers take jobs, so that another namespace's first job is not queued behind them on the stream (docs/design.md). "+
			"0 turns the gate off (the per-namespace slots alone, and the fetch consumer's num_pending shows every job due). Needs -"+MaxInFlightFlag+" above 0.")
}

// Publisher publishes jobs on the bus (a *bus.Publisher).
type Publisher interface {
	Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error
}

// objectKey names a source: kind, namespace and name.
type objectKey struct{ kind, namespace, name string }

// pending is a job waiting for its namespace's slot, or for the fetch
// stream's backlog to fall (gate.go).
type pending struct {
	key                objectKey
	subject, eventType string
	job                events.Job
	data               any
	since              time.Time
	// consumer is the fetch consumer that takes the job, whose backlog
	// gates it.
	consumer string
	// gated is set once the gate has held the job back (it is counted
	// once).
	gated bool
	// trace is the span context of the reconcile that made the job: the
	// job's publish span is its child, whenever it is published.
	trace trace.SpanContext
}

// slot is a job on the bus.
type slot struct {
	key      objectKey
	deadline time.Time
}

// tenant is one namespace's share: its jobs on the bus and those waiting,
// first come first served, each object's at most once.
type tenant struct {
	inFlight int
	// queue holds the waiting jobs in order, and the dropped ones (those
	// no longer in byKey) until they reach its head.
	queue []*pending
	byKey map[objectKey]*pending
}

// waiting is the number of jobs waiting.
func (t *tenant) waiting() int { return len(t.byKey) }

// push adds p at the back of the queue, or at its head with front.
func (t *tenant) push(p *pending, front bool) {
	if t.byKey == nil {
		t.byKey = map[objectKey]*pending{}
	}
	t.byKey[p.key] = p
	if front {
		t.queue = append([]*pending{p}, t.queue...)
		return
	}
	t.queue = append(t.queue, p)
}

// head is the oldest waiting job, which pop takes next; nil when none
// waits. It drops the dropped jobs ahead of it.
func (t *tenant) head() *pending {
	for len(t.queue) > 0 {
		p := t.queue[0]
		if t.byKey[p.key] == p {
			return p
		}
		t.queue[0] = nil
		t.queue = t.queue[1:]
	}
	return nil
}

// pop takes the oldest waiting job; nil when none waits.
func (t *tenant) pop() *pending {
	for len(t.queue) > 0 {
		p := t.queue[0]
		t.queue[0] = nil
		t.queue = t.queue[1:]
		if t.byKey[p.key] == p {
			delete(t.byKey, p.key)
			return p
		}
	}
	return nil
}

// remove drops key's waiting job, reporting whether there was one.
func (t *tenant) remove(key objectKey) bool {
	if _, ok := t.byKey[key]; !ok {
		return false
	}
	delete(t.byKey, key)
	if len(t.byKey) == 0 {
		t.queue = nil
	}
	return true
}

// Queue admits fetch jobs fairly between namespaces. It is a manager
// Runnable that runs on the elected leader (as the reconcilers that
// publish through it): Start publishes the waiting jobs; when it returns
// (the leader stops leading) every slot is freed and every waiting job
// dropped, which the next leader makes again by reconciling every source.
// A nil *Queue, or one whose MaxInFlight is zero or less, publishes every
// job at once.
type Queue struct {
	// Next publishes the jobs admitted.
	Next Publisher
	// Options are the limits.
	Options Options
	// Metrics, when set, records the queue (NewMetrics).
	Metrics *Metrics
	// Log logs publish failures of waiting jobs.
	Log logr.Logger
	// Backlog, when set with Options.FetchBacklog, reads the fetch
	// consumers' backlog for the gate (gate.go); ConsumerBacklog in the
	// watcher.
	Backlog Backlog
	// Now returns the current time; time.Now when nil.
	Now func() time.Time

	mu sync.Mutex
	// slots are the jobs on the bus, by job ID.
	slots   map[string]*slot
	tenants map[string]*tenant
	// ring is the namespaces with waiting jobs, in turn order; next is
	// the index of the next turn.
	ring []string
	next int
	// waiting counts the jobs waiting in every namespace.
	waiting int
	wake    chan struct{}
	// gates are the fetch consumers' backlog gates, by consumer name.
	gates map[string]*gate
	// refused is the bus's answer to the last job published, while it
	// refuses them (NATS down, JetStream without quorum); nil once one
	// went through.
	refused error
}

var _ manager.Runnable = (*Queue)(nil)

// Publish publishes a fetch job at once when its namespace has a free
// slot, no job waiting and either nothing in flight or a fetch stream
// short enough (the gate), and holds it otherwise (returning nil): it is
// published when its turn comes. A job that replaces the waiting job of
// the same object takes its place in the queue. Publish passes on Next's
// error for a job it publishes.
//
// While the bus refuses jobs (the last publish failed), no job is held:
// there is no turn to wait for. Each is tried at once, replacing its
// object's waiting job, so that its source learns the bus's answer (the
// reconciler then says BusUnavailable), and the first that goes through
// ends the refusal; jobs are held again from then on.
func (q *Queue) Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error {
	if !q.enabled() {
		return q.Next.Publish(ctx, subject, eventType, job, data)
	}
	key := objectKey{job.Object.Kind, job.Object.Namespace, job.Object.Name}
	q.mu.Lock()
	q.init()
	if _, ok := q.slots[job.ID]; ok {
		// The same job again: the stream keeps one; it has its slot.
		q.mu.Unlock()
		return q.Next.Publish(ctx, subject, eventType, job, data)
	}
	t := q.tenant(key.namespace)
	p := &pending{key: key, subject: subject, eventType: eventType, job: job, data: data, since: q.now(),
		consumer: events.FetchConsumer(key.kind), trace: trace.SpanContextFromContext(ctx)}
	if q.refused != nil {
		if t.remove(key) {
			q.waiting--
			if t.waiting() == 0 {
				q.leaveRing(key.namespace)
			}
		}
		q.take(t, key, job.ID)
		q.published(p.consumer)
		q.updateGauges()
		q.mu.Unlock()
		return q.publish(ctx, p)
	}
	if w := t.byKey[key]; w != nil {
		// A newer job for the object replaces the one waiting.
		w.subject, w.eventType, w.job, w.data, w.trace = subject, eventType, job, data, p.trace
		q.mu.Unlock()
		return nil
	}
	free := t.inFlight < q.Options.MaxInFlight && t.waiting() == 0
	if free && q.passes(t, p) {
		q.take(t, key, job.ID)
		q.published(p.consumer)
		q.mu.Unlock()
		return q.publish(ctx, p)
	}
	if q.gated() && t.inFlight+t.waiting() < q.Options.MaxInFlight {
		// The slots would let it go: the gate holds it, and the
		// dispatcher reads the backlog.
		q.hold(p)
		q.signal()
	}
	t.push(p, false)
	q.waiting++
	if t.waiting() == 1 {
		q.ring = append(q.ring, key.namespace)
	}
	q.updateGauges()
	q.mu.Unlock()
	return nil
}

// publish publishes p, whose job holds a slot: a refusal frees the slot
// and is remembered (refused); a success ends the refusal.
func (q *Queue) publish(ctx context.Context, p *pending) error {
	err := q.send(ctx, p)
	q.setRefused(err)
	if err != nil {
		q.release(p.job.ID, "")
		return err
	}
	q.Metrics.admitted(0)
	return nil
}

// setRefused records the bus's answer to the last publish: err, or nil
// when it took the job.
func (q *Queue) setRefused(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.refused = err
}

// Done frees the slot of the job whose outcome arrived; a job the queue
// does not hold (another shard's, one made before this leader) frees
// nothing.
func (q *Queue) Done(jobID string) {
	if q.enabled() {
		q.release(jobID, ReleaseOutcome)
	}
}

// Forget drops the waiting job of a deleted object and frees the slots of
// its jobs on the bus.
func (q *Queue) Forget(kind, namespace, name string) {
	if !q.enabled() {
		return
	}
	key := objectKey{kind, namespace, name}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.init()
	t := q.tenants[namespace]
	if t == nil {
		return
	}
	if t.remove(key) {
		q.waiting--
		if t.waiting() == 0 {
			q.leaveRing(namespace)
		}
	}
	freed := false
	for id, s := range q.slots {
		if s.key == key {
			q.free(id, ReleaseDeleted)
			freed = true
		}
	}
	q.prune(namespace)
	q.updateGauges()
	if freed {
		q.signal()
	}
}

// Start publishes the waiting jobs as slots free, and frees the slots
// whose deadline passed, until ctx ends; it then frees every slot and
// drops every waiting job.
func (q *Queue) Start(ctx context.Context) error {
	if !q.enabled() {
		<-ctx.Done()
		return nil
	}
	q.mu.Lock()
	q.init()
	wake := q.wake
	q.mu.Unlock()
	defer q.reset()
	tick := time.NewTicker(expiryEvery(q.Options.Timeout))
	defer tick.Stop()
	// poll wakes the dispatcher when a closed gate's backlog is due to be
	// read again.
	poll := time.NewTimer(time.Hour)
	defer poll.Stop()
	for {
		q.expire()
		next, ok := q.dispatch(ctx)
		if !ok {
			return nil
		}
		poll.Stop()
		if next > 0 {
			poll.Reset(next)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-tick.C:
		case <-poll.C:
		}
	}
}

// retryDelay is how long the queue waits before publishing again after
// the bus refused a job.
const retryDelay = time.Second

// dispatch publishes waiting jobs, one per namespace in turn, while a
// namespace with waiting jobs has a free slot and the gate lets its job
// through, reading the backlog of the gates that hold jobs when due. It
// returns when the gate is next due to be read (0: no gate holds a job),
// and false when ctx ended.
func (q *Queue) dispatch(ctx context.Context) (next time.Duration, ok bool) {
	for {
		q.mu.Lock()
		p, held := q.pop()
		q.mu.Unlock()
		if p == nil {
			if len(held) == 0 {
				return 0, true
			}
			opened, next := q.readGates(ctx, held)
			if ctx.Err() != nil {
				return 0, false
			}
			if !opened {
				return next, true
			}
			continue
		}
		err := q.send(trace.ContextWithSpanContext(ctx, p.trace), p)
		q.setRefused(err)
		if err != nil {
			// The bus is unreachable: the job goes back to the head of
			// its namespace's queue, and its slot is freed.
			q.mu.Lock()
			q.requeue(p)
			q.mu.Unlock()
			q.Log.Error(err, "publishing a waiting fetch job failed; retrying", "namespace", p.key.namespace, "name", p.key.name, "kind", p.key.kind)
			select {
			case <-ctx.Done():
				return 0, false
			case <-time.After(retryDelay):
			}
			continue
		}
		q.Metrics.admitted(q.now().Sub(p.since))
	}
}

// pop takes the next turn: the oldest waiting job of the namespace with
// the fewest jobs in flight among those whose job may go (a free slot, and
// the gate passes it), the first in turn order among equals, with a slot
// taken for it. It returns nil when no namespace's job may go, with the
// consumers whose gate held a job that had a slot (held), whose backlog
// the dispatcher reads.
//
// The fewest in flight first, not plain turns: a namespace whose jobs
// came while another's filled the fetchers gets the slots the fetchers
// free until it has as many jobs in flight, rather than one in two.
func (q *Queue) pop() (p *pending, held []string) {
	best, bestAt := (*tenant)(nil), -1
	for i := range len(q.ring) {
		at := (q.next + i) % len(q.ring)
		t := q.tenants[q.ring[at]]
		if t.inFlight >= q.Options.MaxInFlight || best != nil && t.inFlight >= best.inFlight {
			continue
		}
		head := t.head()
		if head == nil {
			continue
		}
		if !q.passes(t, head) {
			q.hold(head)
			if !slices.Contains(held, head.consumer) {
				held = append(held, head.consumer)
			}
			continue
		}
		best, bestAt = t, at
	}
	if best == nil {
		return nil, held
	}
	p = best.pop()
	q.waiting--
	q.take(best, p.key, p.job.ID)
	q.published(p.consumer)
	if best.waiting() == 0 {
		q.ring = append(q.ring[:bestAt], q.ring[bestAt+1:]...)
		q.next = bestAt
	} else {
		q.next = bestAt + 1
	}
	if q.next >= len(q.ring) {
		q.next = 0
	}
	q.updateGauges()
	return p, nil
}

// requeue puts p back at the head of its namespace's queue and frees its
// slot.
func (q *Queue) requeue(p *pending) {
	q.free(p.job.ID, "")
	t := q.tenant(p.key.namespace)
	if old := t.byKey[p.key]; old != nil {
		// A newer job of the object came while p was being published:
		// it keeps its place.
		q.updateGauges()
		return
	}
	t.push(p, true)
	q.waiting++
	if t.waiting() == 1 {
		q.ring = append(q.ring, p.key.namespace)
	}
	q.updateGauges()
}

// expire frees the slots whose deadline passed.
func (q *Queue) expire() {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	for id, s := range q.slots {
		if !now.Before(s.deadline) {
			q.free(id, ReleaseDeadline)
		}
	}
	q.updateGauges()
	q.Metrics.top(q.tenants)
}

// reset frees every slot and drops every waiting job.
func (q *Queue) reset() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for id := range q.slots {
		q.free(id, ReleaseLeaderLost)
	}
	q.tenants, q.ring, q.next, q.waiting, q.gates, q.refused = map[string]*tenant{}, nil, 0, 0, map[string]*gate{}, nil
	q.updateGauges()
	q.Metrics.top(nil)
}

// release frees jobID's slot, if held, counting it under reason (none when
// empty), and wakes the dispatcher.
func (q *Queue) release(jobID, reason string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.init()
	if q.free(jobID, reason) {
		q.updateGauges()
		q.signal()
	}
}

// take gives a slot of t to the job jobID of key.
func (q *Queue) take(t *tenant, key objectKey, jobID string) {
	t.inFlight++
	q.slots[jobID] = &slot{key: key, deadline: q.now().Add(q.timeout())}
}

// free frees jobID's slot, if held, reporting whether it was.
func (q *Queue) free(jobID, reason string) bool {
	s, ok := q.slots[jobID]
	if !ok {
		return false
	}
	delete(q.slots, jobID)
	if t := q.tenants[s.key.namespace]; t != nil {
		t.inFlight--
		q.prune(s.key.namespace)
	}
	if reason != "" {
		q.Metrics.released(reason)
	}
	return true
}

// tenant is ns's share, made on first use.
func (q *Queue) tenant(ns string) *tenant {
	t := q.tenants[ns]
	if t == nil {
		t = &tenant{}
		q.tenants[ns] = t
	}
	return t
}

// prune forgets ns once it has neither a job on the bus nor one waiting,
// so the queue holds only the namespaces that are busy now.
func (q *Queue) prune(ns string) {
	t := q.tenants[ns]
	if t == nil || t.inFlight > 0 || t.waiting() > 0 {
		return
	}
	delete(q.tenants, ns)
	q.leaveRing(ns)
}

// leaveRing takes ns out of the turns, which hold the namespaces with
// waiting jobs alone.
func (q *Queue) leaveRing(ns string) {
	for i, r := range q.ring {
		if r == ns {
			q.ring = append(q.ring[:i], q.ring[i+1:]...)
			if q.next > i {
				q.next--
			}
			return
		}
	}
}

// signal wakes the dispatcher, if asleep.
func (q *Queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *Queue) init() {
	if q.slots == nil {
		q.slots, q.tenants, q.wake, q.gates = map[string]*slot{}, map[string]*tenant{}, make(chan struct{}, 1), map[string]*gate{}
	}
}

// updateGauges sets the gauges of the totals.
func (q *Queue) updateGauges() {
	q.Metrics.totals(len(q.slots), q.waiting, len(q.ring))
}

func (q *Queue) enabled() bool { return q != nil && q.Options.MaxInFlight > 0 }

func (q *Queue) timeout() time.Duration {
	if q.Options.Timeout > 0 {
		return q.Options.Timeout
	}
	return bus.DefaultJobTimeout
}

func (q *Queue) now() time.Time {
	if q.Now != nil {
		return q.Now()
	}
	return time.Now()
}

// expiryEvery is how often slots are checked against their deadline: a
// tenth of the timeout, at most a second.
func expiryEvery(timeout time.Duration) time.Duration {
	d := timeout / 10
	if d <= 0 || d > time.Second {
		return time.Second
	}
	return d
}
