package fairshare

import (
	"context"
	"fmt"
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
// FetchBacklog jobs (and the fetchers' own fetch-ahead) whatever the other
// tenants have due.
//
// The watcher cannot see a fetcher take a job; it reads the consumer's
// state (one JetStream API request, $JS.API.CONSUMER.INFO) while jobs are
// held: every gatePoll while the fetchers are busy, at once again after a
// reading that let jobs through (the fetchers were taking them as fast as
// they came), so a gate never slows fetchers that have room. Between two
// readings the queue counts what it published on top of the last one.

// FetchBacklogFlag is the flag of Options.FetchBacklog.
const FetchBacklogFlag = "fair-share-fetch-backlog"

// DefaultFetchBacklog is the default of -fair-share-fetch-backlog: one job
// left undelivered is enough to keep the fetchers busy (each replica
// pulls -concurrency jobs ahead of its workers, and the gate is read
// again within gatePoll of a fetcher taking jobs), and it is the least a
// newly due namespace's first job finds ahead of it.
const DefaultFetchBacklog = 1

// gatePoll is how often a closed gate reads its consumer's backlog again:
// short against a fetch (a fetcher has -concurrency jobs pulled ahead),
// and 20 requests a second per fetch consumer at most, only while jobs
// are held.
const gatePoll = 50 * time.Millisecond

// gateRetry is how long a gate whose backlog could not be read lets every
// job through before it reads again: the gate is for fairness, and a
// consumer that cannot be read (not made yet, or NATS permissions that
// lack $JS.API.CONSUMER.INFO) must never hold jobs back for good.
const gateRetry = 5 * time.Second

// Backlog reads how many jobs of a fetch consumer no fetcher has taken.
type Backlog interface {
	// Pending is the number of jobs on the fetch stream for consumer not
	// yet delivered to any fetcher.
	Pending(ctx context.Context, consumer string) (int, error)
}

// ConsumerBacklog is Backlog over JetStream: the NumPending of the fetch
// consumer's state (the watcher may read it: $JS.API.CONSUMER.INFO on
// events.FetchStream).
type ConsumerBacklog struct {
	JS jetstream.JetStream
}

// Pending reads consumer's NumPending on events.FetchStream.
func (b ConsumerBacklog) Pending(ctx context.Context, consumer string) (int, error) {
	c, err := b.JS.Consumer(ctx, events.FetchStream, consumer)
	if err != nil {
		return 0, fmt.Errorf("read the backlog of %s on %s: %w", consumer, events.FetchStream, err)
	}
	return int(c.CachedInfo().NumPending), nil
}

// gate is one fetch consumer's backlog as the queue knows it.
type gate struct {
	// backlog is the last reading plus the jobs published since.
	backlog int
	// read is when it was last read (or its read failed).
	read time.Time
	// again asks for a reading as soon as the gate closes: the last one
	// let jobs through.
	again bool
	// broken holds a failed read's gate open until read + gateRetry.
	broken bool
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
	return g.backlog < q.Options.FetchBacklog
}

// published counts a job published for consumer on top of its gate's last
// reading.
func (q *Queue) published(consumer string) {
	if q.gated() {
		q.gateOf(consumer).backlog++
	}
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

		n, err := q.Backlog.Pending(ctx, consumer)

		q.mu.Lock()
		g = q.gateOf(consumer)
		g.read, g.again, g.broken = q.now(), false, err != nil
		if err != nil {
			// Open until gateRetry: the next reading is due then.
			g.backlog = 0
			q.Log.Error(err, "reading the fetch backlog failed; publishing without the gate for a while", "consumer", consumer, "retry", gateRetry)
			q.Metrics.backlogReadFailed()
		} else {
			g.backlog = n
			q.Metrics.backlog(consumer, n)
		}
		if g.broken || g.backlog < q.Options.FetchBacklog {
			g.again = !g.broken
			opened = true
		} else if next == 0 || gatePoll < next {
			next = gatePoll
		}
		q.mu.Unlock()
	}
	return opened, next
}
