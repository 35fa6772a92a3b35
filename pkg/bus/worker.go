package bus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// Delivery tells a handler about the message it is handling.
type Delivery struct {
	// Attempt counts deliveries of this message, starting at 1.
	Attempt uint64
	// Subject the message was published on.
	Subject string
}

// Handler handles one decoded message. Its error decides what happens to the
// message, in one place (Worker.settle):
//
//   - nil: done, acknowledged.
//   - an error wrapping events.ErrMalformed, or made by Terminal: never
//     retried, terminated.
//   - an error made by RetryAfter: redelivered after the given delay.
//   - any other error: transient, redelivered after a backoff that grows
//     with the attempt count.
type Handler func(ctx context.Context, msg *events.Message, d Delivery) error

type terminalError struct{ err error }

func (e *terminalError) Error() string { return e.err.Error() }
func (e *terminalError) Unwrap() error { return e.err }

// Terminal marks err as one retrying cannot fix: the message is terminated.
func Terminal(err error) error { return &terminalError{err: err} }

type retryError struct {
	err   error
	delay time.Duration
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// RetryAfter asks for the message to be redelivered after delay.
func RetryAfter(err error, delay time.Duration) error { return &retryError{err: err, delay: delay} }

// Backoff is the redelivery delay of a transient failure on the given
// attempt: 1s, 2s, 4s, ... capped at 2 minutes.
func Backoff(attempt uint64) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := time.Second << min(attempt-1, 7)
	return min(d, 2*time.Minute)
}

// Worker runs a handler over a durable pull consumer with bounded
// concurrency. While a handler works, the worker tells JetStream the message
// is in progress, so a long clone is not redelivered; a crashed worker's
// messages are redelivered after the consumer's AckWait.
type Worker struct {
	// Service names the service, for logs and metrics.
	Service string
	// Consumer is the durable pull consumer to read from.
	Consumer jetstream.Consumer
	// Concurrency bounds the messages handled at once (and fetched ahead).
	Concurrency int
	// Heartbeat is how often InProgress is sent; default 10s (a third of
	// the default AckWait).
	Heartbeat time.Duration
	// Handler handles each message.
	Handler Handler
	// Metrics, when set, records job counts and durations.
	Metrics *telemetry.JobMetrics
	// Log is the worker's logger.
	Log logr.Logger
}

// Run handles messages until ctx is cancelled, then waits for the handlers
// in flight to finish (their context is cancelled too).
func (w *Worker) Run(ctx context.Context) error {
	n := max(w.Concurrency, 1)
	it, err := w.Consumer.Messages(jetstream.PullMaxMessages(n))
	if err != nil {
		return fmt.Errorf("%s: consume: %w", w.Service, err)
	}
	// On shutdown, Drain stops pulling but keeps the messages already
	// buffered readable, so each is handed back (Nak) to another replica at
	// once instead of waiting out its AckWait.
	stop := context.AfterFunc(ctx, it.Drain)
	defer stop()

	slots := make(chan struct{}, n)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		slots <- struct{}{}
		msg, err := it.Next()
		if err != nil {
			<-slots
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				return nil
			}
			w.Log.Error(err, "reading from consumer")
			continue
		}
		if ctx.Err() != nil {
			_ = msg.Nak()
			<-slots
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			w.handle(ctx, msg)
		}()
	}
}

// handle decodes, runs the handler with a heartbeat, and settles the message.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	start := time.Now()
	if w.Metrics != nil {
		defer w.Metrics.Start()()
	}
	d := Delivery{Attempt: 1, Subject: msg.Subject()}
	if md, err := msg.Metadata(); err == nil {
		d.Attempt = md.NumDelivered
	}
	log := w.Log.WithValues("subject", msg.Subject(), "attempt", d.Attempt)

	m, err := events.Decode(msg.Data())
	eventType := "malformed"
	if err == nil {
		eventType = m.Event.Type()
		job := events.JobOf(m.Data)
		log = log.WithValues("type", eventType, "job", job.ID,
			"kind", job.Object.Kind, "namespace", job.Object.Namespace, "name", job.Object.Name)
		err = w.runWithHeartbeat(logr.NewContext(ctx, log), m, d, msg)
	}
	result := w.settle(ctx, log, msg, d, err)
	if w.Metrics != nil {
		w.Metrics.Observe(eventType, result, time.Since(start))
	}
}

func (w *Worker) runWithHeartbeat(ctx context.Context, m *events.Message, d Delivery, msg jetstream.Msg) error {
	every := w.Heartbeat
	if every <= 0 {
		every = 10 * time.Second
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	return w.Handler(ctx, m, d)
}

// settle acknowledges the message according to err (see Handler) and returns
// the result label for metrics.
func (w *Worker) settle(ctx context.Context, log logr.Logger, msg jetstream.Msg, d Delivery, err error) string {
	var term *terminalError
	var retry *retryError
	switch {
	case err == nil:
		if aerr := msg.Ack(); aerr != nil {
			log.Error(aerr, "ack failed; the message will be redelivered")
		}
		return "success"
	case ctx.Err() != nil:
		// Shutting down: hand the message to another replica at once.
		_ = msg.Nak()
		return "interrupted"
	case errors.Is(err, events.ErrMalformed), errors.As(err, &term):
		log.Error(err, "rejecting message")
		_ = msg.Term()
		return "rejected"
	case errors.As(err, &retry):
		log.Info("retrying message later", "error", err.Error(), "delay", retry.delay.String())
		_ = msg.NakWithDelay(retry.delay)
		return "retry"
	default:
		delay := Backoff(d.Attempt)
		log.Error(err, "handling failed; retrying", "delay", delay.String())
		_ = msg.NakWithDelay(delay)
		return "error"
	}
}
