package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// wait bounds every wait for something that should happen.
const wait = 15 * time.Second

// eventually polls cond until it holds or wait has passed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, wait, what, cond)
}

// eventuallyWithin polls cond until it holds or d has passed.
func eventuallyWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// testBus is an embedded NATS server with the Headwater streams and a
// connection to it.
type testBus struct {
	ns   *server.Server
	conn *bus.Conn
	pub  *bus.Publisher
}

func newTestBus(t *testing.T) *testBus {
	t.Helper()
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	conn, err := bus.Connect(context.Background(), bus.Options{URL: ns.ClientURL()}, "bus-test", testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if err := conn.EnsureStreams(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &testBus{ns: ns, conn: conn, pub: conn.NewPublisher("tester")}
}

// consumer creates a durable consumer on the publish stream.
func (b *testBus) consumer(t *testing.T, name string, o events.ConsumerOptions) jetstream.Consumer {
	t.Helper()
	c, err := b.conn.EnsureConsumer(context.Background(), events.PublishStream, events.Consumer(events.PublishStream, name, o))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func job(id string) events.Job {
	return events.Job{
		ID:          id,
		Object:      events.ObjectRef{Kind: "GitRepository", Namespace: "flux-system", Name: "podinfo", UID: "uid-1", Generation: 1},
		RequestedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

var subject = events.PublishSubject("GitRepository")

// publish publishes an Outcome of typ for a job named id on the publish stream.
func (b *testBus) publish(t *testing.T, id, typ string) {
	t.Helper()
	j := job(id)
	if err := b.pub.Publish(context.Background(), subject, typ, j, &events.Outcome{Job: j}); err != nil {
		t.Fatal(err)
	}
}

// publishRaw publishes body as is and returns its stream sequence.
func (b *testBus) publishRaw(t *testing.T, body []byte) uint64 {
	t.Helper()
	ack, err := b.conn.JS.Publish(context.Background(), subject, body)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func (b *testBus) streamMsgs(t *testing.T, name string) uint64 {
	t.Helper()
	s, err := b.conn.JS.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func consumerInfo(t *testing.T, c jetstream.Consumer) *jetstream.ConsumerInfo {
	t.Helper()
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// subscribe collects the advisories JetStream publishes on subject.
func (b *testBus) subscribe(t *testing.T, subject string) *nats.Subscription {
	t.Helper()
	sub, err := b.conn.NC.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.conn.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return sub
}

// advisory is the part of a JetStream delivery advisory the tests read.
type advisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

func nextAdvisory(t *testing.T, sub *nats.Subscription) advisory {
	t.Helper()
	m, err := sub.NextMsg(wait)
	if err != nil {
		t.Fatalf("no advisory on %s: %v", sub.Subject, err)
	}
	var a advisory
	if err := json.Unmarshal(m.Data, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// call is one handler invocation.
type call struct {
	job     string
	attempt uint64
	subject string
	typ     string
	at      time.Time
}

// recorder records handler calls.
type recorder struct {
	mu    sync.Mutex
	calls []call
}

func (r *recorder) add(m *events.Message, d bus.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call{job: events.JobOf(m.Data).ID, attempt: d.Attempt, subject: d.Subject, typ: m.Event.Type(), at: time.Now()})
}

// of returns the calls for a job.
func (r *recorder) of(jobID string) []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []call
	for _, c := range r.calls {
		if c.job == jobID {
			out = append(out, c)
		}
	}
	return out
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func attempts(cs []call) []uint64 {
	var out []uint64
	for _, c := range cs {
		out = append(out, c.attempt)
	}
	return out
}

// runWorker runs w until the returned stop is called (or the test ends);
// stop cancels the context and returns Run's error.
func runWorker(t *testing.T, w *bus.Worker) (stop func() error) {
	t.Helper()
	if w.Log.GetSink() == nil {
		w.Log = testr.New(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(wait):
				err = errors.New("Run did not return after its context was cancelled")
			}
		})
		return err
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return stop
}

// jobsTotal returns headwater_jobs_total for a type and result.
func jobsTotal(t *testing.T, reg *prometheus.Registry, typ, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != telemetry.Namespace+"_jobs_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["type"] == typ && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func TestConnectGivesUpWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// Port 1 is never a NATS server.
	if _, err := bus.Connect(ctx, bus.Options{URL: "nats://127.0.0.1:1"}, "t", testr.New(t)); err == nil {
		t.Fatal("connected to nothing")
	}
}

func TestEnsureStreams(t *testing.T) {
	b := newTestBus(t) // has called EnsureStreams once
	ctx := context.Background()
	if err := b.conn.EnsureStreams(ctx); err != nil {
		t.Fatalf("second EnsureStreams: %v", err)
	}
	if err := b.conn.Healthy(); err != nil {
		t.Errorf("Healthy: %v", err)
	}

	var got []string
	names := b.conn.JS.StreamNames(ctx)
	for n := range names.Name() {
		got = append(got, n)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	want := []string{events.DeliveryStream, events.EventStream, events.FetchStream, events.HookStream, events.PackageStream, events.PublishStream, events.SubscriptionStream}
	if !slices.Equal(got, want) {
		t.Fatalf("streams %q, want %q", got, want)
	}
	for _, cfg := range events.Streams(1) {
		s, err := b.conn.JS.Stream(ctx, cfg.Name)
		if err != nil {
			t.Fatal(err)
		}
		c := s.CachedInfo().Config
		if !slices.Equal(c.Subjects, cfg.Subjects) || c.Retention != cfg.Retention || c.Duplicates != cfg.Duplicates ||
			c.MaxAge != cfg.MaxAge || c.Storage != cfg.Storage ||
			// 0 asks for the server's default, no limit (-1).
			(cfg.MaxMsgsPerSubject != 0 && c.MaxMsgsPerSubject != cfg.MaxMsgsPerSubject) {
			t.Errorf("%s: server has %+v, want %+v", cfg.Name, c, cfg)
		}
	}

	// Consumers are created or updated, so a restart with new options works.
	cfg := events.Consumer(events.FetchStream, events.FetcherConsumer, events.ConsumerOptions{})
	if _, err := b.conn.EnsureConsumer(ctx, events.FetchStream, cfg); err != nil {
		t.Fatal(err)
	}
	cfg = events.Consumer(events.FetchStream, events.FetcherConsumer, events.ConsumerOptions{AckWait: time.Minute, MaxAckPending: 7})
	c, err := b.conn.EnsureConsumer(ctx, events.FetchStream, cfg)
	if err != nil {
		t.Fatalf("updating the consumer: %v", err)
	}
	if info := consumerInfo(t, c); info.Config.AckWait != time.Minute || info.Config.MaxAckPending != 7 {
		t.Errorf("consumer not updated: %+v", info.Config)
	}
	if _, err := b.conn.EnsureConsumer(ctx, "NO_SUCH_STREAM", cfg); err == nil {
		t.Error("consumer on a missing stream: no error")
	}

	b.ns.Shutdown()
	eventually(t, "Healthy to fail after the server stopped", func() bool { return b.conn.Healthy() != nil })
}

func TestPublisherDeduplicates(t *testing.T) {
	b := newTestBus(t)
	b.publish(t, "job-1", events.TypeFetchFailed)
	b.publish(t, "job-1", events.TypeFetchFailed)
	if n := b.streamMsgs(t, events.PublishStream); n != 1 {
		t.Fatalf("same job and type published twice: %d messages, want 1", n)
	}
	b.publish(t, "job-1", events.TypeFetchUnchanged)
	if n := b.streamMsgs(t, events.PublishStream); n != 2 {
		t.Fatalf("another type: %d messages, want 2", n)
	}
	b.publish(t, "job-2", events.TypeFetchFailed)
	if n := b.streamMsgs(t, events.PublishStream); n != 3 {
		t.Fatalf("another job: %d messages, want 3", n)
	}
	// PublishSeq tells where the message is: a duplicate's is the first's.
	for _, tc := range []struct {
		id  string
		typ string
		seq uint64
	}{{"job-1", events.TypeFetchFailed, 1}, {"job-2", events.TypeFetchFailed, 3}} {
		seq, err := b.pub.PublishSeq(context.Background(), subject, tc.typ, job(tc.id), &events.Outcome{Job: job(tc.id)})
		if err != nil || seq != tc.seq {
			t.Errorf("PublishSeq of %s again = %d, %v; want %d", tc.id, seq, err, tc.seq)
		}
	}

	// The stored message is a CloudEvent with the headers consumers use.
	s, err := b.conn.JS.Stream(context.Background(), events.PublishStream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	wantID := events.MessageID(job("job-1"), events.TypeFetchFailed)
	if got := raw.Header.Get(jetstream.MsgIDHeader); got != wantID {
		t.Errorf("message ID header %q, want %q", got, wantID)
	}
	if got := raw.Header.Get("Content-Type"); got != events.ContentType {
		t.Errorf("Content-Type %q, want %q", got, events.ContentType)
	}
	if raw.Subject != subject {
		t.Errorf("subject %q, want %q", raw.Subject, subject)
	}
	m, err := events.Decode(raw.Data)
	if err != nil {
		t.Fatal(err)
	}
	if m.Event.ID() != wantID || m.Event.Source() != "headwater/tester" || m.Event.Subject() != "gitrepository/flux-system/podinfo" {
		t.Errorf("event %s", m.Event)
	}

	if err := b.pub.Publish(context.Background(), subject, "io.headwater.nope.v1", job("job-3"), &events.Outcome{Job: job("job-3")}); err == nil {
		t.Error("unknown type: no error")
	}
	if err := b.pub.Publish(context.Background(), "headwater.nowhere", events.TypeFetchFailed, job("job-4"), &events.Outcome{Job: job("job-4")}); err == nil {
		t.Error("subject of no stream: no error")
	}
	if n := b.streamMsgs(t, events.PublishStream); n != 3 {
		t.Errorf("failed publishes stored something: %d messages", n)
	}
}

func TestWorkerAcksOnSuccess(t *testing.T) {
	b := newTestBus(t)
	cons := b.consumer(t, "ok", events.ConsumerOptions{})
	reg := prometheus.NewRegistry()
	var rec recorder
	runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Concurrency: 1,
		Metrics: telemetry.NewJobMetrics(reg, "test"),
		Handler: func(_ context.Context, m *events.Message, d bus.Delivery) error {
			rec.add(m, d)
			return nil
		},
	})
	b.publish(t, "job-1", events.TypePackaged)
	b.publish(t, "job-2", events.TypeDeleted)
	eventually(t, "both jobs handled and removed", func() bool {
		return rec.count() == 2 && b.streamMsgs(t, events.PublishStream) == 0
	})
	c := rec.of("job-1")
	if len(c) != 1 || c[0].attempt != 1 || c[0].subject != subject || c[0].typ != events.TypePackaged {
		t.Errorf("job-1 calls %+v", c)
	}
	eventually(t, "no ack pending", func() bool {
		info := consumerInfo(t, cons)
		return info.NumAckPending == 0 && info.NumPending == 0
	})
	if info := consumerInfo(t, cons); info.NumRedelivered != 0 {
		t.Errorf("%d redelivered", info.NumRedelivered)
	}
	if v := jobsTotal(t, reg, events.TypePackaged, "success"); v != 1 {
		t.Errorf("jobs_total{type=packaged,result=success} = %v, want 1", v)
	}
}

// TestWorkerRecordsConsumerState: the consumer gauges report the worker's
// consumer as a scrape finds it: messages taken and not yet acknowledged,
// then, once they are, none pending and the ack floor at the last one (a
// state is reused for telemetry.ConsumerStateMaxAge, hence the longer
// waits); once the worker stops, its consumer is no longer reported.
func TestWorkerRecordsConsumerState(t *testing.T) {
	b := newTestBus(t)
	cons := b.consumer(t, "state", events.ConsumerOptions{})
	reg := prometheus.NewRegistry()
	release := make(chan struct{})
	stop := runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Concurrency: 2,
		Metrics: telemetry.NewJobMetrics(reg, "test"),
		Handler: func(ctx context.Context, _ *events.Message, _ bus.Delivery) error {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		},
	})
	for _, id := range []string{"job-1", "job-2", "job-3"} {
		b.publish(t, id, events.TypePackaged)
	}
	gauge := func(name string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == telemetry.Namespace+"_consumer_"+name {
				for _, m := range mf.GetMetric() {
					return m.GetGauge().GetValue()
				}
			}
		}
		return -1
	}
	eventuallyWithin(t, wait+telemetry.ConsumerStateMaxAge, "two in flight, one pending", func() bool {
		return gauge("ack_pending_messages") == 2 && gauge("pending_messages") == 1 && gauge("ack_floor_sequence") == 0
	})
	close(release)
	eventuallyWithin(t, wait+telemetry.ConsumerStateMaxAge, "all acknowledged", func() bool {
		return gauge("ack_pending_messages") == 0 && gauge("pending_messages") == 0 && gauge("ack_floor_sequence") == 3 &&
			gauge("redelivered_messages") == 0
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if v := gauge("pending_messages"); v != -1 {
		t.Errorf("a stopped worker's consumer is still reported (pending %v)", v)
	}
}

func TestWorkerTerminal(t *testing.T) {
	b := newTestBus(t)
	cons := b.consumer(t, "term", events.ConsumerOptions{})
	terminated := b.subscribe(t, server.JSAdvisoryConsumerMsgTerminatedPre+"."+events.PublishStream+".term")
	reg := prometheus.NewRegistry()
	var rec recorder
	runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Concurrency: 1,
		Metrics: telemetry.NewJobMetrics(reg, "test"),
		Handler: func(_ context.Context, m *events.Message, d bus.Delivery) error {
			rec.add(m, d)
			if events.JobOf(m.Data).ID == "stalled" {
				return fmt.Errorf("handle: %w", failure.New(failure.Stalling, "FetchFailed", "URLInvalid", "invalid url"))
			}
			return nil
		},
	})
	b.publish(t, "stalled", events.TypeFetchFailed)
	if a := nextAdvisory(t, terminated); a.StreamSeq != 1 || a.Deliveries != 1 || a.Consumer != "term" {
		t.Errorf("termination advisory %+v, want stream sequence 1 on its first delivery", a)
	}
	// A message published after the termination is a barrier: once it is
	// handled, a redelivery of the terminated message would have come first.
	b.publish(t, "barrier", events.TypeFetchFailed)
	eventually(t, "the barrier handled and the stream empty", func() bool {
		return len(rec.of("barrier")) == 1 && b.streamMsgs(t, events.PublishStream) == 0
	})
	if got := attempts(rec.of("stalled")); !slices.Equal(got, []uint64{1}) {
		t.Errorf("terminated message handled on attempts %v, want only 1", got)
	}
	eventually(t, "nothing pending", func() bool {
		info := consumerInfo(t, cons)
		return info.NumAckPending == 0 && info.NumPending == 0
	})
	if info := consumerInfo(t, cons); info.NumRedelivered != 0 {
		t.Errorf("%d redelivered", info.NumRedelivered)
	}
	if v := jobsTotal(t, reg, events.TypeFetchFailed, "failed"); v != 1 {
		t.Errorf("jobs_total{result=failed} = %v, want 1", v)
	}
}

func TestWorkerMalformed(t *testing.T) {
	b := newTestBus(t)
	cons := b.consumer(t, "malformed", events.ConsumerOptions{})
	terminated := b.subscribe(t, server.JSAdvisoryConsumerMsgTerminatedPre+"."+events.PublishStream+".malformed")
	reg := prometheus.NewRegistry()
	var rec recorder
	runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Concurrency: 2,
		Metrics: telemetry.NewJobMetrics(reg, "test"),
		Handler: func(_ context.Context, m *events.Message, d bus.Delivery) error {
			rec.add(m, d)
			return nil
		},
	})
	bad := map[uint64]bool{}
	for _, body := range [][]byte{
		[]byte("not json at all"),
		[]byte(`{"specversion":"1.0","id":"x","source":"s","type":"io.unknown.v1"}`),
		nil,
	} {
		bad[b.publishRaw(t, body)] = true
	}
	b.publish(t, "good", events.TypePackaged)
	for range 3 {
		a := nextAdvisory(t, terminated)
		if !bad[a.StreamSeq] {
			t.Errorf("terminated stream sequence %d, want one of the malformed ones %v", a.StreamSeq, bad)
		}
		delete(bad, a.StreamSeq)
	}
	eventually(t, "the good message handled and the stream empty", func() bool {
		return len(rec.of("good")) == 1 && b.streamMsgs(t, events.PublishStream) == 0
	})
	if rec.count() != 1 {
		t.Errorf("handler saw %d messages, want only the valid one", rec.count())
	}
	if v := jobsTotal(t, reg, "malformed", "rejected"); v != 3 {
		t.Errorf("jobs_total{type=malformed,result=rejected} = %v, want 3", v)
	}
}

func TestWorkerHandlerMalformedError(t *testing.T) {
	b := newTestBus(t)
	cons := b.consumer(t, "hm", events.ConsumerOptions{})
	terminated := b.subscribe(t, server.JSAdvisoryConsumerMsgTerminatedPre+"."+events.PublishStream+".hm")
	var rec recorder
	runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Concurrency: 1,
		Handler: func(_ context.Context, m *events.Message, d bus.Delivery) error {
			rec.add(m, d)
			return fmt.Errorf("staging object: %w", events.ErrMalformed)
		},
	})
	b.publish(t, "bad", events.TypePackaged)
	if a := nextAdvisory(t, terminated); a.StreamSeq != 1 {
		t.Errorf("terminated %+v", a)
	}
	eventually(t, "stream empty", func() bool { return b.streamMsgs(t, events.PublishStream) == 0 })
	if got := attempts(rec.of("bad")); !slices.Equal(got, []uint64{1}) {
		t.Errorf("attempts %v, want [1]", got)
	}
}

func TestWorkerRetries(t *testing.T) {
	tests := []struct {
		name string
		err  error
		// minGap is a lower bound on the time between the two deliveries.
		minGap time.Duration
		result string
	}{
		{"waiting", &failure.Error{Handling: failure.Waiting, Reason: "NoArtifact", Err: errors.New("no artifact"), RetryAfter: 300 * time.Millisecond},
			250 * time.Millisecond, "waiting"},
		{"wrapped waiting", fmt.Errorf("fetch: %w", &failure.Error{Handling: failure.Waiting, Err: errors.New("busy"), RetryAfter: 300 * time.Millisecond}),
			250 * time.Millisecond, "waiting"},
		{"transient failure", failure.New(failure.Transient, "FetchFailed", "GitOperationFailed", "connection reset"),
			bus.Backoff(1) - 100*time.Millisecond, "retry"},
		{"platform", errors.New("connection reset"), bus.Backoff(1) - 100*time.Millisecond, "error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newTestBus(t)
			cons := b.consumer(t, "retry", events.ConsumerOptions{})
			naked := b.subscribe(t, server.JSAdvisoryConsumerMsgNakPre+"."+events.PublishStream+".retry")
			reg := prometheus.NewRegistry()
			var rec recorder
			runWorker(t, &bus.Worker{
				Service: "test", Consumer: cons, Concurrency: 1,
				Metrics: telemetry.NewJobMetrics(reg, "test"),
				Handler: func(_ context.Context, m *events.Message, d bus.Delivery) error {
					rec.add(m, d)
					if d.Attempt == 1 {
						return tc.err
					}
					return nil
				},
			})
			b.publish(t, "flaky", events.TypePackageFailed)
			if a := nextAdvisory(t, naked); a.StreamSeq != 1 || a.Deliveries != 1 {
				t.Errorf("nak advisory %+v", a)
			}
			eventually(t, "the second attempt to succeed", func() bool {
				return len(rec.of("flaky")) == 2 && b.streamMsgs(t, events.PublishStream) == 0
			})
			cs := rec.of("flaky")
			if got := attempts(cs); !slices.Equal(got, []uint64{1, 2}) {
				t.Fatalf("attempts %v, want [1 2]", got)
			}
			if gap := cs[1].at.Sub(cs[0].at); gap < tc.minGap {
				t.Errorf("redelivered after %v, want at least %v", gap, tc.minGap)
			}
			if v := jobsTotal(t, reg, events.TypePackageFailed, tc.result); v != 1 {
				t.Errorf("jobs_total{result=%s} = %v, want 1", tc.result, v)
			}
			if v := jobsTotal(t, reg, events.TypePackageFailed, "success"); v != 1 {
				t.Errorf("jobs_total{result=success} = %v, want 1", v)
			}
		})
	}
}

func TestWorkerConcurrencyBound(t *testing.T) {
	const limit, jobs = 2, 6
	b := newTestBus(t)
	cons := b.consumer(t, "bounded", events.ConsumerOptions{})
	var running, peak, handled atomic.Int32
	started := make(chan string, jobs)
	release := make(chan struct{})
	runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Concurrency: limit,
		Handler: func(ctx context.Context, m *events.Message, _ bus.Delivery) error {
			n := running.Add(1)
			defer running.Add(-1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			started <- events.JobOf(m.Data).ID
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
			handled.Add(1)
			return nil
		},
	})
	for i := range jobs {
		b.publish(t, fmt.Sprintf("job-%d", i), events.TypePackaged)
	}
	eventually(t, "two handlers running", func() bool { return running.Load() == limit })
	// With both slots busy, no third handler may start.
	select {
	case id := <-started:
		_ = id // one of the two running ones
	case <-time.After(wait):
		t.Fatal("no handler started")
	}
	<-started
	select {
	case id := <-started:
		t.Fatalf("handler for %s started while %d were running", id, limit)
	case <-time.After(300 * time.Millisecond):
	}
	for i := range jobs {
		select {
		case release <- struct{}{}:
		case <-time.After(wait):
			t.Fatalf("only %d of %d handlers ran", i, jobs)
		}
	}
	eventually(t, "every job handled and acknowledged", func() bool {
		return handled.Load() == jobs && b.streamMsgs(t, events.PublishStream) == 0
	})
	if p := peak.Load(); p != limit {
		t.Errorf("at most %d handlers ran at once, want exactly %d", p, limit)
	}
}

func TestWorkerHeartbeat(t *testing.T) {
	const work = 2500 * time.Millisecond
	tests := []struct {
		name      string
		heartbeat time.Duration
		// redelivered says whether the job is expected to be handed out
		// again while its first attempt is still running.
		redelivered bool
	}{
		{"in progress keeps the job", 200 * time.Millisecond, false},
		// The control: without a heartbeat within AckWait, JetStream does
		// redeliver, so the case above tests something.
		{"silence loses the job", time.Minute, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newTestBus(t)
			cons := b.consumer(t, "slow", events.ConsumerOptions{AckWait: time.Second})
			var rec recorder
			firstDone := make(chan struct{})
			runWorker(t, &bus.Worker{
				Service: "test", Consumer: cons, Concurrency: 2, Heartbeat: tc.heartbeat,
				Handler: func(ctx context.Context, m *events.Message, d bus.Delivery) error {
					rec.add(m, d)
					if d.Attempt > 1 {
						return nil
					}
					defer close(firstDone)
					// Simulated long work, e.g. a slow clone.
					select {
					case <-time.After(work):
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				},
			})
			b.publish(t, "slow", events.TypePackaged)
			select {
			case <-firstDone:
			case <-time.After(wait):
				t.Fatal("the first attempt did not finish")
			}
			eventually(t, "the stream to be empty", func() bool { return b.streamMsgs(t, events.PublishStream) == 0 })
			got := attempts(rec.of("slow"))
			if tc.redelivered {
				if len(got) < 2 {
					t.Fatalf("attempts %v: a silent 2.5s handler with AckWait 1s was not redelivered", got)
				}
				return
			}
			if !slices.Equal(got, []uint64{1}) {
				t.Fatalf("attempts %v, want only [1]: the heartbeat did not hold the job", got)
			}
			eventually(t, "nothing pending", func() bool { return consumerInfo(t, cons).NumAckPending == 0 })
			if info := consumerInfo(t, cons); info.NumRedelivered != 0 {
				t.Errorf("%d redelivered", info.NumRedelivered)
			}
		})
	}
}

func TestWorkerShutdown(t *testing.T) {
	b := newTestBus(t)
	cons := b.consumer(t, "shutdown", events.ConsumerOptions{})
	started := make(chan struct{})
	sawCancel := make(chan struct{})
	release := make(chan struct{})
	var finished atomic.Bool
	stop := runWorker(t, &bus.Worker{
		// A free slot, so Run is waiting for a message, not for a slot,
		// when it is told to stop.
		Service: "test", Consumer: cons, Concurrency: 2,
		Handler: func(ctx context.Context, _ *events.Message, _ bus.Delivery) error {
			close(started)
			<-ctx.Done()
			close(sawCancel)
			<-release
			finished.Store(true)
			return fmt.Errorf("clone: %w", ctx.Err())
		},
	})
	b.publish(t, "in-flight", events.TypePackaged)
	select {
	case <-started:
	case <-time.After(wait):
		t.Fatal("handler not started")
	}

	runErr := make(chan error, 1)
	go func() { runErr <- stop() }()
	select {
	case <-sawCancel:
	case <-time.After(wait):
		t.Fatal("the handler's context was not cancelled")
	}
	select {
	case err := <-runErr:
		t.Fatalf("Run returned (%v) while a handler was in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("Run: %v, want nil after cancellation", err)
		}
	case <-time.After(wait):
		t.Fatal("Run did not return")
	}
	if !finished.Load() {
		t.Fatal("Run returned before its handler finished")
	}

	// The interrupted job was handed back at once: a new worker gets it.
	var rec recorder
	runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Concurrency: 1,
		Handler: func(_ context.Context, m *events.Message, d bus.Delivery) error {
			rec.add(m, d)
			return nil
		},
	})
	eventually(t, "the job handled again", func() bool {
		return len(rec.of("in-flight")) == 1 && b.streamMsgs(t, events.PublishStream) == 0
	})
	if got := attempts(rec.of("in-flight")); !slices.Equal(got, []uint64{2}) {
		t.Errorf("attempts %v after the restart, want [2]", got)
	}
}

func TestWorkerRunStopsAtOnceWhenIdle(t *testing.T) {
	b := newTestBus(t)
	cons := b.consumer(t, "idle", events.ConsumerOptions{})
	stop := runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Concurrency: 3,
		Handler: func(context.Context, *events.Message, bus.Delivery) error { return nil },
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}

	// A context cancelled before Run starts.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := &bus.Worker{Service: "test", Consumer: cons, Log: testr.New(t),
		Handler: func(context.Context, *events.Message, bus.Delivery) error { return nil }}
	if err := w.Run(ctx); err != nil {
		t.Fatalf("Run with a cancelled context: %v", err)
	}
}

func TestBackoff(t *testing.T) {
	tests := []struct {
		attempt uint64
		want    time.Duration
	}{
		{0, time.Second},
		{1, time.Second},
		{2, 2 * time.Second},
		{3, 4 * time.Second},
		{4, 8 * time.Second},
		{7, 64 * time.Second},
		{8, 2 * time.Minute},
		{9, 2 * time.Minute},
		{64, 2 * time.Minute},
		{1 << 63, 2 * time.Minute},
		{^uint64(0), 2 * time.Minute},
	}
	for _, tc := range tests {
		if got := bus.Backoff(tc.attempt); got != tc.want {
			t.Errorf("Backoff(%d) = %v, want %v", tc.attempt, got, tc.want)
		}
	}
	for a := uint64(1); a < 20; a++ {
		if bus.Backoff(a+1) < bus.Backoff(a) {
			t.Errorf("Backoff(%d) < Backoff(%d)", a+1, a)
		}
	}
}

// TestWorkerAttemptsAndReports checks that the worker alone decides
// retries: a failure is reported on every attempt it happens on, a
// transient one is retried until the consumer's MaxDeliver, and the last
// attempt, a final or a stalling failure and a platform error on the last
// attempt are terminated.
func TestWorkerAttemptsAndReports(t *testing.T) {
	transient := failure.New(failure.Transient, "FetchFailed", "GitOperationFailed", "connection reset")
	tests := []struct {
		name string
		err  error
		// attempts the handler sees, and whether each was the last.
		attempts []uint64
		last     []bool
		reports  int
		// retrying is what each report says of the bus trying again.
		retrying []bool
		result   string
	}{
		{"transient until the last attempt", transient, []uint64{1, 2, 3}, []bool{false, false, true}, 3, []bool{true, true, false}, "failed"},
		{"final", failure.New(failure.Final, "StorageOperationFailed", "ArchiveOperationFailed", "file too large"),
			[]uint64{1}, []bool{false}, 1, []bool{false}, "failed"},
		{"stalling", failure.New(failure.Stalling, "FetchFailed", "URLInvalid", "invalid url"), []uint64{1}, []bool{false}, 1, []bool{false}, "failed"},
		{"platform", errors.New("storage unreachable"), []uint64{1, 2, 3}, []bool{false, false, true}, 0, nil, "dropped"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newTestBus(t)
			cons := b.consumer(t, "bounded", events.ConsumerOptions{MaxDeliver: 3})
			terminated := b.subscribe(t, server.JSAdvisoryConsumerMsgTerminatedPre+"."+events.PublishStream+".bounded")
			reg := prometheus.NewRegistry()
			var rec recorder
			var mu sync.Mutex
			var lasts []bool
			var reported []*failure.Error
			var retrying []bool
			runWorker(t, &bus.Worker{
				Service: "test", Consumer: cons, Concurrency: 1,
				Metrics: telemetry.NewJobMetrics(reg, "test"),
				Handler: func(_ context.Context, m *events.Message, d bus.Delivery) error {
					rec.add(m, d)
					mu.Lock()
					lasts = append(lasts, d.Last)
					mu.Unlock()
					return fmt.Errorf("handle: %w", tc.err)
				},
				Report: func(_ context.Context, m *events.Message, f *failure.Error) error {
					mu.Lock()
					defer mu.Unlock()
					reported = append(reported, f)
					retrying = append(retrying, f.Data().Retrying)
					return nil
				},
			})
			b.publish(t, "failing", events.TypeFetchFailed)
			a := nextAdvisory(t, terminated)
			if a.Deliveries != uint64(len(tc.attempts)) {
				t.Errorf("terminated on delivery %d, want %d", a.Deliveries, len(tc.attempts))
			}
			eventually(t, "the stream empty", func() bool { return b.streamMsgs(t, events.PublishStream) == 0 })
			if got := attempts(rec.of("failing")); !slices.Equal(got, tc.attempts) {
				t.Errorf("attempts %v, want %v", got, tc.attempts)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(lasts, tc.last) {
				t.Errorf("Delivery.Last %v, want %v", lasts, tc.last)
			}
			if len(reported) != tc.reports {
				t.Errorf("%d reports, want %d", len(reported), tc.reports)
			}
			if !slices.Equal(retrying, tc.retrying) {
				t.Errorf("reports say retrying %v, want %v", retrying, tc.retrying)
			}
			for _, f := range reported {
				if !errors.Is(tc.err, f) {
					t.Errorf("reported %v, want the handler's failure %v", f, tc.err)
				}
			}
			eventually(t, "the job counted as "+tc.result, func() bool {
				return jobsTotal(t, reg, events.TypeFetchFailed, tc.result) == 1
			})
		})
	}
}

// TestWorkerReportFailureRetries checks that a failure that cannot be
// reported is not lost: the message is delivered again.
func TestWorkerReportFailureRetries(t *testing.T) {
	b := newTestBus(t)
	cons := b.consumer(t, "report", events.ConsumerOptions{})
	var rec recorder
	var reports atomic.Int32
	runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Concurrency: 1,
		Handler: func(_ context.Context, m *events.Message, d bus.Delivery) error {
			rec.add(m, d)
			return failure.New(failure.Stalling, "FetchFailed", "URLInvalid", "invalid url")
		},
		Report: func(context.Context, *events.Message, *failure.Error) error {
			if reports.Add(1) == 1 {
				return errors.New("bus unreachable")
			}
			return nil
		},
	})
	b.publish(t, "unreported", events.TypeFetchFailed)
	eventually(t, "the failure reported on the second attempt", func() bool {
		return reports.Load() == 2 && b.streamMsgs(t, events.PublishStream) == 0
	})
	if got := attempts(rec.of("unreported")); !slices.Equal(got, []uint64{1, 2}) {
		t.Errorf("attempts %v, want [1 2]", got)
	}
}

// TestWorkerRejoinsAfterNATSRestart: a work queue's consumer keeps its
// state in memory, so a NATS server restarted on the same store has the
// stream and its messages but not the consumer; the worker notices the
// reconnection (Conn), creates its consumer again (Rejoin) at once, well
// before two missed heartbeats would tell it, and handles the jobs
// published after the restart. A consumer of a former release, with
// its state on disk, is replaced the same way when the service joins.
func TestWorkerRejoinsAfterNATSRestart(t *testing.T) {
	store := t.TempDir()
	ns, err := natsserver.Start(natsserver.Options{StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	port := ns.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	ctx := context.Background()
	conn, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "bus-test", testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	pub := conn.NewPublisher("tester")

	// A consumer as a former release made it, state on disk, is replaced.
	if err := conn.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	old := events.Consumer(events.PublishStream, "rejoin", events.ConsumerOptions{})
	old.MemoryStorage = false
	if _, err := conn.JS.CreateOrUpdateConsumer(ctx, events.PublishStream, old); err != nil {
		t.Fatal(err)
	}
	join := conn.Joiner(events.PublishStream, "rejoin", events.ConsumerOptions{})
	cons, err := join(ctx)
	if err != nil {
		t.Fatalf("joining over a consumer with its state on disk: %v", err)
	}
	if info := consumerInfo(t, cons); !info.Config.MemoryStorage {
		t.Fatal("the work queue's consumer keeps its state on disk")
	}

	// The worker creates the consumer again only when JetStream says it
	// does not know it: each call is a consumer found lost.
	var rejoins atomic.Int32
	rejoin := func(ctx context.Context) (jetstream.Consumer, error) {
		rejoins.Add(1)
		return join(ctx)
	}
	var rec recorder
	runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Rejoin: rejoin, Conn: conn, Concurrency: 1,
		Handler: func(_ context.Context, m *events.Message, d bus.Delivery) error {
			rec.add(m, d)
			return nil
		},
	})
	publish := func(id string) {
		t.Helper()
		deadline := time.Now().Add(wait)
		for {
			err := pub.Publish(ctx, subject, events.TypePackaged, job(id), &events.Outcome{Job: job(id)})
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("publish %s: %v", id, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	publish("before")
	eventually(t, "the job before the restart handled and removed", func() bool {
		info, err := conn.JS.Stream(ctx, events.PublishStream)
		return len(rec.of("before")) == 1 && err == nil && info.CachedInfo().State.Msgs == 0
	})

	ns.Shutdown()
	ns.WaitForShutdown()
	ns, err = natsserver.Start(natsserver.Options{StoreDir: store, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	// Its state was in memory: the restart lost it, and the worker finds
	// it lost at the reconnection (a lookup by the test races the
	// worker's, which may already have created it again).
	eventually(t, "the worker finding its consumer lost after the restart", func() bool { return rejoins.Load() > 0 })
	publish("after")
	// At the reconnection, not after two missed heartbeats (30 s).
	deadline := time.Now().Add(wait)
	for len(rec.of("after")) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the job published after the restart was not handled: the consumer was not created again")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := len(rec.of("before")); n != 1 {
		t.Errorf("the job acknowledged before the restart was handled %d times", n)
	}
}

// TestWorkerRefusesMisroutedJob: a result for another kind's job on a
// kind's subject (what a plug-in fetcher, allowed only its own kind's
// subjects, would have to publish to answer for a GitRepository) is
// terminated before the handler sees it and counted as rejected.
func TestWorkerRefusesMisroutedJob(t *testing.T) {
	b := newTestBus(t)
	cons := b.consumer(t, "misrouted", events.ConsumerOptions{})
	terminated := b.subscribe(t, server.JSAdvisoryConsumerMsgTerminatedPre+"."+events.PublishStream+".misrouted")
	reg := prometheus.NewRegistry()
	var rec recorder
	runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Concurrency: 1,
		Metrics: telemetry.NewJobMetrics(reg, "test"),
		Handler: func(_ context.Context, m *events.Message, d bus.Delivery) error {
			rec.add(m, d)
			return nil
		},
	})
	forged := job("forged") // a GitRepository's
	if err := b.pub.Publish(context.Background(), events.PublishSubject("HTTPSource"), events.TypePackaged, forged,
		&events.Outcome{Job: forged}); err != nil {
		t.Fatal(err)
	}
	b.publish(t, "good", events.TypePackaged)
	if a := nextAdvisory(t, terminated); a.StreamSeq != 1 {
		t.Errorf("terminated %+v, want the misrouted job", a)
	}
	eventually(t, "the good message handled", func() bool { return len(rec.of("good")) == 1 })
	if n := len(rec.of("forged")); n != 0 {
		t.Errorf("the handler saw the misrouted job %d times", n)
	}
	if v := jobsTotal(t, reg, events.TypePackaged, "rejected"); v != 1 {
		t.Errorf("jobs_total{result=rejected} = %v, want 1", v)
	}
}
