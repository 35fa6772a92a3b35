package hostlimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// State is what the fetchers share about one host.
type State struct {
	// HeldUntil is when the host allows requests again, after it answered
	// 429 or 503 with Retry-After; zero when it never asked to wait.
	HeldUntil time.Time `json:"heldUntil,omitzero"`
	// TAT is the host's token bucket as GCRA keeps it: the theoretical
	// arrival time of the next request, which moves one emission interval
	// (1/rate) forward with every request taken; a request may go once
	// TAT is less than a burst's worth of intervals ahead.
	TAT time.Time `json:"tat,omitzero"`
}

// Store keeps the State of each host.
type Store interface {
	// Update reads host's state and passes it to change, which returns
	// the next state and whether to write it; a write is atomic with
	// respect to every other writer (change may be called again with a
	// newer state). Update returns the state change returned last.
	Update(ctx context.Context, host string, change func(State) (State, bool)) (State, error)
}

// MemoryStore keeps the states in the process: each fetcher replica
// limits on its own. Its zero value is ready to use.
type MemoryStore struct {
	mu     sync.Mutex
	states map[string]State
}

// Update implements Store.
func (m *MemoryStore) Update(_ context.Context, host string, change func(State) (State, bool)) (State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	next, write := change(m.states[host])
	if write {
		if m.states == nil {
			m.states = map[string]State{}
		}
		m.states[host] = next
	}
	return next, nil
}

// maxConflicts bounds the compare-and-set attempts of one update: each
// conflict means another replica took a request for the host meanwhile.
const maxConflicts = 32

// KVStore keeps the states in a NATS key-value bucket
// (events.HostBucket), one key per host, written with compare-and-set on
// the entry's revision, so every fetcher replica sees one limit. It
// remembers the last state and revision it read or wrote, so an update
// that meets no other writer costs one round trip to NATS.
type KVStore struct {
	// KV is the bucket.
	KV jetstream.KeyValue

	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	state    State
	revision uint64
}

// Key is the bucket key of a host: the lower-cased host, its port after
// an underscore, and the characters a key may not hold (an IPv6
// address's brackets and colons) as underscores.
func Key(host string) string {
	var b strings.Builder
	b.WriteString("host.")
	for _, r := range strings.ToLower(host) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Update implements Store.
func (s *KVStore) Update(ctx context.Context, host string, change func(State) (State, bool)) (State, error) {
	key := Key(host)
	s.mu.Lock()
	c, ok := s.cache[key]
	s.mu.Unlock()
	if !ok {
		var err error
		if c, err = s.get(ctx, key); err != nil {
			return State{}, err
		}
	}
	for range maxConflicts {
		next, write := change(c.state)
		if !write {
			return next, nil
		}
		data, err := json.Marshal(next)
		if err != nil {
			return State{}, fmt.Errorf("host state: %w", err)
		}
		var rev uint64
		if c.revision == 0 {
			rev, err = s.KV.Create(ctx, key, data)
		} else {
			rev, err = s.KV.Update(ctx, key, data, c.revision)
		}
		if err == nil {
			s.remember(key, cached{state: next, revision: rev})
			return next, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return State{}, fmt.Errorf("write host state %s: %w", key, err)
		}
		// Another replica wrote first (or the entry expired): read it.
		if c, err = s.get(ctx, key); err != nil {
			return State{}, err
		}
	}
	return State{}, fmt.Errorf("write host state %s: %d conflicting writers in a row", key, maxConflicts)
}

// get reads key's state and remembers it; a missing entry is the zero
// state at revision 0.
func (s *KVStore) get(ctx context.Context, key string) (cached, error) {
	e, err := s.KV.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		s.forget(key)
		return cached{}, nil
	case err != nil:
		return cached{}, fmt.Errorf("read host state %s: %w", key, err)
	}
	var st State
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		// A state no one can read is overwritten.
		st = State{}
	}
	c := cached{state: st, revision: e.Revision()}
	s.remember(key, c)
	return c, nil
}

func (s *KVStore) remember(key string, c cached) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache == nil {
		s.cache = map[string]cached{}
	}
	if old, ok := s.cache[key]; !ok || old.revision <= c.revision {
		s.cache[key] = c
	}
}

func (s *KVStore) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.cache, key)
}

// Watch keeps the remembered states current with every replica's writes
// until ctx ends, so that a host another replica holds is held here at
// once, even for a host without a rate limit (whose requests write
// nothing). It returns once the watch is set up.
func (s *KVStore) Watch(ctx context.Context) error {
	w, err := s.KV.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return fmt.Errorf("watch host states: %w", err)
	}
	go func() {
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					continue
				}
				if e.Operation() != jetstream.KeyValuePut {
					s.forget(e.Key())
					continue
				}
				var st State
				if json.Unmarshal(e.Value(), &st) == nil {
					s.remember(e.Key(), cached{state: st, revision: e.Revision()})
				}
			}
		}
	}()
	return nil
}
