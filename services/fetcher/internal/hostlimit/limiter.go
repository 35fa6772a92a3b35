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

	// plainHTTP holds the hosts that answered a TLS handshake in plain
	// HTTP, until when they are believed to (see Transport).
	plainHTTP sync.Map
}

func (l *Limiter) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// Acquire takes a request slot for host: at once, or after a wait of at
// most MaxWait (a timer, not a loop), for a hold of the host to end or
// for a slot of its bucket. It returns a *HeldError, without taking a
// slot, while the host is held beyond MaxWait or when the next slot is
// further than MaxWait; ctx's error if ctx ends while it waits. A store
// that fails lets the request go.
func (l *Limiter) Acquire(ctx context.Context, host string) error {
	host = strings.ToLower(host)
	d := l.now().Add(l.MaxWait)
	if err := l.acquire(ctx, host, deadlines{hold: d, slot: d}); err != nil {
		return err
	}
	l.Metrics.request(host)
	return nil
}

// deadlines bound a request's wait: for a hold of its host to end, and
// for a slot of its host's bucket. A zero slot deadline waits as long as
// the slot takes.
type deadlines struct {
	hold, slot time.Time
}

// acquire is Acquire with a wait that ends by the deadlines.
func (l *Limiter) acquire(ctx context.Context, host string, by deadlines) error {
	var notBefore time.Time
	for {
		at, slot, err := l.take(ctx, host, by, notBefore)
		if err != nil {
			return err
		}
		if wait := at.Sub(l.now()); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			l.Metrics.waited(host, wait)
		}
		if slot {
			return nil
		}
		// The hold has ended (or was made longer meanwhile): look again,
		// at its end at the earliest, whatever the clock says.
		notBefore = at
	}
}

// take looks at host's state once, at the time of the clock or at
// notBefore, whichever is later. It takes a slot of the host's bucket,
// usable at at (slot true), or says the host is held until at, to look
// again then (slot false); a *HeldError when the hold is beyond by.hold or
// the slot beyond by.slot.
func (l *Limiter) take(ctx context.Context, host string, by deadlines, notBefore time.Time) (at time.Time, slot bool, err error) {
	rule := l.Rules.For(host)
	now := l.now()
	if notBefore.After(now) {
		now = notBefore
	}
	var held *HeldError
	_, err = l.Store.Update(ctx, host, func(s State) (State, bool) {
		at, slot, held = now, false, nil
		if s.HeldUntil.After(now) {
			if s.HeldUntil.After(by.hold) {
				held = &HeldError{Host: host, Until: s.HeldUntil, ByHost: true}
			} else {
				at = s.HeldUntil
			}
			return s, false
		}
		slot = true
		if rule.Rate <= 0 {
			return s, false
		}
		interval := time.Duration(float64(time.Second) / rule.Rate)
		tat := s.TAT
		if tat.Before(now) {
			tat = now
		}
		next := tat.Add(interval)
		if free := next.Add(-time.Duration(rule.Burst) * interval); free.After(now) {
			if !by.slot.IsZero() && free.After(by.slot) {
				slot, held = false, &HeldError{Host: host, Until: free}
				return s, false
			}
			at = free
		}
		s.TAT = next
		return s, true
	})
	if err != nil {
		l.Log.Error(err, "host limits cannot be read: the request goes unlimited", "host", host)
		return now, true, nil
	}
	if held != nil {
		l.Metrics.throttled(host, held.ByHost)
		noteHeld(ctx, held)
		return now, false, held
	}
	return at, slot, nil
}

// plainHTTPMemory is how long the limiter remembers that a host answered
// a TLS handshake in plain HTTP.
const plainHTTPMemory = 10 * time.Minute

// notePlainHTTP records that host answered a TLS handshake in plain HTTP:
// an HTTPS request to it never reaches its HTTP layer.
func (l *Limiter) notePlainHTTP(host string) {
	l.plainHTTP.Store(host, l.now().Add(plainHTTPMemory))
}

// speaksPlainHTTP reports whether host answered a TLS handshake in plain
// HTTP within the last plainHTTPMemory.
func (l *Limiter) speaksPlainHTTP(host string) bool {
	v, ok := l.plainHTTP.Load(host)
	if !ok {
		return false
	}
	if l.now().After(v.(time.Time)) {
		l.plainHTTP.Delete(host)
		return false
	}
	return true
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
// error the HTTP library made of it, and the hosts that admitted the fetch.
//
// A fetch is admitted to a host by its first request there, which waits
// for a slot of the host's bucket at most the limiter's MaxWait. Its later
// requests to that host (a clone's pack after its reference listing, the
// chart after the index) queue for their slots for as long as the fetch
// may run: refusing them would throw away the requests the fetch already
// made, and its retry would make them again. So under load the limiter
// refuses whole fetches at their door, never halfway, and a host serves
// each fetch's requests once.
type Tracker struct {
	mu       sync.Mutex
	held     *HeldError
	admitted map[string]bool
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

// tracker returns the Tracker of ctx's fetch, or nil.
func tracker(ctx context.Context) *Tracker {
	t, _ := ctx.Value(trackerKey{}).(*Tracker)
	return t
}

// isAdmitted reports whether the fetch was admitted to host; false for a
// nil Tracker.
func (t *Tracker) isAdmitted(host string) bool {
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.admitted[host]
}

// admit records that host admitted the fetch; nothing for a nil Tracker.
func (t *Tracker) admit(host string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.admitted == nil {
		t.admitted = map[string]bool{}
	}
	t.admitted[host] = true
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
