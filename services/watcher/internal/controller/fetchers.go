package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// NoFetcherReason is the reason of FetchFailed for an object of a plug-in
// kind whose fetcher was never deployed: no consumer takes its jobs.
const NoFetcherReason = "NoFetcher"

// Fetchers tells whether a plug-in kind's fetcher has joined the bus: its
// durable consumer (events.PluginConsumer) exists on the fetch stream. A
// kind the watcher is configured with but whose fetcher is not deployed
// would otherwise leave its objects Reconciling for ever, their jobs
// waiting in the stream; with Fetchers they say why.
type Fetchers struct {
	// JS reads the fetch stream's consumers.
	JS jetstream.JetStream
	// Recheck is how long an answer that no fetcher serves a kind is
	// kept; a fetcher that joined is remembered for good (its consumer
	// outlives its processes).
	Recheck time.Duration

	mu     sync.Mutex
	served map[string]bool
	asked  map[string]time.Time
}

// Serves reports whether kind's fetcher has joined. A nil Fetchers serves
// every kind.
func (f *Fetchers) Serves(ctx context.Context, kind string) (bool, error) {
	if f == nil {
		return true, nil
	}
	f.mu.Lock()
	if f.served == nil {
		f.served, f.asked = map[string]bool{}, map[string]time.Time{}
	}
	served, asked := f.served[kind], f.asked[kind]
	f.mu.Unlock()
	if served || time.Since(asked) < f.Recheck {
		return served, nil
	}
	_, err := f.JS.Consumer(ctx, events.FetchStream, events.PluginConsumer(kind))
	switch {
	case err == nil:
		served = true
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		served = false
	default:
		return true, fmt.Errorf("look up the fetcher of %s: %w", kind, err)
	}
	f.mu.Lock()
	f.served[kind], f.asked[kind] = served, time.Now()
	f.mu.Unlock()
	return served, nil
}
