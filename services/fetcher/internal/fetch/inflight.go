package fetch

import (
	"context"
	"sync"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// inflight joins fetches of the same content that run at the same time in
// this fetcher: the first (the leader) downloads and stages; the others
// (followers) wait for it, copy its staged content to their own staging
// key (a hard link or a server-side copy) and hand it to the packager, so
// a thousand sources of ten contents created at once cost ten downloads,
// not one per fetcher worker that starts before the content cache knows
// the content. Keys are content keys (contentcache.Key), so only sources
// that would reuse each other's artifact join.
type inflight struct {
	mu      sync.Mutex
	flights map[string]*flight
}

// flight is one download that others may join.
type flight struct {
	// done is closed when the leader staged its content or gave up.
	done chan struct{}
	// staged is the leader's Fetched job, nil when it failed.
	staged *events.Fetched
	// copies counts the followers still copying the staged content, which
	// the leader waits for before it hands the content to the packager
	// (who deletes it once packaged).
	copies sync.WaitGroup
}

// join returns the flight of key and whether the caller leads it.
func (f *inflight) join(key string) (fl *flight, leader bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.flights == nil {
		f.flights = map[string]*flight{}
	}
	if fl, ok := f.flights[key]; ok {
		fl.copies.Add(1)
		return fl, false
	}
	fl = &flight{done: make(chan struct{})}
	f.flights[key] = fl
	return fl, true
}

// land ends the leader's flight of key with its staged job (nil when it
// failed), lets the followers copy it, and waits until they have; later
// fetches of the key start their own flight (or find the content cache).
func (f *inflight) land(key string, fl *flight, staged *events.Fetched) {
	f.mu.Lock()
	delete(f.flights, key)
	f.mu.Unlock()
	fl.staged = staged
	close(fl.done)
	fl.copies.Wait()
}

// wait returns the leader's staged job, or nil when it failed or ctx ended
// first. The follower must call copied once it no longer needs the staged
// content.
func (fl *flight) wait(ctx context.Context) *events.Fetched {
	select {
	case <-fl.done:
		return fl.staged
	case <-ctx.Done():
		return nil
	}
}

// copied tells the leader a follower is done with its staged content.
func (fl *flight) copied() { fl.copies.Done() }
