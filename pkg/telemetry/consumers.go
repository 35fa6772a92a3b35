package telemetry

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ConsumerReader reads the state of a durable consumer from JetStream.
type ConsumerReader func(ctx context.Context) (ConsumerState, error)

// ConsumerReadTimeout bounds one read of a consumer's state at a scrape; a
// read that fails or times out reports the last state read, if any.
const ConsumerReadTimeout = 3 * time.Second

// ConsumerStateMaxAge is how long a consumer's state, once read, answers
// the scrapes that follow: several Prometheus servers, or a scrape retried,
// cost one request to JetStream.
const ConsumerStateMaxAge = 5 * time.Second

// consumerCollector exports the consumer gauges of JobMetrics. It reads
// each watched consumer's state when Prometheus scrapes, not on a timer:
// a service nobody scrapes asks JetStream nothing.
type consumerCollector struct {
	pending, ackPending, redelivered, ackFloor *prometheus.Desc

	// now is the clock, for the age of a state.
	now func() time.Time

	mu      sync.Mutex
	watched map[*watchedConsumer]struct{}
}

// watchedConsumer is one consumer of a collector and its last state.
type watchedConsumer struct {
	read ConsumerReader

	mu    sync.Mutex // held across a read, so concurrent scrapes share it
	state ConsumerState
	at    time.Time // when state was read; zero before the first read
}

func newConsumerCollector(service string) *consumerCollector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help,
			[]string{"stream", "consumer"}, prometheus.Labels{"service": service})
	}
	return &consumerCollector{
		pending:     desc("consumer_pending_messages", "Messages of the stream the service's durable consumer has not delivered yet (its lag)."),
		ackPending:  desc("consumer_ack_pending_messages", "Messages delivered to the service's consumer and not acknowledged yet."),
		redelivered: desc("consumer_redelivered_messages", "Messages delivered to the service's consumer more than once and not acknowledged yet."),
		ackFloor:    desc("consumer_ack_floor_sequence", "Stream sequence up to which the service's consumer has acknowledged every message."),
		now:         time.Now,
		watched:     map[*watchedConsumer]struct{}{},
	}
}

// Describe sends the four gauges' descriptions.
func (c *consumerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.ackPending
	ch <- c.redelivered
	ch <- c.ackFloor
}

// Collect reads the state of every watched consumer, at once, and sends
// it; a consumer never read successfully is left out, and two readers of
// the same stream and consumer report once.
func (c *consumerCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	watched := make([]*watchedConsumer, 0, len(c.watched))
	for w := range c.watched {
		watched = append(watched, w)
	}
	c.mu.Unlock()
	states := make([]*ConsumerState, len(watched))
	var wg sync.WaitGroup
	for i, w := range watched {
		wg.Go(func() { states[i] = w.current(c.now) })
	}
	wg.Wait()
	seen := map[[2]string]bool{}
	for _, s := range states {
		if s == nil || seen[[2]string{s.Stream, s.Consumer}] {
			continue
		}
		seen[[2]string{s.Stream, s.Consumer}] = true
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, s.Stream, s.Consumer)
		}
		gauge(c.pending, float64(s.Pending))
		gauge(c.ackPending, float64(s.AckPending))
		gauge(c.redelivered, float64(s.Redelivered))
		gauge(c.ackFloor, float64(s.AckFloor))
	}
}

// current returns the consumer's state: the last one read if it is younger
// than ConsumerStateMaxAge, otherwise a new read, or, when that fails, the
// last one read (nil if none was).
func (w *watchedConsumer) current(now func() time.Time) *ConsumerState {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.at.IsZero() || now().Sub(w.at) >= ConsumerStateMaxAge {
		ctx, cancel := context.WithTimeout(context.Background(), ConsumerReadTimeout)
		s, err := w.read(ctx)
		cancel()
		if err == nil {
			w.state, w.at = s, now()
		}
	}
	if w.at.IsZero() {
		return nil
	}
	s := w.state
	return &s
}

// watch adds a consumer; the returned func removes it.
func (c *consumerCollector) watch(read ConsumerReader) func() {
	w := &watchedConsumer{read: read}
	c.mu.Lock()
	c.watched[w] = struct{}{}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.watched, w)
		c.mu.Unlock()
	}
}
