package hostlimit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// DefaultMaxWait is how long a request waits for its host's token bucket
// before the fetch answers that the host is rate limited (the fetcher's
// -rate-limit-max-wait).
const DefaultMaxWait = 10 * time.Second

// HeldError says a request was not sent: its host asked to wait
// (Retry-After) or its token bucket has no slot within the limiter's
// MaxWait. Until is when a request may go.
type HeldError struct {
	// Host is the host, as the request named it ("github.com",
	// "registry.local:5000").
	Host string
	// Until is when the host takes a request again.
	Until time.Time
	// ByHost is true when the host itself asked to wait (a 429 or 503
	// with Retry-After), false when the fetcher's own limit holds it.
	ByHost bool
}

// Error says which host limits and until when.
func (e *HeldError) Error() string {
	who := "the host"
	if !e.ByHost {
		who = "the fetcher's limit for the host"
	}
	return fmt.Sprintf("rate limited by %s (%s) until %s", e.Host, who, e.Until.UTC().Format(time.RFC3339))
}

// Limiter decides, per host, whether and when a request may go.
type Limiter struct {
	// Rules are the token buckets by host pattern.
	Rules Rules
	// Store keeps each host's state; shared by every replica when it is a
	// KVStore.
	Store Store
	// MaxWait bounds the wait for a slot of the host's bucket; longer,
	// and the request is refused with a *HeldError.
	MaxWait time.Duration
	// Metrics, when set, counts requests, refusals, holds and waits.
	Metrics *Metrics
	// Log reports a store that cannot be reached (requests then go
	// unlimited: a limiter must not stop every fetch).
	Log logr.Logger
	// Now returns the time; time.Now when nil.
	Now func() time.Time
}

func (l *Limiter) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// Acquire takes a request slot for host: at once, or after a wait of at
// most MaxWait (a timer, not a loop). It returns a *HeldError, without
// taking a slot, while the host is held or when the next slot is further
// than MaxWait; ctx's error if ctx ends while it waits. A store that
// fails lets the request go.
func (l *Limiter) Acquire(ctx context.Context, host string) error {
	host = strings.ToLower(host)
	rule := l.Rules.For(host)
	now := l.now()
	var wait time.Duration
	var held *HeldError
	_, err := l.Store.Update(ctx, host, func(s State) (State, bool) {
		wait, held = 0, nil
		if s.HeldUntil.After(now) {
			held = &HeldError{Host: host, Until: s.HeldUntil, ByHost: true}
			return s, false
		}
		if rule.Rate <= 0 {
			return s, false
		}
		interval := time.Duration(float64(time.Second) / rule.Rate)
		tat := s.TAT
		if tat.Before(now) {
			tat = now
		}
		next := tat.Add(interval)
		at := next.Add(-time.Duration(rule.Burst) * interval)
		if d := at.Sub(now); d > 0 {
			if d > l.MaxWait {
				held = &HeldError{Host: host, Until: at}
				return s, false
			}
			wait = d
		}
		s.TAT = next
		return s, true
	})
	if err != nil {
		l.Log.Error(err, "host limits cannot be read: the request goes unlimited", "host", host)
		l.Metrics.request(host)
		return nil
	}
	if held != nil {
		l.Metrics.throttled(host, held.ByHost)
		noteHeld(ctx, held)
		return held
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		l.Metrics.waited(host, wait)
	}
	l.Metrics.request(host)
	return nil
}

// Hold records that host asked to be left alone until until; every
// replica sharing the store holds its requests for it until then.
func (l *Limiter) Hold(ctx context.Context, host string, until time.Time) error {
	host = strings.ToLower(host)
	_, err := l.Store.Update(ctx, host, func(s State) (State, bool) {
		if !until.After(s.HeldUntil) {
			return s, false
		}
		s.HeldUntil = until
		return s, true
	})
	if err != nil {
		return fmt.Errorf("hold %s: %w", host, err)
	}
	return nil
}

// trackerKey keys a *Tracker in a context.
type trackerKey struct{}

// Tracker remembers, for one fetch, the last host that held one of its
// requests, so the fetch can answer "rate limited" rather than with the
// error the HTTP library made of it.
type Tracker struct {
	mu   sync.Mutex
	held *HeldError
}

// Track returns a context whose requests report holds to the returned
// Tracker.
func Track(ctx context.Context) (context.Context, *Tracker) {
	t := &Tracker{}
	return context.WithValue(ctx, trackerKey{}, t), t
}

// Held returns the latest hold met by the fetch's requests, or nil.
func (t *Tracker) Held() *HeldError {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.held
}

func noteHeld(ctx context.Context, h *HeldError) {
	if t, ok := ctx.Value(trackerKey{}).(*Tracker); ok {
		t.mu.Lock()
		if t.held == nil || h.Until.After(t.held.Until) {
			t.held = h
		}
		t.mu.Unlock()
	}
}
