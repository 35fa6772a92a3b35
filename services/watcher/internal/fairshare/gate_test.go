package fairshare

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// fetchBus is a real NATS server with Headwater's streams, and the
// built-in fetchers' consumer on the fetch stream when withConsumer.
type fetchBus struct {
	conn     *bus.Conn
	consumer jetstream.Consumer
	// ids maps the message IDs the queue published to their jobs' IDs.
	mu  sync.Mutex
	ids map[string]string
}

func newFetchBus(t *testing.T, withConsumer bool) *fetchBus {
	t.Helper()
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir(), Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	conn, err := bus.Connect(t.Context(), bus.Options{URL: ns.ClientURL()}, "fairshare-test", testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if err := conn.EnsureStreams(t.Context()); err != nil {
		t.Fatal(err)
	}
	b := &fetchBus{conn: conn, ids: map[string]string{}}
	if withConsumer {
		cfg := events.Consumer(events.FetchStream, events.FetcherConsumer, events.ConsumerOptions{FilterSubjects: events.BuiltinFetchSubjects()})
		if b.consumer, err = conn.EnsureConsumer(t.Context(), events.FetchStream, cfg); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// Publish publishes on the real bus, noting the job of each message ID.
func (b *fetchBus) Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error {
	_, err := b.PublishSeq(ctx, subject, eventType, job, data)
	return err
}

// PublishSeq is Publish, returning the job's stream sequence (as the
// watcher's *bus.Publisher).
func (b *fetchBus) PublishSeq(ctx context.Context, subject, eventType string, job events.Job, data any) (uint64, error) {
	b.mu.Lock()
	b.ids[events.MessageID(job, eventType)] = job.ID
	b.mu.Unlock()
	return b.conn.NewPublisher("watcher").PublishSeq(ctx, subject, eventType, job, data)
}

// jobOf is the job ID of a message the queue published.
func (b *fetchBus) jobOf(t *testing.T, msg jetstream.Msg) string {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	id, ok := b.ids[msg.Headers().Get(jetstream.MsgIDHeader)]
	if !ok {
		t.Fatalf("a message the queue did not publish: %v", msg.Headers())
	}
	return id
}

// stored is the number of jobs on the fetch stream.
func (b *fetchBus) stored(t *testing.T) uint64 {
	t.Helper()
	s, err := b.conn.JS.Stream(context.Background(), events.FetchStream)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// pending is the consumer's undelivered jobs.
func (b *fetchBus) pending(t *testing.T) int {
	t.Helper()
	info, err := b.consumer.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int(info.NumPending)
}

func newGatedQueue(b *fetchBus, maxInFlight, backlog int) *Queue {
	return &Queue{Next: b, Backlog: ConsumerBacklog{JS: b.conn.JS},
		Options: Options{MaxInFlight: maxInFlight, Timeout: time.Hour, FetchBacklog: backlog},
		Metrics: NewMetrics(prometheus.NewRegistry())}
}

// publishAll publishes n fetch jobs of GitRepositories in ns through q,
// with IDs <ns>-0 on.
func publishAll(t *testing.T, q *Queue, ns string, n int) {
	t.Helper()
	for i := range n {
		publish(t, q, job(ns, fmt.Sprint("s", i), fmt.Sprint(ns, "-", i)))
	}
}

// TestGateKeepsTheFetchStreamShort is the wait issue 30 measured on the
// fetch stream: one namespace's many jobs due at once, another's few a
// moment later. With the gate, the big namespace's jobs beyond the first
// wait in the watcher while the stream has a job undelivered, so the
// small namespace's first job is next but one on the stream, and its
// others are taken in turn as the fetcher frees room; nothing is lost or
// published twice. A fetcher is played by the test: it takes one job at a
// time, and reports its outcome (Done).
func TestGateKeepsTheFetchStreamShort(t *testing.T) {
	const big, small, limit = 40, 4, 1
	b := newFetchBus(t, true)
	q := newGatedQueue(b, 16, limit)
	start(t, q)

	publishAll(t, q, "big", big)
	// The first job went (its namespace had none in flight); the rest
	// wait in the watcher, however many slots the namespace has. (The
	// consumer's NumPending lags a message just stored: the gate counts
	// its own jobs by their sequence, so no lagging reading lets more
	// through.)
	eventually(t, "the gate to have read the backlog", func() bool {
		return testutil.ToFloat64(q.Metrics.backlogs.WithLabelValues(events.FetcherConsumer)) == limit
	})
	const stored = limit
	if got := b.stored(t); got != stored {
		t.Fatalf("%d jobs on the fetch stream, want %d: the gate let the big namespace's through", got, stored)
	}
	// Held by the gate: those the namespace's 16 slots would have let go.
	if got := testutil.ToFloat64(q.Metrics.gateHeld); got != 15 {
		t.Errorf("jobs held by the gate = %v, want 15", got)
	}
	publishAll(t, q, "small", small)
	if got := b.stored(t); got != stored+1 {
		t.Fatalf("%d jobs on the fetch stream, want %d: the small namespace's first job passes the gate, its others wait", got, stored+1)
	}

	var order []string
	maxPending := 0
	for len(order) < big+small {
		batch, err := b.consumer.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			id := b.jobOf(t, msg)
			order = append(order, id)
			if err := msg.DoubleAck(t.Context()); err != nil {
				t.Fatal(err)
			}
			q.Done(id)
			maxPending = max(maxPending, b.pending(t))
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) || n == 0 {
			t.Fatalf("after %d jobs taken, the queue published no more: %v (taken: %v)", len(order), err, order)
		}
	}
	// On the stream: at most the limit, plus the first job of each
	// namespace that had none in flight, plus one for the pull request
	// of the test's fetcher, which the gate sees waiting.
	if bound := limit + 2 + 1; maxPending > bound {
		t.Errorf("the fetch stream held up to %d undelivered jobs, want at most %d", maxPending, bound)
	}
	seen := map[string]bool{}
	for _, id := range order {
		if seen[id] {
			t.Fatalf("job %s delivered twice: %v", id, order)
		}
		seen[id] = true
	}
	last := slices.IndexFunc(order, func(id string) bool { return id == fmt.Sprint("small-", small-1) })
	if bound := 2*small + limit + 2; last >= bound {
		t.Errorf("the small namespace's last job was the %dth taken, want among the first %d: %v", last+1, bound, order[:bound])
	}
	eventually(t, "every slot freed", func() bool { return testutil.ToFloat64(q.Metrics.inFlight) == 0 })
}

// TestGateLetsHungryFetchersThrough: a gate never holds jobs from
// fetchers that have room. A fetcher pulling 8 at a time takes all of one
// namespace's jobs, which the gate releases as fast as they are pulled,
// with its limit at 1.
func TestGateLetsHungryFetchersThrough(t *testing.T) {
	const n = 300
	b := newFetchBus(t, true)
	q := newGatedQueue(b, n, 1)
	start(t, q)
	it, err := b.consumer.Messages(jetstream.PullMaxMessages(8))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(it.Stop)
	publishAll(t, q, "ns", n)
	seen := map[string]bool{}
	for len(seen) < n {
		msg, err := it.Next(jetstream.NextMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("after %d jobs taken: %v", len(seen), err)
		}
		id := b.jobOf(t, msg)
		if seen[id] {
			t.Fatalf("job %s delivered twice", id)
		}
		seen[id] = true
		if err := msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	// Every job held a slot till now (no outcome came): the gate alone
	// paced them.
	if got := testutil.ToFloat64(q.Metrics.inFlight); got != n {
		t.Errorf("in-flight gauge = %v, want %d", got, n)
	}
}

// TestGateOpensWhenTheBacklogCannotBeRead: a gate that cannot read its
// consumer (no fetcher has made it yet; permissions without
// $JS.API.CONSUMER.INFO) lets every job through, and says so in a
// metric and a log line; it never holds jobs back for good.
func TestGateOpensWhenTheBacklogCannotBeRead(t *testing.T) {
	b := newFetchBus(t, false)
	q := newGatedQueue(b, 16, 1)
	q.Log = testr.New(t)
	start(t, q)
	publishAll(t, q, "ns", 5)
	eventually(t, "every job on the fetch stream", func() bool { return b.stored(t) == 5 })
	if got := testutil.ToFloat64(q.Metrics.readErrors); got != 1 {
		t.Errorf("backlog read errors = %v, want 1", got)
	}
}

// TestGateOff: with -fair-share-fetch-backlog 0 a namespace's jobs go on
// the bus up to its slots, backlog or not, and the backlog is never read.
func TestGateOff(t *testing.T) {
	b := newFetchBus(t, true)
	q := newGatedQueue(b, 4, 0)
	q.Backlog = failingBacklog{}
	start(t, q)
	publishAll(t, q, "ns", 6)
	if got := b.stored(t); got != 4 {
		t.Errorf("%d jobs on the fetch stream, want 4 (the slots)", got)
	}
	if got := testutil.ToFloat64(q.Metrics.gateHeld) + testutil.ToFloat64(q.Metrics.readErrors); got != 0 {
		t.Errorf("the gate held or read with its limit at 0 (%v)", got)
	}
}

// failingBacklog fails the test's queue if it is read.
type failingBacklog struct{}

func (failingBacklog) Read(context.Context, string) (Reading, error) {
	return Reading{}, errors.New("the backlog was read")
}

// TestGatePerConsumer: each fetch consumer has its own gate: a plug-in
// kind's jobs are not held back by the built-in fetchers' backlog.
func TestGatePerConsumer(t *testing.T) {
	b := newFetchBus(t, true)
	q := newGatedQueue(b, 16, 2)
	start(t, q)
	publishAll(t, q, "a", 3) // two go, the third is held
	for i := range 2 {
		plugin := events.Job{ID: fmt.Sprint("plugin-", i), Object: events.ObjectRef{Kind: "HTTPSource", Namespace: "b", Name: fmt.Sprint("h", i)}}
		if err := q.Publish(t.Context(), events.FetchSubject("HTTPSource"), events.TypeFetchRequested, plugin, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.stored(t); got != 4 {
		t.Errorf("%d jobs on the fetch stream, want 4 (two GitRepositories' and two HTTPSources')", got)
	}
	if got := testutil.ToFloat64(q.Metrics.gateHeld); got != 1 {
		t.Errorf("jobs held by the gate = %v, want 1", got)
	}
}

// TestQueueFewestInFlightFirst: of the namespaces whose jobs may go, the
// one with the fewest in flight goes first, not plain turns: a namespace
// that got few of the fetchers takes the freed slots until it has as many
// as the others.
func TestQueueFewestInFlightFirst(t *testing.T) {
	q, _ := newQueue(&recorder{}, 5, time.Hour)
	publishAll(t, q, "big", 8)   // 5 in flight, 3 waiting
	publishAll(t, q, "small", 8) // 5 in flight, 3 waiting
	for _, id := range []string{"big-0", "big-1", "big-2", "small-0", "small-1", "small-2", "small-3", "small-4"} {
		q.Done(id)
	}
	// big: 2 in flight, small: none.
	var order []string
	for {
		q.mu.Lock()
		p, _ := q.pop()
		q.mu.Unlock()
		if p == nil {
			break
		}
		order = append(order, strings.SplitN(p.job.ID, "-", 2)[0])
	}
	if want := []string{"small", "small", "big", "small", "big", "big"}; !slices.Equal(order, want) {
		t.Errorf("taken in the order %v, want %v", order, want)
	}
}

// fixedBacklog reads the same state every time, counting the readings.
type fixedBacklog struct {
	r     Reading
	mu    sync.Mutex
	reads int
}

func (f *fixedBacklog) Read(context.Context, string) (Reading, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return f.r, nil
}

// TestGateOpenWhileFetchersWait: each fetcher's pull request waiting for
// jobs counts against the backlog (the fetchers have room: a job
// published is delivered at once), so jobs go through, one per reading,
// while the backlog is below the limit plus the requests waiting; with no
// pull request waiting, the same backlog holds them.
func TestGateOpenWhileFetchersWait(t *testing.T) {
	for _, tc := range []struct {
		name    string
		waiting int
		want    int
	}{{"fetchers wait", 5, 4}, {"one waits", 1, 1}, {"none waits", 0, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			bus := &recorder{}
			backlog := &fixedBacklog{r: Reading{Pending: 5, Waiting: tc.waiting}}
			q := &Queue{Next: bus, Backlog: backlog, Options: Options{MaxInFlight: 16, Timeout: time.Hour, FetchBacklog: 1},
				Metrics: NewMetrics(prometheus.NewRegistry())}
			start(t, q)
			publishAll(t, q, "ns", 4)
			eventually(t, "the jobs the gate lets through, and a reading after", func() bool {
				backlog.mu.Lock()
				defer backlog.mu.Unlock()
				return len(bus.ids()) >= tc.want && backlog.reads >= 2
			})
			if got := len(bus.ids()); got != tc.want {
				t.Errorf("%d jobs published, want %d", got, tc.want)
			}
		})
	}
}
