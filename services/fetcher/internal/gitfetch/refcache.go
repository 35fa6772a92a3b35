package gitfetch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// DefaultRefCacheTTL is how long a remote's reference listing is reused by
// default (the fetcher's -ref-cache-ttl).
const DefaultRefCacheTTL = 2 * time.Second

// DefaultRefCacheEntries bounds the listings a RefCache keeps by default.
const DefaultRefCacheEntries = 4096

// Results of a listing request, the result label of
// headwater_git_ref_listings_total.
const (
	// ListingListed: the remote was asked.
	ListingListed = "listed"
	// ListingShared: a listing in flight or younger than the TTL answered.
	ListingShared = "shared"
)

// RefCache shares reference listings between the fetches of one fetcher:
// a fetch that needs the listing of a remote joins a listing of the same
// remote already in flight, or takes one that finished less than TTL ago,
// instead of asking the remote again. A thousand sources of one
// repository thus cost one listing per TTL, not a thousand.
//
// Listings are keyed by the URL and a fingerprint of everything the fetch
// authenticates and connects with (the Secrets' content, the proxy), so a
// listing obtained with one source's credentials never answers a source
// with other ones. A fetch may also demand a listing that started after a
// given time (a reconcile the user requested after a push must see the
// push). A failed listing answers only the fetches that waited for it.
//
// An expired listing is dropped at the first request that comes a TTL or
// more after the previous sweep, so a fetcher that listed thousands of
// repositories once does not keep their listings; and the cache never
// holds more than MaxEntries finished listings, dropping the oldest.
//
// A nil *RefCache, or one with a TTL of zero, shares nothing.
type RefCache struct {
	ttl     time.Duration
	max     int
	now     func() time.Time
	listed  prometheus.Counter
	shared  prometheus.Counter
	mu      sync.Mutex
	entries map[string]*refEntry
	// swept is when expired listings were last dropped.
	swept time.Time
}

// refEntry is one listing, in flight until done is closed.
type refEntry struct {
	done    chan struct{}
	adv     *advertised
	err     error
	started time.Time // when it was asked for
	at      time.Time // when it finished
}

// NewRefCache returns a cache that reuses a listing for ttl and keeps at
// most maxEntries (DefaultRefCacheEntries when not positive). It registers
// headwater_git_ref_listings_total{result} on reg when reg is not nil.
func NewRefCache(ttl time.Duration, maxEntries int, reg prometheus.Registerer) *RefCache {
	if maxEntries <= 0 {
		maxEntries = DefaultRefCacheEntries
	}
	listings := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Name: "git_ref_listings_total",
		Help: "Reference listings of Git remotes needed by fetches, by result: listed (the remote was asked) or shared (a recent or concurrent listing answered).",
	}, []string{"result"})
	if reg != nil {
		reg.MustRegister(listings)
	}
	return &RefCache{
		ttl: ttl, max: maxEntries, now: time.Now,
		listed: listings.WithLabelValues(ListingListed), shared: listings.WithLabelValues(ListingShared),
		entries: map[string]*refEntry{},
	}
}

// list returns the listing of key, calling fn for it unless a listing in
// flight or younger than the TTL, started at notBefore or later, can
// answer (a zero notBefore accepts any). fn runs detached from the
// cancellation of ctx (other fetches may be waiting for it) but within its
// deadline; the caller stops waiting when ctx ends. The result is shared:
// it must not be modified.
func (c *RefCache) list(ctx context.Context, key string, notBefore time.Time,
	fn func(context.Context) (*advertised, error)) (*advertised, error) {
	if c == nil || c.ttl <= 0 {
		return fn(ctx)
	}
	c.mu.Lock()
	e, ok := c.entries[key]
	if ok && (!c.usable(e) || e.started.Before(notBefore)) {
		ok = false
	}
	leader := !ok
	if ok {
		c.shared.Inc()
	} else {
		e = &refEntry{done: make(chan struct{}), started: c.now()}
		c.entries[key] = e
		c.evict(e.started)
		c.listed.Inc()
		lctx := context.WithoutCancel(ctx)
		cancel := context.CancelFunc(func() {})
		if deadline, has := ctx.Deadline(); has {
			lctx, cancel = context.WithDeadline(lctx, deadline)
		}
		go func() {
			defer cancel()
			adv, err := fn(lctx)
			c.mu.Lock()
			e.adv, e.err, e.at = adv, err, c.now()
			if err != nil && c.entries[key] == e {
				// Only the fetches already waiting see a failure.
				delete(c.entries, key)
			}
			c.mu.Unlock()
			close(e.done)
		}()
	}
	c.mu.Unlock()
	select {
	case <-e.done:
		return e.adv, e.err
	case <-ctx.Done():
	}
	if leader && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// The listing runs to the same deadline and says why it failed
		// (a handshake that never finished, say) better than "deadline
		// exceeded": wait a moment for its words.
		t := time.NewTimer(leaderGrace)
		defer t.Stop()
		select {
		case <-e.done:
			return e.adv, e.err
		case <-t.C:
		}
	}
	return nil, ctx.Err()
}

// leaderGrace is how long the caller that started a listing waits for it
// after their common deadline.
const leaderGrace = 5 * time.Second

// usable reports whether e is in flight or a success younger than the TTL.
// c.mu is held.
func (c *RefCache) usable(e *refEntry) bool {
	select {
	case <-e.done:
		return e.err == nil && c.now().Sub(e.at) < c.ttl
	default:
		return true
	}
}

// evict drops finished listings past the TTL, when a TTL has passed since
// it last did or the cache is over max, then the oldest finished ones
// until at most max remain; a sweep costs one pass over at most max
// entries once per TTL. Listings in flight stay. c.mu is held.
func (c *RefCache) evict(now time.Time) {
	if len(c.entries) > c.max || now.Sub(c.swept) >= c.ttl {
		c.swept = now
		for k, e := range c.entries {
			if !c.usable(e) {
				delete(c.entries, k)
			}
		}
	}
	for len(c.entries) > c.max {
		oldestKey, oldest := "", (*refEntry)(nil)
		for k, e := range c.entries {
			select {
			case <-e.done:
				if oldest == nil || e.at.Before(oldest.at) {
					oldestKey, oldest = k, e
				}
			default:
			}
		}
		if oldest == nil {
			return // all in flight
		}
		delete(c.entries, oldestKey)
	}
}

// Len is the number of listings the cache holds, in flight or finished.
func (c *RefCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
