package dispatch

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/services/dispatcher/internal/deliver"
	"github.com/headwater-gitops/headwater/services/dispatcher/internal/filter"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// recorder is an EventPublisher that keeps the reports.
type recorder struct {
	mu      sync.Mutex
	reports []events.DeliveryReport
}

func (r *recorder) PublishEvent(_ context.Context, subject, eventType, _, _ string, data any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reports = append(r.reports, *data.(*events.DeliveryReport))
	return nil
}

// sum adds up the reports so far.
func (r *recorder) sum() (total events.DeliveryReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rep := range r.reports {
		total.Delivered += rep.Delivered
		total.Failed += rep.Failed
		total.DeadLettered += rep.DeadLettered
		if rep.LastDeadLetter != nil {
			total.LastDeadLetter = rep.LastDeadLetter
		}
	}
	return total
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

type testEnv struct {
	conn    *bus.Conn
	d       *Dispatcher
	reports *recorder
	reg     *prometheus.Registry
}

func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "dispatch-test", testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	reports := &Reports{Publisher: rec, Dispatcher: "test", Interval: 50 * time.Millisecond, Log: testr.New(t)}
	d := &Dispatcher{JS: conn.JS, HTTP: &deliver.Client{}, Reports: reports, Concurrency: 2, Metrics: m, Log: testr.New(t)}
	done := make(chan struct{}, 2)
	go func() { _ = d.Start(ctx); done <- struct{}{} }()
	go func() { reports.Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() {
		cancel()
		<-done
		<-done
		conn.Close()
	})
	eventually(t, "the dispatcher to start", func() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.ctx != nil })
	return &testEnv{conn: conn, d: d, reports: rec, reg: reg}
}

// publish announces a stored artifact of a GitRepository.
func (e *testEnv) publish(t *testing.T, name string) {
	t.Helper()
	job := events.Job{ID: name + "-job", Object: events.ObjectRef{Kind: "GitRepository", Namespace: "default", Name: name, UID: "u-" + name}}
	if err := e.conn.NewPublisher("artifact-server").Publish(context.Background(), events.EventSubject("GitRepository", "default", name),
		events.TypeArtifactStored, job, &events.Outcome{Job: job}); err != nil {
		t.Fatal(err)
	}
}

func (e *testEnv) subscribe(t *testing.T, uid string, spec v1alpha1.SubscriptionSpec, target *deliver.Target) {
	t.Helper()
	f, err := filter.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	s := &Subscription{Ref: events.SubscriptionRef{Namespace: "default", Name: "sub-" + uid, UID: uid, Generation: 1}, Filter: f, HTTP: target}
	if spec.HTTP != nil {
		s.MaxAttempts = spec.HTTP.MaxAttempts
	}
	if spec.NATS != nil {
		s.NATSConsumer = spec.NATS.Consumer
	}
	if err := e.d.Ensure(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

// TestRetryWithBackoff: a sink that fails twice gets the event on the third
// attempt, at least a second (the first backoff) after the first.
func TestRetryWithBackoff(t *testing.T) {
	e := newTestEnv(t)
	var calls atomic.Int32
	var first, last atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		now := time.Now().UnixNano()
		if n == 1 {
			first.Store(now)
		}
		last.Store(now)
		if n <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	e.subscribe(t, "retry", v1alpha1.SubscriptionSpec{HTTP: &v1alpha1.HTTPSink{URL: srv.URL, MaxAttempts: 5}},
		&deliver.Target{URL: srv.URL, Timeout: 5 * time.Second})
	e.publish(t, "podinfo")

	eventually(t, "a delivery after two failures", func() bool { s := e.reports.sum(); return s.Delivered == 1 && s.Failed == 2 })
	if n := calls.Load(); n != 3 {
		t.Errorf("%d attempts, want 3", n)
	}
	// Backoff 1s then 2s: the third attempt comes 3s after the first.
	if gap := time.Duration(last.Load() - first.Load()); gap < 3*time.Second {
		t.Errorf("third attempt %v after the first, want at least the 1s+2s backoff", gap)
	}
	if s := e.reports.sum(); s.DeadLettered != 0 {
		t.Errorf("%d dead letters, want none", s.DeadLettered)
	}
}

// TestDeadLetter: a sink that always fails ends in one dead letter after
// maxAttempts, reported and counted, while another Subscription's healthy
// sink gets every event.
func TestDeadLetter(t *testing.T) {
	e := newTestEnv(t)
	var deadCalls atomic.Int32
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		deadCalls.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer dead.Close()
	var healthy atomic.Int32
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { healthy.Add(1) }))
	defer ok.Close()

	e.subscribe(t, "dead", v1alpha1.SubscriptionSpec{HTTP: &v1alpha1.HTTPSink{URL: dead.URL, MaxAttempts: 2}},
		&deliver.Target{URL: dead.URL, Timeout: 5 * time.Second})
	e.subscribe(t, "healthy", v1alpha1.SubscriptionSpec{HTTP: &v1alpha1.HTTPSink{URL: ok.URL, MaxAttempts: 2}},
		&deliver.Target{URL: ok.URL, Timeout: 5 * time.Second})
	e.publish(t, "podinfo")
	eventually(t, "the healthy sink's delivery", func() bool { return healthy.Load() == 1 })
	for i := range 5 {
		e.publish(t, "more-"+string(rune('a'+i)))
	}
	eventually(t, "six deliveries to the healthy sink", func() bool { return healthy.Load() == 6 })

	eventually(t, "six dead letters", func() bool { return e.reports.sum().DeadLettered == 6 })
	s := e.reports.sum()
	if s.Failed != 12 || deadCalls.Load() != 12 {
		t.Errorf("%d failed attempts reported, %d made; want 12 (2 per event)", s.Failed, deadCalls.Load())
	}
	dl := s.LastDeadLetter
	if dl == nil || dl.Attempts != 2 || dl.EventType != events.TypeArtifactStored || dl.Error != "endpoint answered 500 Internal Server Error" {
		t.Errorf("last dead letter %+v", dl)
	}
	if got := testutil.ToFloat64(e.d.Metrics.deadLetters.WithLabelValues("default", "sub-dead")); got != 6 {
		t.Errorf("dead letters metric %v, want 6", got)
	}
	if got := testutil.ToFloat64(e.d.Metrics.deadLetters.WithLabelValues("default", "sub-healthy")); got != 0 {
		t.Errorf("healthy subscription's dead letters metric %v, want 0", got)
	}
	// The dead letters are gone from the dead sink's consumer.
	info, err := e.conn.JS.Consumer(context.Background(), events.EventStream, events.SubscriptionConsumer("dead"))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "no pending message", func() bool {
		i, err := info.Info(context.Background())
		return err == nil && i.NumAckPending == 0 && i.NumPending == 0
	})
}

// TestNATSSubscription: a `nats` Subscription's selected events are kept
// in its durable consumer, the others are not.
func TestNATSSubscription(t *testing.T) {
	e := newTestEnv(t)
	e.subscribe(t, "n", v1alpha1.SubscriptionSpec{Sources: v1alpha1.SourceSelector{Names: []string{"wanted"}},
		NATS: &v1alpha1.NATSSink{Consumer: "my-app"}}, nil)
	e.publish(t, "other")
	e.publish(t, "wanted")
	cons, err := e.conn.JS.Consumer(context.Background(), events.SubscriptionStream, "my-app")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m, err := events.Decode(msg.Data())
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Data.(*events.Outcome).Job.Object.Name; got != "wanted" {
		t.Errorf("consumer got %s's event, want wanted's", got)
	}
	if msg.Headers().Get("Content-Type") != events.ContentType {
		t.Errorf("Content-Type %q", msg.Headers().Get("Content-Type"))
	}
	_ = msg.Ack()
	if _, err := cons.Next(jetstream.FetchMaxWait(500 * time.Millisecond)); err == nil {
		t.Error("the consumer holds an event the subscription did not select")
	}
	// Another Subscription may not take the consumer over.
	f, _ := filter.New(v1alpha1.SubscriptionSpec{})
	err = e.d.Ensure(context.Background(), &Subscription{Ref: events.SubscriptionRef{Namespace: "default", Name: "thief", UID: "t"}, Filter: f, NATSConsumer: "my-app"})
	if !errors.Is(err, ErrConsumerConflict) {
		t.Errorf("a second subscription naming the consumer: %v, want ErrConsumerConflict", err)
	}
}
