package hook

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// DefaultTokenTTL is how long a token read from its Secret is used before
// it is read again.
const DefaultTokenTTL = time.Minute

// TokenCache keeps the tokens its Source reads for TTL, so a burst of
// hooks costs the API server one read per Receiver Secret, not one per
// request. The receiver may only get Secrets, never list or watch them (an
// informer would hold every Secret of the cluster in an internet-facing
// pod), so a changed token is seen when its entry expires, or at once
// when a request does not validate with the cached one (Refresh): a
// rotated token works with the first request signed by it. Reads are
// bounded by the handler's rate limit per Receiver.
type TokenCache struct {
	// Source reads a token from the API server (SecretTokens).
	Source Tokens
	// TTL is how long a token is used; DefaultTokenTTL when zero.
	TTL time.Duration
	// Now returns the current time; time.Now when nil.
	Now func() time.Time

	mu      sync.Mutex
	entries map[string]tokenEntry
	reads   prometheus.Counter
}

type tokenEntry struct {
	token   []byte
	expires time.Time
}

// Register registers headwater_receiver_secret_reads_total on reg.
func (c *TokenCache) Register(reg prometheus.Registerer) {
	c.reads = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Name: "receiver_secret_reads_total",
		Help: "Reads of Receivers' token Secrets from the API server (the others are answered from the cache).",
	})
	reg.MustRegister(c.reads)
}

// Token implements Tokens: the cached token while it is fresh, else a
// new read. Failed reads are not cached.
func (c *TokenCache) Token(ctx context.Context, namespace, name string) ([]byte, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[namespace+"/"+name]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.token, nil
	}
	return c.Refresh(ctx, namespace, name)
}

// Refresh reads the token again and caches it, whatever the cache holds:
// what the handler does when a request does not validate with a cached
// token, in case it was rotated.
func (c *TokenCache) Refresh(ctx context.Context, namespace, name string) ([]byte, error) {
	if c.reads != nil {
		c.reads.Inc()
	}
	key := namespace + "/" + name
	token, err := c.Source.Token(ctx, namespace, name)
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	// Drop what expired (the Secrets of deleted Receivers among them).
	for k, e := range c.entries {
		if !now.Before(e.expires) {
			delete(c.entries, k)
		}
	}
	if err != nil {
		delete(c.entries, key)
		return nil, err
	}
	if c.entries == nil {
		c.entries = map[string]tokenEntry{}
	}
	ttl := c.TTL
	if ttl <= 0 {
		ttl = DefaultTokenTTL
	}
	c.entries[key] = tokenEntry{token: bytes.Clone(token), expires: now.Add(ttl)}
	return token, nil
}

func (c *TokenCache) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}
