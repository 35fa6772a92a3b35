package fairshare

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// The backlog gate: the fetch stream is first come, first served, so every
// job already on it when another namespace's first job comes is ahead of
// that job. The per-namespace slots bound how many of one namespace's jobs
// are on the bus, not how many wait there undelivered: with a few
// namespaces busy, their slots alone make a queue of several rounds of
// fetches. The gate keeps that queue short: while a fetch consumer has
// FetchBacklog or more jobs that no fetcher has taken (its NumPending), a
// namespace that already has a job in flight holds its next ones in the
// watcher, where they are published fairly as the fetchers take jobs,
// rather than first come on the stream. A namespace with nothing in flight
// passes the gate, so a tenant's first job meets a stream of at most
// FetchBacklog jobs whatever the other tenants have due (the fetchers
// pull a job only for a free worker, so none waits pulled ahead either).
//
// The watcher cannot see a fetcher take a job; it reads the consumer's
// state (one JetStream API request, $JS.API.CONSUMER.INFO) while jobs are
// held: every gatePoll while the fetchers are busy, at once again after a
// reading that let jobs through (the fetchers were taking them as fast as
// they came), and each fetcher's pull request waiting for jobs (the
// consumer's NumWaiting) counts against the backlog, since it takes at
// least one job at once: so a gate never slows fetchers that have room,
// and holds jobs back only while every fetcher's workers are busy. The
// backlog is the larger of two counts: the consumer's NumPending (every
// publisher's jobs, but the server updates it a moment after a message is
// stored, so under load a reading misses the jobs just published), plus
// the jobs published since; and the queue's own jobs beyond the consumer's
// last delivered stream sequence (exact: the queue keeps the sequence of
// every job it published until the consumer has delivered past it).

// FetchBacklogFlag is the flag of Options.FetchBacklog.
const FetchBacklogFlag = "fair-share-fetch-backlog"

// DefaultFetchBacklog is the default of -fair-share-fetch-backlog: on,
// with one job left undelivered, which keeps the fetchers busy (a worker
// that frees takes it at once, and the gate is read again within gatePoll
// of a fetcher taking jobs). Measured in scenario f with the small
// tenant on a git host of its own (docs/design.md, "What bounded the
// small tenant"), the gate takes its time under a big tenant's thousand
// jobs from 5.4x its idle time to 2.9x. Its cost: a flood waits in the
// watcher, not on the stream, so the fetch consumer's num_pending no
// longer shows it; autoscalers read headwater_fairshare_waiting_jobs too
// (deploy/examples/keda-scaledobjects.yaml), or set 0.
const DefaultFetchBacklog = 1

// gatePoll is how often a closed gate reads its consumer's backlog again:
// short against a fetch (a freed worker takes the job left undelivered,
// and the next is published within gatePoll),
// and 20 requests a second per fetch consumer at most, only while jobs
// are held.
const gatePoll = 50 * time.Millisecond

// gateRetry is how long a gate whose backlog could not be read lets every
// job through before it reads again: the gate is for fairness, and a
// consumer that cannot be read (not made yet, or NATS permissions that
// lack $JS.API.CONSUMER.INFO) must never hold jobs back for good.
const gateRetry = 5 * time.Second

// Backlog reads a fetch consumer's state.
type Backlog interface {
	// Read reads consumer's backlog on the fetch stream.
	Read(ctx context.Context, consumer string) (Reading, error)
}

// Reading is a fetch consumer's state, as the gate uses it.
type Reading struct {
	// Pending is the number of jobs on the fetch stream for the consumer
	// not yet delivered to any fetcher (its NumPending).
	Pending int
	// Delivered is the stream sequence of the last job it delivered: it
	// has delivered every one of its jobs at or below it.
	Delivered uint64
	// Waiting is the number of fetchers' pull requests waiting for jobs
	// (its NumWaiting): above zero, the fetchers have room.
	Waiting int
}

// ConsumerBacklog is Backlog over JetStream: the fetch consumer's state
// (the watcher may read it: $JS.API.CONSUMER.INFO on events.FetchStream).
type ConsumerBacklog struct {
	JS jetstream.JetStream
}

// Read reads consumer's state on events.FetchStream.
func (b ConsumerBacklog) Read(ctx context.Context, consumer string) (Reading, error) {
	c, err := b.JS.Consumer(ctx, events.FetchStream, consumer)
	if err != nil {
		return Reading{}, fmt.Errorf("read the backlog of %s on %s: %w", consumer, events.FetchStream, err)
	}
	info := c.CachedInfo()
	return Reading{Pending: int(info.NumPending), Delivered: info.Delivered.Stream, Waiting: info.NumWaiting}, nil
}

// SeqPublisher is a Publisher that tells the stream sequence of each job
// (a *bus.Publisher): with it, the gate counts the queue's own jobs
// exactly.
type SeqPublisher interface {
	PublishSeq(ctx context.Context, subject, eventType string, job events.Job, data any) (uint64, error)
}

// maxTracked bounds the sequences a gate keeps: beyond it the oldest are
// dropped (the consumer's NumPending still counts them).
const maxTracked = 4096

// gate is one fetch consumer's backlog as the queue knows it.
type gate struct {
	// pending is the last reading's Pending plus the jobs published
	// since.
	pending int
	// seqs are the stream sequences of the jobs the queue published for
	// the consumer that it has not been seen to deliver, in the order
	// published.
	seqs []uint64
	// waiting is the last reading's Waiting, until a job is published
	// (which may fill the pull request that waited).
	waiting int
	// read is when it was last read (or its read failed).
	read time.Time
	// again asks for a reading as soon as the gate closes: the last one
	// let jobs through.
	again bool
	// broken holds a failed read's gate open until read + gateRetry.
	broken bool
}

// backlog is the gate's count of the consumer's undelivered jobs.
func (g *gate) backlog() int { return max(g.pending, len(g.seqs)) }

// open reports whether the gate lets a job through: the backlog, less a
// job for each pull request that waits, is below limit.
func (g *gate) open(limit int) bool { return g.backlog()-g.waiting < limit }

// track notes the stream sequence of a job published.
func (g *gate) track(seq uint64) {
	if len(g.seqs) >= maxTracked {
		g.seqs = slices.Delete(g.seqs, 0, len(g.seqs)-maxTracked+1)
	}
	g.seqs = append(g.seqs, seq)
}

// update takes a reading r.
func (g *gate) update(r Reading) {
	g.pending, g.waiting = r.Pending, r.Waiting
	g.seqs = slices.DeleteFunc(g.seqs, func(seq uint64) bool { return seq <= r.Delivered })
}

// gated reports whether the backlog gate is on.
func (q *Queue) gated() bool { return q.Backlog != nil && q.Options.FetchBacklog > 0 }

// gateOf is consumer's gate, made on first use.
func (q *Queue) gateOf(consumer string) *gate {
	g := q.gates[consumer]
	if g == nil {
		g = &gate{}
		q.gates[consumer] = g
	}
	return g
}

// passes reports whether p, of namespace t, may go on the bus now as far as
// the gate is concerned: the gate is off, its namespace has nothing in
// flight, or its consumer's backlog is below the limit.
func (q *Queue) passes(t *tenant, p *pending) bool {
	if !q.gated() || t.inFlight == 0 {
		return true
	}
	g := q.gateOf(p.consumer)
	if g.broken && q.now().Before(g.read.Add(gateRetry)) {
		return true
	}
	return g.open(q.Options.FetchBacklog)
}

// published counts a job taken for the bus for consumer on top of its
// gate's last reading (before it is sent: the count is never behind).
func (q *Queue) published(consumer string) {
	if q.gated() {
		g := q.gateOf(consumer)
		g.pending++
		g.waiting = 0
	}
}

// send publishes p's job on the bus and, when Next tells its stream
// sequence, notes it in its consumer's gate.
func (q *Queue) send(ctx context.Context, p *pending) error {
	sp, ok := q.Next.(SeqPublisher)
	if !ok || !q.gated() {
		return q.Next.Publish(ctx, p.subject, p.eventType, p.job, p.data)
	}
	seq, err := sp.PublishSeq(ctx, p.subject, p.eventType, p.job, p.data)
	if err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.gates != nil {
		q.gateOf(p.consumer).track(seq)
	}
	return nil
}

// hold counts p as held back by the gate, once.
func (q *Queue) hold(p *pending) {
	if !p.gated {
		p.gated = true
		q.Metrics.heldByGate()
	}
}

// readGates reads the backlog of the consumers whose gates hold jobs
// (held), those whose reading is due. It reports whether a reading opened
// a gate (the dispatcher tries again at once) and, when none did, how
// long until the next reading is due (0: none is).
func (q *Queue) readGates(ctx context.Context, held []string) (opened bool, next time.Duration) {
	for _, consumer := range held {
		q.mu.Lock()
		g := q.gateOf(consumer)
		due := g.read.Add(gatePoll)
		if g.broken {
			due = g.read.Add(gateRetry)
		}
		now := q.now()
		if !g.again && now.Before(due) {
			if wait := due.Sub(now); next == 0 || wait < next {
				next = wait
			}
			q.mu.Unlock()
			continue
		}
		q.mu.Unlock()

		r, err := q.Backlog.Read(ctx, consumer)
		if ctx.Err() != nil {
			// Stopping: not the backlog's failure.
			return false, 0
		}

		q.mu.Lock()
		g = q.gateOf(consumer)
		g.read, g.again, g.broken = q.now(), false, err != nil
		if err != nil {
			// Open until gateRetry: the next reading is due then.
			g.pending, g.seqs, g.waiting = 0, nil, 0
			q.Log.Error(err, "reading the fetch backlog failed; publishing without the gate for a while", "consumer", consumer, "retry", gateRetry)
			q.Metrics.backlogReadFailed()
		} else {
			g.update(r)
			q.Metrics.backlog(consumer, g.backlog())
		}
		if g.broken || g.open(q.Options.FetchBacklog) {
			g.again = !g.broken
			opened = true
		} else if next == 0 || gatePoll < next {
			next = gatePoll
		}
		q.mu.Unlock()
	}
	return opened, next
}
