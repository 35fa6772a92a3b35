package bus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// Delivery tells a handler about the message it is handling.
type Delivery struct {
	// Attempt counts deliveries of this message, starting at 1.
	Attempt uint64
	// Last is true on the message's last attempt (the consumer's
	// MaxDeliver): a transient failure will not be retried.
	Last bool
	// Subject the message was published on.
	Subject string
}

// Handler handles one decoded message. Its error decides what happens to the
// message, in one place (Worker.settle):
//
//   - nil: done, acknowledged.
//   - an error wrapping events.ErrMalformed: never retried, terminated.
//   - a *failure.Error: reported (Worker.Report), then settled by its
//     Handling: Transient is redelivered after a backoff that grows with
//     the attempt count until the last attempt, Final and Stalling are
//     terminated, Waiting is redelivered after its RetryAfter.
//   - any other error is the platform's (the bus, the storage): redelivered
//     after the backoff until the last attempt, then terminated unreported;
//     the next interval makes a new job.
type Handler func(ctx context.Context, msg *events.Message, d Delivery) error

// Reporter publishes a failure a handler returned as the outcome of the
// message's job, so the watcher can write it into the object's status.
type Reporter func(ctx context.Context, msg *events.Message, f *failure.Error) error

// DefaultJobTimeout is the deadline of a job when the worker is given
// none: far beyond any job that makes progress, so that only a runaway
// one meets it.
const DefaultJobTimeout = 10 * time.Minute

// errDeadline is the cause of a handler's context that reached the job's
// deadline.
var errDeadline = errors.New("job deadline exceeded")

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
	// Consumer is the durable pull consumer to read from. Its MaxDeliver
	// (events.ConsumerOptions) bounds the attempts of a message: the
	// worker terminates the last one whatever its error, so JetStream and
	// the worker agree on which attempt is the last.
	Consumer jetstream.Consumer
	// Concurrency bounds the messages handled at once. The worker pulls
	// only for its free slots: it fetches none ahead.
	Concurrency int
	// Heartbeat is how often InProgress is sent; default 10s (a third of
	// the default AckWait).
	Heartbeat time.Duration
	// Handler handles each message.
	Handler Handler
	// JobTimeout is each job's deadline (DefaultJobTimeout when zero): at
	// its end the handler's context is cancelled, the heartbeat stops, and
	// the job fails with failure.DeadlineExceededReason, Final. A handler
	// that does not return DeadlineGrace later is left behind: its job is
	// settled and its slot freed. A service with jobs that bound their own
	// work (a fetch's spec.timeout) gives each its deadline with TimeoutOf.
	JobTimeout time.Duration
	// TimeoutOf, when set, is the deadline of a job (JobTimeout when it
	// returns zero or less).
	TimeoutOf func(m *events.Message) time.Duration
	// DeadlineCondition, when set, names the negative-polarity condition a
	// job that ran out of time sets, when its handler returned no failure
	// naming one (failure.Error.Condition).
	DeadlineCondition func(m *events.Message) string
	// DeadlineGrace is how long a handler has to return once its deadline
	// has passed before the worker stops waiting for it; 10s when zero (the
	// last heartbeat keeps the job for AckWait, 30s by default).
	DeadlineGrace time.Duration
	// Report, when set, publishes each *failure.Error the handler returns
	// before the message is settled; a report that fails is retried like a
	// platform error.
	Report Reporter
	// Metrics, when set, records job counts and durations, and reports
	// the consumer's state when Prometheus scrapes
	// (telemetry.JobMetrics.WatchConsumer): no scrape, no request.
	Metrics *telemetry.JobMetrics
	// Log is the worker's logger.
	Log logr.Logger
	// Rejoin, when set, creates the consumer again (Conn.Joiner). The
	// worker calls it when its consumer is gone: a work queue's consumer
	// keeps its state in memory (events.IsWorkQueue), so a restarted
	// single NATS server has forgotten it, while the stream kept its
	// messages. A reconnection to NATS (with Conn), a deleted consumer
	// and missing heartbeats tell the worker to look.
	Rejoin func(context.Context) (jetstream.Consumer, error)
	// Conn, when set with Rejoin, is the connection the consumer was
	// made on: after each reconnection the worker checks its consumer at
	// once, rather than after two missed heartbeats.
	Conn *Conn

	mu sync.Mutex // guards consumer and cancelPull once Run has started
	// consumer is the consumer in use, which rejoin replaces; cancelPull
	// ends the pull request in flight, if any, so that the next is made
	// on the consumer in use.
	consumer   jetstream.Consumer
	cancelPull context.CancelFunc
	// joining serializes rejoin, which both the pull loop and the
	// reconnection watch call.
	joining sync.Mutex
}

// pullHeartbeat is how often JetStream tells a waiting pull it is alive;
// two missed in a row make the worker check its consumer. It is a
// backstop: a restarted NATS server, the usual way to lose a consumer, is
// noticed at the reconnection (Worker.Conn). It is the longest nats.go
// allows for a pull request of pullExpiry: an idle consumer costs a
// heartbeat every 15 s and a pull request every 30 s.
const pullHeartbeat = 15 * time.Second

// pullExpiry is how long one pull request waits for messages before the
// worker makes the next: nats.go's default, which a pull that a context
// can end (jetstream.FetchContext) always has. Longer would save a request
// a minute per idle consumer, but a pull request outlives a worker that
// is killed for as long as anyone on the server has interest in its reply
// subject (a subscriber to ">", as the e2e tests' bus tap): the messages
// handed to it wait out their AckWait, so a longer pull would delay jobs
// after a crash for longer.
const pullExpiry = jetstream.DefaultExpires

// pullPause is how long the worker waits before pulling again after a
// pull that failed, or that ended at once with nothing (a server refusing
// pull requests): at most one request a second, never a busy loop.
const pullPause = time.Second

// Run handles messages until ctx is cancelled, then waits for the handlers
// in flight to finish (their context is cancelled too).
//
// The worker pulls only for its free slots: it asks JetStream for as many
// messages as it has slots free, and makes no request while every slot is
// busy. A message therefore never waits in a busy replica's buffer while
// another replica has a free slot: JetStream hands it to a replica that
// can start it now (docs/design.md, "Fair share between namespaces").
func (w *Worker) Run(ctx context.Context) error {
	n := max(w.Concurrency, 1)
	w.mu.Lock()
	w.consumer = w.Consumer
	w.mu.Unlock()

	slots := make(chan struct{}, n)
	var wg sync.WaitGroup
	defer wg.Wait()
	if w.Metrics != nil {
		defer w.Metrics.WatchConsumer(w.consumerState)()
	}
	if w.Conn != nil && w.Rejoin != nil {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		wg.Go(func() { w.watchReconnects(wctx) })
	}
	start := func(msg jetstream.Msg) {
		if ctx.Err() != nil {
			// Shutting down: hand the message to another replica at once.
			_ = msg.Nak()
			<-slots
			return
		}
		wg.Go(func() {
			defer func() { <-slots }()
			w.handle(ctx, msg)
		})
	}
	for {
		// Wait for a free slot, then take every other one free now.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		free := 1
	take:
		for free < n {
			select {
			case slots <- struct{}{}:
				free++
			default:
				break take
			}
		}
		began := time.Now()
		got, err := w.pull(ctx, free, start)
		for range free - got {
			<-slots
		}
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case err == nil && (got > 0 || time.Since(began) >= pullPause):
			continue
		case err == nil, errors.Is(err, context.Canceled):
			// Ended at once with nothing, or cut short by a rejoin (the
			// next pull is made on the consumer created again).
			if err == nil {
				w.pause(ctx)
			}
			continue
		case errors.Is(err, nats.ErrConnectionClosed):
			return nil
		case errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, jetstream.ErrConsumerDeleted):
			if !w.rejoin(ctx) {
				w.pause(ctx)
			}
			continue
		default:
			w.Log.Error(err, "reading from consumer")
			w.pause(ctx)
		}
	}
}

// pull makes one pull request for up to free messages on the consumer in
// use and hands each message it brings to start, which owns one of the
// free slots from then on. It returns how many messages it brought and
// what ended the request early (nil when it was filled or expired). A
// cancelled ctx, or a rejoin, ends the request; the messages that had
// already arrived are still handed to start.
func (w *Worker) pull(ctx context.Context, free int, start func(jetstream.Msg)) (int, error) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.mu.Lock()
	cons := w.consumer
	w.cancelPull = cancel
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.cancelPull = nil
		w.mu.Unlock()
	}()
	// A pull request that a context can end waits pullExpiry (nats.go's
	// default; jetstream.FetchMaxWait and FetchContext exclude each other).
	batch, err := cons.Fetch(free, jetstream.FetchContext(pctx), jetstream.FetchHeartbeat(pullHeartbeat))
	if err != nil {
		return 0, fmt.Errorf("%s: pull: %w", w.Service, err)
	}
	got := 0
	for msg := range batch.Messages() {
		got++
		start(msg)
	}
	return got, batch.Error()
}

// pause waits pullPause, or until ctx ends.
func (w *Worker) pause(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(pullPause):
	}
}

// restartPull ends the pull request in flight, if any, so that the next
// is made on the consumer in use.
func (w *Worker) restartPull() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancelPull != nil {
		w.cancelPull()
	}
}

// rejoin checks the consumer (after a reconnection, missed heartbeats, or
// the consumer's deletion) and, if JetStream no longer knows it and Rejoin
// is set, creates it again and makes it the one in use, ending the pull
// request made on the old. It reports whether the check was made: false
// when JetStream did not answer (it may still be starting).
func (w *Worker) rejoin(ctx context.Context) bool {
	if w.Rejoin == nil {
		return true
	}
	w.joining.Lock()
	defer w.joining.Unlock()
	w.mu.Lock()
	cons := w.consumer
	w.mu.Unlock()
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cons.Info(ictx); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return err == nil || !jetStreamUnavailable(err)
	}
	w.Log.Info("consumer lost: creating it again", "consumer", cons.CachedInfo().Name, "stream", cons.CachedInfo().Stream)
	cons, err := w.Rejoin(ictx)
	if err != nil {
		w.Log.Error(err, "creating the lost consumer again; retrying at the next missed heartbeat")
		return true
	}
	w.mu.Lock()
	w.consumer = cons
	w.mu.Unlock()
	w.restartPull()
	return true
}

// watchReconnects checks the consumer after each reconnection to NATS
// until ctx ends: a restarted server has forgotten a work queue's
// consumer. While JetStream does not answer yet, the check is tried again,
// 1 s apart doubling up to 5 s, for up to a minute; the missed heartbeats
// remain the backstop.
func (w *Worker) watchReconnects(ctx context.Context) {
	nc := w.Conn.NC
	ch := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				return
			}
		}
		deadline := time.Now().Add(time.Minute)
		for attempt := uint64(1); !w.rejoin(ctx) && time.Now().Before(deadline); attempt++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(min(Backoff(attempt), maxConnectWait)):
			}
		}
		// A server that restarted has forgotten the pull request in
		// flight too: make the next one now rather than after two
		// missed heartbeats.
		w.restartPull()
	}
}

// consumerState reads the state of the consumer in use, for Metrics. A
// failed read is logged: the bus being down shows in /readyz.
func (w *Worker) consumerState(ctx context.Context) (telemetry.ConsumerState, error) {
	w.mu.Lock()
	cons := w.consumer
	w.mu.Unlock()
	info, err := cons.Info(ctx)
	if err != nil {
		w.Log.V(1).Info("reading consumer state failed", "error", err)
		return telemetry.ConsumerState{}, err
	}
	return telemetry.ConsumerState{Stream: info.Stream, Consumer: info.Name,
		Pending: info.NumPending, AckPending: info.NumAckPending, Redelivered: info.NumRedelivered,
		AckFloor: info.AckFloor.Stream}, nil
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
	if limit := w.Consumer.CachedInfo().Config.MaxDeliver; limit > 0 {
		d.Last = d.Attempt >= uint64(limit)
	}
	log := w.Log.WithValues("subject", msg.Subject(), "attempt", d.Attempt)

	m, err := events.Decode(msg.Data())
	// The span of this delivery continues the trace the message carries;
	// a malformed message, or one without a valid trace context, starts
	// a new one. Settling (and a failure's report) happens within it.
	sctx, span := startProcessSpan(ctx, w.Service, msg.Subject(), m, d)
	eventType := "malformed"
	if err == nil {
		eventType = m.Event.Type()
		job := events.JobOf(m.Data)
		log = log.WithValues("type", eventType, "job", job.ID,
			"kind", job.Object.Kind, "namespace", job.Object.Namespace, "name", job.Object.Name)
		// A job of another kind than its subject's is refused (rejected
		// in headwater_jobs_total) before any handler sees it.
		if err = events.CheckRoute(msg.Subject(), job); err == nil {
			err = w.runWithHeartbeat(logr.NewContext(sctx, log), m, d, msg)
		}
	}
	result := w.settle(sctx, log, msg, m, d, err)
	endSpan(span, result, err)
	if w.Metrics != nil {
		w.Metrics.Observe(eventType, result, time.Since(start))
	}
}

// runWithHeartbeat runs the handler under the job's deadline, telling
// JetStream the job is in progress until it returns or the deadline
// passes.
func (w *Worker) runWithHeartbeat(ctx context.Context, m *events.Message, d Delivery, msg jetstream.Msg) error {
	every := w.Heartbeat
	if every <= 0 {
		every = 10 * time.Second
	}
	timeout := w.timeoutOf(m)
	hctx, cancel := context.WithTimeoutCause(ctx, timeout, errDeadline)
	defer cancel()
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-hctx.Done():
				// Returned, shutting down, or out of time: a job past
				// its deadline is not kept alive.
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	result := make(chan error, 1)
	go func() { result <- w.Handler(hctx, m, d) }()
	var err error
	select {
	case err = <-result:
	case <-hctx.Done():
		if ctx.Err() != nil {
			// Shutting down: Run waits for the handler.
			err = <-result
			break
		}
		grace := w.DeadlineGrace
		if grace <= 0 {
			grace = 10 * time.Second
		}
		select {
		case err = <-result:
		case <-time.After(grace):
			logr.FromContextOrDiscard(ctx).Error(errDeadline, "handler did not return after its deadline; settling its job and freeing its slot",
				"timeout", timeout.String(), "grace", grace.String())
			err = errDeadline
		}
	}
	if err != nil && ctx.Err() == nil && pastDeadline(hctx) {
		return w.deadlineFailure(m, timeout, err)
	}
	return err
}

// pastDeadline reports whether the job's context hctx ran out of time. Its
// cause says so once its timer has fired; a handler that failed at the
// same deadline through a context of its own with that deadline (a
// listing shared between fetches runs on one) can return in the instant
// before, so the deadline itself having passed counts too.
func pastDeadline(hctx context.Context) bool {
	if errors.Is(context.Cause(hctx), errDeadline) {
		return true
	}
	deadline, ok := hctx.Deadline()
	return ok && !time.Now().Before(deadline)
}

// timeoutOf is the deadline of the job m.
func (w *Worker) timeoutOf(m *events.Message) time.Duration {
	if w.TimeoutOf != nil {
		if d := w.TimeoutOf(m); d > 0 {
			return d
		}
	}
	if w.JobTimeout > 0 {
		return w.JobTimeout
	}
	return DefaultJobTimeout
}

// deadlineFailure is the failure of a job that ran out of time, err being
// what its handler returned (or errDeadline): Final, so the job is not
// tried again (the next interval makes a new one), with the condition
// the handler's failure names, else DeadlineCondition's.
func (w *Worker) deadlineFailure(m *events.Message, timeout time.Duration, err error) *failure.Error {
	condition := ""
	if f := failure.As(err); f != nil {
		condition = f.Condition
	}
	if condition == "" && w.DeadlineCondition != nil {
		condition = w.DeadlineCondition(m)
	}
	return failure.New(failure.Final, condition, failure.DeadlineExceededReason,
		"the job did not finish within its deadline of %s", timeout)
}

// settle acknowledges the message according to err (see Handler) and returns
// the result label for metrics.
func (w *Worker) settle(ctx context.Context, log logr.Logger, msg jetstream.Msg, m *events.Message, d Delivery, err error) string {
	if err == nil {
		if aerr := msg.Ack(); aerr != nil {
			log.Error(aerr, "ack failed; the message will be redelivered")
		}
		return "success"
	}
	if ctx.Err() != nil {
		// Shutting down: hand the message to another replica at once.
		_ = msg.Nak()
		return "interrupted"
	}
	if errors.Is(err, events.ErrMalformed) {
		log.Error(err, "rejecting message")
		_ = msg.Term()
		return "rejected"
	}
	f := failure.As(err)
	if f != nil {
		// The report says whether the bus tries the job again, so the
		// watcher makes no job of its own for it meanwhile.
		f.Retrying = f.Handling == failure.Transient && !d.Last
	}
	if f != nil && w.Report != nil && m != nil {
		if rerr := w.Report(ctx, m, f); rerr != nil {
			err, f = fmt.Errorf("report failure %q: %w", f.Error(), rerr), nil
		}
	}
	if f == nil {
		// The platform's failure.
		if d.Last {
			log.Error(err, "handling failed on the last attempt; the next interval makes a new job")
			_ = msg.Term()
			return "dropped"
		}
		delay := Backoff(d.Attempt)
		log.Error(err, "handling failed; retrying", "delay", delay.String())
		_ = msg.NakWithDelay(delay)
		return "error"
	}
	kv := []any{"handling", f.Handling.String(), "condition", f.Condition, "reason", f.Reason, "message", f.Error()}
	switch {
	case f.Handling == failure.Waiting:
		log.Info("waiting", append(kv, "delay", f.RetryAfter.String())...)
		_ = msg.NakWithDelay(f.RetryAfter)
		return "waiting"
	case f.Handling == failure.Throttled:
		// The watcher makes the next job when the host allows.
		log.Info("throttled", append(kv, "retryAfter", f.RetryAfter.String())...)
		_ = msg.Term()
		return "throttled"
	case f.Handling == failure.Transient && !d.Last:
		delay := Backoff(d.Attempt)
		log.Info("failed; retrying", append(kv, "delay", delay.String())...)
		_ = msg.NakWithDelay(delay)
		return "retry"
	default:
		log.Info("failed", append(kv, "last", d.Last)...)
		_ = msg.Term()
		return "failed"
	}
}
