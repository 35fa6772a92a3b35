// Package providertoken obtains the short-lived access tokens a fetch
// authenticates with when a source names a provider: GitHub App
// installation tokens (a GitHub App's JWT exchanged at the GitHub API) and
// Microsoft Entra ID access tokens (the fetcher's workload identity
// exchanged at the Entra token endpoint), as Flux's fluxcd/pkg/auth does,
// and keeps them in a bounded Cache until shortly before they expire.
//
// Each fetcher replica keeps its own cache, as each Flux source-controller
// does: tokens are credentials and never travel on the bus.
package providertoken

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// DefaultCacheEntries bounds the tokens a Cache keeps by default. A token
// is per identity (an App installation with its key, the fetcher's Azure
// identity and scope), not per source, so few are needed.
const DefaultCacheEntries = 1024

// DefaultMaxDuration bounds how long a token is reused, whatever its
// lifetime, unless WithMaxDuration says otherwise (Flux's default of
// --token-cache-max-duration).
const DefaultMaxDuration = time.Hour

// Results of a token request, the result label of
// headwater_provider_tokens_total.
const (
	// ResultMinted: the provider issued a new token.
	ResultMinted = "minted"
	// ResultCached: a cached token, or one being minted for another fetch,
	// answered.
	ResultCached = "cached"
	// ResultFailed: the provider did not issue a token.
	ResultFailed = "failed"
)

// Token is an access token and when it expires.
type Token struct {
	// Value is the secret token. It is never logged.
	Value string
	// ExpiresAt is when the provider stops accepting it.
	ExpiresAt time.Time
}

// Cache keeps tokens by key until 80% of their lifetime has passed (the
// threshold kubelet rotates service account tokens at, and Flux's token
// cache uses), at most its maximum duration (DefaultMaxDuration unless
// WithMaxDuration sets another). Concurrent requests for one key
// share a single mint; a failed mint is not cached. It keeps at most
// MaxEntries tokens, dropping expired ones first, then those that expire
// soonest. It is safe for concurrent use; a nil *Cache mints every time.
type Cache struct {
	max     int
	maxAge  time.Duration
	now     func() time.Time
	metrics *prometheus.CounterVec
	mu      sync.Mutex
	entries map[string]*entry
}

// entry is one key's token, being minted until done is closed.
type entry struct {
	done  chan struct{}
	token Token
	err   error
	// reuseUntil is when the token stops being handed out.
	reuseUntil time.Time
}

// NewCache returns a cache of at most maxEntries tokens
// (DefaultCacheEntries when not positive). It registers
// headwater_provider_tokens_total{provider,result} on reg when reg is not
// nil.
func NewCache(maxEntries int, reg prometheus.Registerer) *Cache {
	if maxEntries <= 0 {
		maxEntries = DefaultCacheEntries
	}
	return &Cache{max: maxEntries, maxAge: DefaultMaxDuration, now: time.Now, metrics: newMetrics(reg), entries: map[string]*entry{}}
}

// WithMaxDuration sets the longest a token is reused, whatever its
// lifetime (Flux's --token-cache-max-duration), when d is positive, and
// returns c. Call it before the cache is used.
func (c *Cache) WithMaxDuration(d time.Duration) *Cache {
	if c != nil && d > 0 {
		c.maxAge = d
	}
	return c
}

// newMetrics makes, and registers on reg when it is not nil, the counter
// of token requests.
func newMetrics(reg prometheus.Registerer) *prometheus.CounterVec {
	m := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Name: "provider_tokens_total",
		Help: "Access tokens fetches asked for to authenticate with a provider (github, azure, aws, gcp), by result: minted (the provider issued one), cached (a cached or in-flight one answered) or failed.",
	}, []string{"provider", "result"})
	if reg != nil {
		reg.MustRegister(m)
	}
	return m
}

// Key derives a cache key from parts (say, an App ID, an installation, a
// base URL and the private key), so secrets in them are not kept in the
// clear as map keys.
func Key(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Get returns the token of key for provider, calling mint unless a
// reusable token is cached or being minted. mint runs detached from the
// cancellation of ctx (other fetches may be waiting for it) but within
// its deadline; the caller stops waiting when ctx ends.
func (c *Cache) Get(ctx context.Context, provider, key string, mint func(context.Context) (Token, error)) (Token, error) {
	if c == nil {
		return mint(ctx)
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("provider", provider)
	c.mu.Lock()
	e, ok := c.entries[key]
	if ok && !c.reusable(e) {
		ok = false
	}
	if !ok {
		e = &entry{done: make(chan struct{})}
		c.evict()
		c.entries[key] = e
	}
	c.mu.Unlock()

	if ok {
		select {
		case <-e.done:
		case <-ctx.Done():
			return Token{}, ctx.Err()
		}
		if e.err == nil {
			c.metrics.WithLabelValues(provider, ResultCached).Inc()
		}
		return e.token, e.err
	}

	mctx := context.WithoutCancel(ctx)
	if deadline, has := ctx.Deadline(); has {
		var cancel context.CancelFunc
		mctx, cancel = context.WithDeadline(mctx, deadline)
		defer cancel()
	}
	t, err := mint(mctx)
	c.mu.Lock()
	e.token, e.err = t, err
	if err == nil {
		e.reuseUntil = c.reuseUntil(t)
	} else if c.entries[key] == e {
		// Only the fetches that waited share a failure.
		delete(c.entries, key)
	}
	close(e.done)
	c.mu.Unlock()
	if err != nil {
		c.metrics.WithLabelValues(provider, ResultFailed).Inc()
		return Token{}, err
	}
	c.metrics.WithLabelValues(provider, ResultMinted).Inc()
	log.V(1).Info("minted provider token", "expiresAt", t.ExpiresAt.UTC().Format(time.RFC3339))
	return t, nil
}

// reuseUntil is when a token minted now stops being reused: after 80% of
// its lifetime, at most the cache's maximum duration from now.
func (c *Cache) reuseUntil(t Token) time.Time {
	now := c.now()
	d := t.ExpiresAt.Sub(now) * 8 / 10
	return now.Add(min(d, c.maxAge))
}

// reusable reports whether e is in flight or holds a token to hand out.
// c.mu is held.
func (c *Cache) reusable(e *entry) bool {
	select {
	case <-e.done:
		return e.err == nil && c.now().Before(e.reuseUntil)
	default:
		return true
	}
}

// evict makes room for one entry: it drops every finished entry that is
// no longer reusable, then, while the cache is full, the finished entry
// that stops being reusable first. c.mu is held.
func (c *Cache) evict() {
	for k, e := range c.entries {
		if !c.reusable(e) {
			delete(c.entries, k)
		}
	}
	for len(c.entries) >= c.max {
		victim := ""
		var until time.Time
		for k, e := range c.entries {
			select {
			case <-e.done:
			default:
				continue // in flight: others are waiting for it
			}
			if victim == "" || e.reuseUntil.Before(until) {
				victim, until = k, e.reuseUntil
			}
		}
		if victim == "" {
			return // every entry is in flight; allow one more
		}
		delete(c.entries, victim)
	}
}

// Len reports how many tokens, minted or in flight, the cache holds.
func (c *Cache) Len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
