package fetch

import (
	"context"
	"sync"
	"time"

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
//
// A fetch that arrives just after the leader landed, before the packager
// recorded the content in the content cache, finds the landing (landed)
// and copies the staged content if the packager has not deleted it yet.
type inflight struct {
	mu      sync.Mutex
	flights map[string]*flight
	// landed holds the staged job of flights that landed within
	// landedFor, by key.
	landed map[string]landing
}

// landedFor is how long a landed flight's staged content is offered to
// late fetches of its content: longer than the packager takes to record
// the content in the content cache, after which the cache serves them.
const landedFor = time.Minute

// landing is a flight's staged job and when it landed.
type landing struct {
	staged *events.Fetched
	at     time.Time
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
	now := time.Now()
	f.mu.Lock()
	delete(f.flights, key)
	for k, l := range f.landed {
		if now.Sub(l.at) > landedFor {
			delete(f.landed, k)
		}
	}
	if staged != nil {
		if f.landed == nil {
			f.landed = map[string]landing{}
		}
		f.landed[key] = landing{staged: staged, at: now}
	}
	f.mu.Unlock()
	fl.staged = staged
	close(fl.done)
	fl.copies.Wait()
}

// recent returns the staged job of the flight of key that landed within
// landedFor, or nil. Its staged content may be gone already: the
// packager deletes it once packaged.
func (f *inflight) recent(key string) *events.Fetched {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l, ok := f.landed[key]; ok && time.Since(l.at) <= landedFor {
		return l.staged
	}
	return nil
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
