package fairshare

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/trace"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// recorder is the bus as the queue sees it: it records the jobs published,
// in order, and fails while fail is set.
type recorder struct {
	mu        sync.Mutex
	published []events.Job
	// traces are the span contexts the jobs were published within.
	traces   []trace.SpanContext
	fail     error
	attempts int
	// notify, when set, is signalled after every job published.
	notify chan struct{}
}

func (r *recorder) Publish(ctx context.Context, _, _ string, job events.Job, _ any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts++
	if r.fail != nil {
		return r.fail
	}
	r.published = append(r.published, job)
	r.traces = append(r.traces, trace.SpanContextFromContext(ctx))
	if r.notify != nil {
		select {
		case r.notify <- struct{}{}:
		default:
		}
	}
	return nil
}

func (r *recorder) jobs() []events.Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.published)
}

// at is the ID of the i-th job published, and whether there is one.
func (r *recorder) at(i int) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i >= len(r.published) {
		return "", false
	}
	return r.published[i].ID, true
}

func (r *recorder) ids() []string {
	var ids []string
	for _, j := range r.jobs() {
		ids = append(ids, j.ID)
	}
	return ids
}

func (r *recorder) setFail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = err
}

// job is a fetch job of the GitRepository ns/name with the given ID.
func job(ns, name, id string) events.Job {
	return events.Job{ID: id, Object: events.ObjectRef{Kind: "GitRepository", Namespace: ns, Name: name}}
}

// publish publishes j through q, failing the test on an error.
func publish(t *testing.T, q *Queue, j events.Job) {
	t.Helper()
	if err := q.Publish(t.Context(), "headwater.jobs.fetch.gitrepository", events.TypeFetchRequested, j, nil); err != nil {
		t.Fatalf("publish %s: %v", j.ID, err)
	}
}

// eventually polls cond until it holds, failing the test after 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// start runs q until the test ends, and returns a function that stops it
// and waits for Start to return.
func start(t *testing.T, q *Queue) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- q.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Start: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func newQueue(bus *recorder, maxInFlight int, timeout time.Duration) (*Queue, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	return &Queue{Next: bus, Options: Options{MaxInFlight: maxInFlight, Timeout: timeout}, Metrics: NewMetrics(reg)}, reg
}

// TestQueueAdmitsUpToTheLimit: a namespace's first MaxInFlight jobs are
// published at once, the rest when an outcome frees a slot, in the order
// they came; another namespace's are not held by the first's.
func TestQueueAdmitsUpToTheLimit(t *testing.T) {
	bus := &recorder{}
	q, _ := newQueue(bus, 2, time.Hour)
	start(t, q)
	for i := range 5 {
		publish(t, q, job("big", fmt.Sprint("s", i), fmt.Sprint("big-", i)))
	}
	if got, want := bus.ids(), []string{"big-0", "big-1"}; !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
	publish(t, q, job("small", "s0", "small-0"))
	if got := bus.ids(); len(got) != 3 || got[2] != "small-0" {
		t.Fatalf("published %v, want small-0 at once (its namespace has a free slot)", got)
	}
	if got := testutil.ToFloat64(q.Metrics.waiting); got != 3 {
		t.Errorf("waiting jobs gauge = %v, want 3", got)
	}
	q.Done("big-0")
	eventually(t, "big-2 published after big-0's outcome", func() bool { return len(bus.ids()) == 4 })
	q.Done("big-1")
	q.Done("big-2")
	eventually(t, "big-3 and big-4 published", func() bool { return len(bus.ids()) == 6 })
	if got, want := bus.ids(), []string{"big-0", "big-1", "small-0", "big-2", "big-3", "big-4"}; !slices.Equal(got, want) {
		t.Errorf("published %v, want %v", got, want)
	}
	// Outcomes of jobs the queue does not hold (another shard's, an
	// earlier leader's) free nothing.
	q.Done("someone-else")
	q.Done("big-0")
	publish(t, q, job("big", "s5", "big-5"))
	if got := len(bus.ids()); got != 6 {
		t.Errorf("big-5 published with both of its namespace's slots taken (%d published)", got)
	}
	if got := testutil.ToFloat64(q.Metrics.releases.WithLabelValues(ReleaseOutcome)); got != 3 {
		t.Errorf("slots released on outcome = %v, want 3", got)
	}
}

// TestQueueFloodingTenant is the bad input of issue 30: one namespace makes
// 50,000 jobs at once, then another makes 10. The second's are published
// in turn with the first's (round-robin), not behind them; every job is
// published exactly once and nothing is lost. The "fetchers" take the
// published jobs first come, first served and report each outcome.
func TestQueueFloodingTenant(t *testing.T) {
	const big, small, limit = 50000, 10, 4
	bus := &recorder{notify: make(chan struct{}, 1)}
	q, _ := newQueue(bus, limit, time.Hour)
	start(t, q)
	for i := range big {
		publish(t, q, job("big", fmt.Sprint("b", i), fmt.Sprint("big-", i)))
	}
	if got := len(bus.ids()); got != limit {
		t.Fatalf("%d of the big tenant's jobs published at once, want %d", got, limit)
	}
	for i := range small {
		publish(t, q, job("small", fmt.Sprint("s", i), fmt.Sprint("small-", i)))
	}
	// The fetchers: take each published job in order, report its outcome.
	for done := 0; done < big+small; done++ {
		id, ok := bus.at(done)
		for !ok {
			select {
			case <-bus.notify:
			case <-time.After(10 * time.Second):
				t.Fatalf("job %d not published: the queue stalled", done+1)
			}
			id, ok = bus.at(done)
		}
		q.Done(id)
	}
	ids := bus.ids()
	if len(ids) != big+small {
		t.Fatalf("%d jobs published, want %d", len(ids), big+small)
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("job %s published twice", id)
		}
		seen[id] = true
	}
	// The small tenant's jobs were published with the first ones: behind
	// the big tenant's jobs already on the bus (limit) and one of the big
	// tenant's per turn.
	last := slices.Index(ids, fmt.Sprint("small-", small-1))
	if bound := limit + 2*small; last >= bound {
		t.Errorf("the small tenant's last job was the %dth published, want among the first %d", last+1, bound)
	}
	for i := range small - 1 {
		if slices.Index(ids, fmt.Sprint("small-", i)) > slices.Index(ids, fmt.Sprint("small-", i+1)) {
			t.Errorf("small-%d published after small-%d: a namespace's jobs keep their order", i, i+1)
		}
	}
	if got := testutil.ToFloat64(q.Metrics.waiting); got != 0 {
		t.Errorf("waiting jobs gauge = %v at the end, want 0", got)
	}
}

// TestQueueDeadline: a slot whose outcome never comes is freed when its
// deadline passes, and the namespace's next job is published.
func TestQueueDeadline(t *testing.T) {
	bus := &recorder{}
	q, _ := newQueue(bus, 1, 50*time.Millisecond)
	start(t, q)
	publish(t, q, job("ns", "a", "a-1"))
	publish(t, q, job("ns", "b", "b-1"))
	eventually(t, "b-1 published once a-1's deadline passed", func() bool { return len(bus.ids()) == 2 })
	eventually(t, "a slot released on its deadline", func() bool {
		return testutil.ToFloat64(q.Metrics.releases.WithLabelValues(ReleaseDeadline)) >= 1
	})
	eventually(t, "every slot released", func() bool { return testutil.ToFloat64(q.Metrics.inFlight) == 0 })
}

// TestQueueForget: deleting an object frees the slot of its job on the bus
// (the next job of its namespace is published) and drops its waiting job.
func TestQueueForget(t *testing.T) {
	bus := &recorder{}
	q, _ := newQueue(bus, 1, time.Hour)
	start(t, q)
	publish(t, q, job("ns", "a", "a-1"))
	publish(t, q, job("ns", "b", "b-1"))
	publish(t, q, job("ns", "c", "c-1"))
	q.Forget("GitRepository", "ns", "b") // waiting: dropped
	q.Forget("GitRepository", "ns", "a") // on the bus: its slot is freed
	eventually(t, "c-1 published once a was deleted", func() bool { return len(bus.ids()) == 2 })
	if got, want := bus.ids(), []string{"a-1", "c-1"}; !slices.Equal(got, want) {
		t.Errorf("published %v, want %v (b was deleted while waiting)", got, want)
	}
	if got := testutil.ToFloat64(q.Metrics.releases.WithLabelValues(ReleaseDeleted)); got != 1 {
		t.Errorf("slots released on deletion = %v, want 1", got)
	}
	// An unknown object, or one of a namespace the queue never saw.
	q.Forget("GitRepository", "ns", "zz")
	q.Forget("GitRepository", "elsewhere", "a")
}

// TestQueueLeaderLost: when the watcher stops leading, every slot is freed
// and the waiting jobs are dropped (the next leader makes them again); a
// queue started again admits as a new one.
func TestQueueLeaderLost(t *testing.T) {
	bus := &recorder{}
	q, _ := newQueue(bus, 1, time.Hour)
	stop := start(t, q)
	publish(t, q, job("ns", "a", "a-1"))
	publish(t, q, job("ns", "b", "b-1"))
	stop()
	if got := testutil.ToFloat64(q.Metrics.releases.WithLabelValues(ReleaseLeaderLost)); got != 1 {
		t.Errorf("slots released on leader loss = %v, want 1", got)
	}
	if got := testutil.ToFloat64(q.Metrics.waiting) + testutil.ToFloat64(q.Metrics.inFlight); got != 0 {
		t.Errorf("waiting and in-flight gauges sum to %v after leader loss, want 0", got)
	}
	start(t, q)
	publish(t, q, job("ns", "b", "b-2"))
	if got, want := bus.ids(), []string{"a-1", "b-2"}; !slices.Equal(got, want) {
		t.Errorf("published %v, want %v (b-1 dropped, b-2 admitted at once by the new leader)", got, want)
	}
}

// TestQueueReplacesWaitingJob: a newer job of an object whose job waits
// takes its place; the same job published again (a retry of Publish) takes
// no second slot.
func TestQueueReplacesWaitingJob(t *testing.T) {
	bus := &recorder{}
	q, _ := newQueue(bus, 1, time.Hour)
	start(t, q)
	publish(t, q, job("ns", "a", "a-1"))
	publish(t, q, job("ns", "b", "b-1"))
	publish(t, q, job("ns", "c", "c-1"))
	publish(t, q, job("ns", "b", "b-2"))
	publish(t, q, job("ns", "a", "a-1")) // again: passed on, no new slot
	if got, want := bus.ids(), []string{"a-1", "a-1"}; !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
	q.Done("a-1")
	eventually(t, "b-2 published", func() bool { return len(bus.ids()) == 3 })
	q.Done("b-2")
	eventually(t, "c-1 published", func() bool { return len(bus.ids()) == 4 })
	if got, want := bus.ids(), []string{"a-1", "a-1", "b-2", "c-1"}; !slices.Equal(got, want) {
		t.Errorf("published %v, want %v (b-2 in b-1's place)", got, want)
	}
}

// TestQueuePublishFailure: a job the bus refuses frees its slot; published
// at once, the error goes to the caller (the reconcile retries); waiting,
// it goes back to the head of its queue and is published once the bus
// takes it.
func TestQueuePublishFailure(t *testing.T) {
	bus := &recorder{}
	q, _ := newQueue(bus, 1, time.Hour)
	start(t, q)
	refused := errors.New("bus down")
	bus.setFail(refused)
	if err := q.Publish(t.Context(), "s", "t", job("ns", "a", "a-1"), nil); !errors.Is(err, refused) {
		t.Fatalf("Publish = %v, want %v", err, refused)
	}
	bus.setFail(nil)
	publish(t, q, job("ns", "b", "b-1")) // the refused job's slot is free
	publish(t, q, job("ns", "c", "c-1"))
	bus.setFail(refused)
	q.Done("b-1")
	// The dispatcher fails to publish c-1, and tries again.
	eventually(t, "the dispatcher's attempt at c-1", func() bool {
		bus.mu.Lock()
		defer bus.mu.Unlock()
		return bus.attempts >= 3
	})
	bus.setFail(nil)
	eventually(t, "c-1 published once the bus takes it", func() bool { return len(bus.ids()) == 2 })
	if got, want := bus.ids(), []string{"b-1", "c-1"}; !slices.Equal(got, want) {
		t.Errorf("published %v, want %v", got, want)
	}
}

// TestQueueRefusedNotHeld: once the bus refused a job, no job is held
// (its source must learn the refusal and say so): each is tried at once,
// replacing its object's waiting job, until one goes through; then jobs
// wait for their turn again.
func TestQueueRefusedNotHeld(t *testing.T) {
	bus := &recorder{}
	q, _ := newQueue(bus, 1, time.Hour)
	start(t, q)
	publish(t, q, job("ns", "a", "a-1")) // its outcome does not come: the slot stays taken
	publish(t, q, job("ns", "b", "b-1")) // held
	refused := errors.New("nats: no responders available for request")
	bus.setFail(refused)
	// Another namespace's job meets the refusal.
	if err := q.Publish(t.Context(), "s", "t", job("other", "x", "x-1"), nil); !errors.Is(err, refused) {
		t.Fatalf("Publish x-1 = %v, want %v", err, refused)
	}
	// b's next job is not held behind a-1: it is tried, and refused.
	if err := q.Publish(t.Context(), "s", "t", job("ns", "b", "b-2"), nil); !errors.Is(err, refused) {
		t.Fatalf("Publish b-2 while the bus refuses = %v, want %v", err, refused)
	}
	bus.setFail(nil)
	// The first job through ends the refusal, over the limit.
	publish(t, q, job("ns", "c", "c-1"))
	publish(t, q, job("ns", "d", "d-1")) // held again
	if got, want := bus.ids(), []string{"a-1", "c-1"}; !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v (d-1 waiting, b-1 replaced)", got, want)
	}
	q.Done("a-1")
	q.Done("c-1")
	eventually(t, "d-1 published in its turn", func() bool { return len(bus.ids()) == 3 })
	if got, want := bus.ids(), []string{"a-1", "c-1", "d-1"}; !slices.Equal(got, want) {
		t.Errorf("published %v, want %v: b-1 was replaced by b-2, which the bus refused", got, want)
	}
}

// TestQueueDisabled: with no limit (or a nil queue) every job is published
// at once, and Done and Forget do nothing.
func TestQueueDisabled(t *testing.T) {
	bus := &recorder{}
	q := &Queue{Next: bus}
	for i := range 100 {
		publish(t, q, job("ns", fmt.Sprint("s", i), fmt.Sprint("j-", i)))
	}
	q.Done("j-0")
	q.Forget("GitRepository", "ns", "s1")
	if got := len(bus.ids()); got != 100 {
		t.Errorf("%d jobs published, want 100", got)
	}
	var none *Queue
	none.Done("x")
	none.Forget("GitRepository", "ns", "x")
}

// TestQueueTopNamespaces: the per-namespace gauge names the busiest
// namespaces alone, however many wait.
func TestQueueTopNamespaces(t *testing.T) {
	bus := &recorder{}
	q, _ := newQueue(bus, 1, time.Hour)
	for n := range 20 {
		for i := range n + 2 {
			publish(t, q, job(fmt.Sprint("ns-", n), fmt.Sprint("s", i), fmt.Sprintf("%d-%d", n, i)))
		}
	}
	// Started after the jobs came, so its first update sees them all.
	start(t, q)
	eventually(t, "the top namespaces exported", func() bool { return testutil.CollectAndCount(q.Metrics.topWaiting) == TopNamespaces })
	if got := testutil.ToFloat64(q.Metrics.topWaiting.WithLabelValues("ns-19")); got != 20 {
		t.Errorf("top waiting of ns-19 = %v, want 20", got)
	}
	if got := testutil.ToFloat64(q.Metrics.namespaces); got != 20 {
		t.Errorf("waiting namespaces = %v, want 20", got)
	}
}

// TestQueueKeepsTheTrace: a job that waited is published in the trace of
// the reconcile that made it (issue 30's one trace per change), not in a
// trace of its own.
func TestQueueKeepsTheTrace(t *testing.T) {
	bus := &recorder{}
	q, _ := newQueue(bus, 1, time.Hour)
	start(t, q)
	publish(t, q, job("ns", "a", "a-1"))
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled})
	if err := q.Publish(trace.ContextWithSpanContext(t.Context(), sc), "s", events.TypeFetchRequested, job("ns", "b", "b-1"), nil); err != nil {
		t.Fatal(err)
	}
	q.Done("a-1")
	eventually(t, "b-1 published", func() bool { return len(bus.ids()) == 2 })
	bus.mu.Lock()
	defer bus.mu.Unlock()
	if got := bus.traces[1]; got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() {
		t.Errorf("b-1 published in span %s/%s, want its reconcile's %s/%s", got.TraceID(), got.SpanID(), sc.TraceID(), sc.SpanID())
	}
}
