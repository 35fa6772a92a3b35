// Package dispatch delivers the public events to Subscriptions: one durable
// JetStream consumer on HEADWATER_EVENTS per Subscription, shared by every
// dispatcher replica, so a slow or dead sink only holds up its own consumer,
// never another Subscription's nor the artifact pipeline (which never waits
// for a subscriber). An HTTP Subscription's events are posted with retries
// (bus.Worker: NakWithDelay with a growing backoff, MaxDeliver =
// maxAttempts) and become dead letters after the last attempt; a `nats`
// Subscription's events are republished on its own subject, where its
// durable consumer keeps them for the subscriber.
package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/dispatcher/internal/deliver"
	"github.com/headwater-gitops/headwater/services/dispatcher/internal/filter"
)

// ConsumerInactivity is how long a Subscription's consumer outlives the
// last dispatcher pulling from it (or a `nats` Subscription's consumer its
// last subscriber): it removes the consumers of Subscriptions deleted while
// no dispatcher ran. The event stream keeps a day of events, so a consumer
// idle for longer has nothing left to catch up on.
const ConsumerInactivity = 24 * time.Hour

// natsMaxDeliver bounds the attempts to republish an event for a `nats`
// Subscription (a platform error: NATS is the sink).
const natsMaxDeliver = 20

// Subscription is what to deliver for one Subscription at one generation.
type Subscription struct {
	// Ref names it in reports.
	Ref events.SubscriptionRef
	// Filter selects its events.
	Filter *filter.Filter
	// HTTP, when set, is its endpoint.
	HTTP *deliver.Target
	// MaxAttempts bounds the HTTP deliveries of one event.
	MaxAttempts int
	// NATSConsumer, when set, is the durable consumer its events are kept
	// in, on events.SubscriptionStream.
	NATSConsumer string
}

func (s *Subscription) name() types.NamespacedName {
	return types.NamespacedName{Namespace: s.Ref.Namespace, Name: s.Ref.Name}
}

// ErrConsumerConflict says a `nats` Subscription names a consumer that
// exists for another subject (another Subscription's).
var ErrConsumerConflict = errors.New("consumer exists for another subscription")

// Dispatcher runs the delivery of every Subscription this process knows.
type Dispatcher struct {
	// JS is the bus, with the dispatcher's identity.
	JS jetstream.JetStream
	// HTTP delivers to endpoints.
	HTTP *deliver.Client
	// Reports collects delivery results for the watcher.
	Reports *Reports
	// Concurrency bounds the events of one Subscription in flight.
	Concurrency int
	// Metrics count deliveries (NewMetrics).
	Metrics *Metrics
	// Jobs records the bus workers' handling, as in every service.
	Jobs *telemetry.JobMetrics
	// Log is the dispatcher's logger.
	Log logr.Logger

	mu      sync.Mutex
	ctx     context.Context
	running map[types.NamespacedName]*running
}

// running is one Subscription's worker.
type running struct {
	uid    types.UID
	target atomic.Pointer[Subscription]
	cancel context.CancelFunc
	done   chan struct{}
}

// Start records the context the workers run in; Ensure before Start fails.
// It returns when ctx ends, after every worker has stopped.
func (d *Dispatcher) Start(ctx context.Context) error {
	d.mu.Lock()
	d.ctx = ctx
	if d.running == nil {
		d.running = map[types.NamespacedName]*running{}
	}
	d.mu.Unlock()
	<-ctx.Done()
	d.mu.Lock()
	all := d.running
	d.running = map[types.NamespacedName]*running{}
	d.mu.Unlock()
	for _, r := range all {
		<-r.done
	}
	return nil
}

// Ensure creates or updates the consumers of s and starts its worker, or
// hands the running worker the new spec.
func (d *Dispatcher) Ensure(ctx context.Context, s *Subscription) error {
	d.mu.Lock()
	base := d.ctx
	d.mu.Unlock()
	if base == nil {
		return errors.New("dispatcher not started")
	}
	if s.NATSConsumer != "" {
		if err := d.ensureNATSConsumer(ctx, s); err != nil {
			return err
		}
	}
	maxDeliver := s.MaxAttempts
	ackWait := 30 * time.Second
	if s.HTTP == nil {
		maxDeliver = natsMaxDeliver
	} else if s.HTTP.Timeout > 0 {
		ackWait += s.HTTP.Timeout
	}
	cfg := events.Consumer(events.EventStream, events.SubscriptionConsumer(s.Ref.UID), events.ConsumerOptions{
		MaxAckPending: 4 * max(d.Concurrency, 1), AckWait: ackWait, MaxDeliver: maxDeliver, DeliverNew: true,
	})
	cfg.Description = "Headwater Subscription " + s.Ref.Namespace + "/" + s.Ref.Name
	cfg.FilterSubjects = s.Filter.Subjects()
	cfg.InactiveThreshold = ConsumerInactivity
	cons, err := d.JS.CreateOrUpdateConsumer(ctx, events.EventStream, cfg)
	if err != nil {
		return fmt.Errorf("consumer for subscription %s: %w", s.name(), err)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if r, ok := d.running[s.name()]; ok {
		if r.uid == types.UID(s.Ref.UID) {
			r.target.Store(s)
			return nil
		}
		// Deleted and re-created under the same name.
		r.cancel()
	}
	wctx, cancel := context.WithCancel(base)
	r := &running{uid: types.UID(s.Ref.UID), cancel: cancel, done: make(chan struct{})}
	r.target.Store(s)
	d.running[s.name()] = r
	w := &bus.Worker{
		Service:     "dispatcher",
		Consumer:    cons,
		Concurrency: max(d.Concurrency, 1),
		Handler:     func(ctx context.Context, m *events.Message, dl bus.Delivery) error { return d.handle(ctx, r, m, dl) },
		Metrics:     d.Jobs,
		Log:         d.Log.WithValues("subscription", s.name().String()),
	}
	go func() {
		defer close(r.done)
		if err := w.Run(wctx); err != nil {
			d.Log.Error(err, "subscription worker stopped", "subscription", s.name().String())
		}
	}()
	d.Log.Info("delivering", "subscription", s.name().String(), "subjects", cfg.FilterSubjects)
	return nil
}

// ensureNATSConsumer creates the durable consumer a `nats` Subscription
// names, on its own subject of events.SubscriptionStream.
func (d *Dispatcher) ensureNATSConsumer(ctx context.Context, s *Subscription) error {
	subject := events.SubscriptionSubject(s.Ref.Namespace, s.Ref.Name)
	c, err := d.JS.Consumer(ctx, events.SubscriptionStream, s.NATSConsumer)
	switch {
	case err == nil:
		if f := c.CachedInfo().Config.FilterSubject; f != subject {
			return fmt.Errorf("%w: %s reads %s", ErrConsumerConflict, s.NATSConsumer, f)
		}
		return nil
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return fmt.Errorf("look up consumer %s: %w", s.NATSConsumer, err)
	}
	_, err = d.JS.CreateOrUpdateConsumer(ctx, events.SubscriptionStream, jetstream.ConsumerConfig{
		Durable:           s.NATSConsumer,
		Description:       "Headwater Subscription " + s.name().String(),
		FilterSubject:     subject,
		AckPolicy:         jetstream.AckExplicitPolicy,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: ConsumerInactivity,
	})
	if err != nil {
		return fmt.Errorf("create consumer %s: %w", s.NATSConsumer, err)
	}
	return nil
}

// Stop stops the delivery of a Subscription that cannot be served now,
// keeping its consumer: its events wait there until it can.
func (d *Dispatcher) Stop(name types.NamespacedName) {
	if r := d.stop(name); r != nil {
		d.Log.Info("paused delivering", "subscription", name.String())
	}
}

// stop stops a Subscription's worker and returns it, or nil if none ran.
func (d *Dispatcher) stop(name types.NamespacedName) *running {
	d.mu.Lock()
	r, ok := d.running[name]
	delete(d.running, name)
	d.mu.Unlock()
	if !ok {
		return nil
	}
	r.cancel()
	<-r.done
	return r
}

// Remove stops the delivery of a deleted Subscription and removes its
// consumers.
func (d *Dispatcher) Remove(ctx context.Context, name types.NamespacedName) {
	r := d.stop(name)
	if r == nil {
		return
	}
	s := r.target.Load()
	d.Reports.Forget(r.uid)
	d.Metrics.forget(name)
	if err := d.JS.DeleteConsumer(ctx, events.EventStream, events.SubscriptionConsumer(string(r.uid))); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		d.Log.Error(err, "removing the consumer of a deleted subscription", "subscription", name.String())
	}
	if s.NATSConsumer != "" {
		if err := d.JS.DeleteConsumer(ctx, events.SubscriptionStream, s.NATSConsumer); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			d.Log.Error(err, "removing the nats consumer of a deleted subscription", "subscription", name.String())
		}
	}
	d.Log.Info("stopped delivering", "subscription", name.String())
}

// handle delivers one event to one Subscription. Events it does not select
// are acknowledged untouched.
func (d *Dispatcher) handle(ctx context.Context, r *running, m *events.Message, dl bus.Delivery) error {
	s := r.target.Load()
	out, ok := m.Data.(*events.Outcome)
	if !ok || !s.Filter.Match(m.Event.Type(), out.Job.Object) {
		return nil
	}
	start := time.Now()
	var err error
	if s.HTTP != nil {
		err = d.HTTP.Deliver(ctx, m.Event, *s.HTTP)
	} else {
		err = d.republish(ctx, s, m)
	}
	d.Metrics.observe(s.name(), err, time.Since(start))
	if err == nil {
		d.Reports.Delivered(s.Ref, time.Now())
		return nil
	}
	if ctx.Err() != nil {
		return err // shutting down: redelivered at once to another replica
	}
	d.Reports.Failed(s.Ref)
	// A sink the egress policy refuses stays refused: a dead letter at
	// once, rather than a retry of the same refusal.
	if dl.Last || egress.Refused(err) {
		d.Metrics.deadLetter(s.name())
		d.Reports.DeadLetter(s.Ref, events.DeadLetter{
			EventID: m.Event.ID(), EventType: m.Event.Type(), Subject: m.Event.Subject(),
			Time: time.Now().UTC(), Attempts: int64(dl.Attempt), Error: failure.Redact(err.Error()),
		})
		return failure.New(failure.Final, "", "DeliveryFailed", "dead letter after %d attempts: %w", dl.Attempt, err)
	}
	return failure.New(failure.Transient, "", "DeliveryFailed", "%w", err)
}

// republish stores the event on the `nats` Subscription's subject; the
// message ID makes a retried republish harmless.
func (d *Dispatcher) republish(ctx context.Context, s *Subscription, m *events.Message) error {
	body, err := json.Marshal(m.Event)
	if err != nil {
		return fmt.Errorf("encode event %s: %w", m.Event.ID(), err)
	}
	msg := &nats.Msg{Subject: events.SubscriptionSubject(s.Ref.Namespace, s.Ref.Name), Data: body, Header: nats.Header{}}
	msg.Header.Set("Content-Type", events.ContentType)
	if _, err := d.JS.PublishMsg(ctx, msg, jetstream.WithMsgID(s.Ref.UID+"/"+m.Event.ID())); err != nil {
		return fmt.Errorf("republish %s: %w", m.Event.ID(), err)
	}
	return nil
}

// Metrics count deliveries by Subscription.
type Metrics struct {
	deliveries  *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	deadLetters *prometheus.CounterVec
	lastDead    *prometheus.GaugeVec
}

// NewMetrics registers headwater_subscription_deliveries_total{namespace,
// subscription,result} (delivered, failed), headwater_subscription_dead_letters_total,
// headwater_subscription_last_dead_letter_timestamp_seconds and
// headwater_subscription_delivery_duration_seconds on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	labels := []string{"namespace", "subscription"}
	m := &Metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "subscription_deliveries_total",
			Help: "Delivery attempts of public CloudEvents to Subscriptions, by result (delivered, failed).",
		}, append(labels, "result")),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: telemetry.Namespace, Name: "subscription_delivery_duration_seconds",
			Help:    "Duration of one delivery attempt to a Subscription's sink.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, labels),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "subscription_dead_letters_total",
			Help: "Events a Subscription's sink never accepted after its last attempt.",
		}, labels),
		lastDead: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: telemetry.Namespace, Name: "subscription_last_dead_letter_timestamp_seconds",
			Help: "When a Subscription's last dead letter was recorded (Unix time).",
		}, labels),
	}
	for _, c := range []prometheus.Collector{m.deliveries, m.duration, m.deadLetters, m.lastDead} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("dispatcher metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) observe(n types.NamespacedName, err error, d time.Duration) {
	result := "delivered"
	if err != nil {
		result = "failed"
	}
	m.deliveries.WithLabelValues(n.Namespace, n.Name, result).Inc()
	m.duration.WithLabelValues(n.Namespace, n.Name).Observe(d.Seconds())
}

func (m *Metrics) deadLetter(n types.NamespacedName) {
	m.deadLetters.WithLabelValues(n.Namespace, n.Name).Inc()
	m.lastDead.WithLabelValues(n.Namespace, n.Name).SetToCurrentTime()
}

// forget drops a deleted Subscription's series.
func (m *Metrics) forget(n types.NamespacedName) {
	match := prometheus.Labels{"namespace": n.Namespace, "subscription": n.Name}
	m.deliveries.DeletePartialMatch(match)
	m.duration.DeletePartialMatch(match)
	m.deadLetters.DeletePartialMatch(match)
	m.lastDead.DeletePartialMatch(match)
}
