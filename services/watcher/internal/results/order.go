package results

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
)

// order keeps, for each source, when the newest job whose outcome this
// watcher wrote into its status was requested, so that the outcome of an
// older job that arrives after it does not move the source back: a
// fetcher or packager cut off from the bus (its node's network lost) that
// finishes its job once it is back, after the job was done again
// elsewhere and a newer one reported, or a job left running past a newer
// one's. Artifacts alone cannot order them: an artifact's lastUpdateTime
// is when it was stored, so the late job's older revision carries the
// newer time.
//
// It also writes the outcomes of one source one at a time, so that two
// arriving together cannot both pass the check and the older land last.
//
// The order lives in memory, and in store when one is set
// (events.OrderBucket): a new leader, or the shard a source moved to,
// reads a source's entry from store before it writes the source's first
// outcome, so that an older job's outcome arriving after a leader change
// is not written either (docs/design.md, "Outcomes are written in job
// order").
type order struct {
	// store keeps the order beyond this process; nil keeps it in
	// memory only.
	store OrderStore
	// since is when this process began to write outcomes: its own jobs
	// were all requested after it. An entry read from store, written by
	// another process (another clock), is taken as no later than since,
	// so that a clock behind the previous leader's cannot make this
	// process's own jobs look older than the previous leader's.
	since time.Time

	mu      sync.Mutex
	sources map[types.UID]*sourceOrder
}

// OrderStore keeps, beyond one watcher process, when the newest job whose
// outcome was written for each source was requested.
type OrderStore interface {
	// Load returns source uid's entry, zero when it has none.
	Load(ctx context.Context, uid types.UID) (time.Time, error)
	// Store records that the outcome of a job requested at requested was
	// written for source uid.
	Store(ctx context.Context, uid types.UID, requested time.Time) error
	// Forget drops source uid's entry (the source is deleted).
	Forget(ctx context.Context, uid types.UID) error
}

// sourceOrder is one source's entry: its lock, held while one of its
// outcomes is checked and written, and the request time of the newest job
// written.
type sourceOrder struct {
	mu     sync.Mutex
	newest time.Time
	// loaded says the store's entry was read into newest.
	loaded bool
	// users counts the outcomes holding or waiting for mu: an entry with
	// none and nothing written is dropped.
	users int
}

// lock returns the entry of source uid, locked, for the outcome of a job
// requested at requested. The store's entry is read into it the first
// time an outcome of a job older than since comes: only such a job can
// be older than one a previous leader wrote, since the store's entry
// counts as no later than since, and once an outcome of a job of this
// process is written it supersedes whatever the store held. So a leader
// reads the store for the late results of its predecessors' jobs alone,
// not for every source. An error reading it is returned, with the entry
// unlocked.
func (o *order) lock(ctx context.Context, uid types.UID, requested time.Time) (*sourceOrder, error) {
	o.mu.Lock()
	if o.sources == nil {
		o.sources = map[types.UID]*sourceOrder{}
	}
	s := o.sources[uid]
	if s == nil {
		s = &sourceOrder{}
		o.sources[uid] = s
	}
	s.users++
	o.mu.Unlock()
	s.mu.Lock()
	if s.loaded || o.store == nil || !requested.Before(o.since) || !s.newest.Before(o.since) {
		// Read before; or no store; or a job of this process, or one
		// written already: the store's entry, no later than since,
		// cannot supersede it.
		return s, nil
	}
	stored, err := o.store.Load(ctx, uid)
	if err != nil {
		o.unlock(uid, s)
		return nil, fmt.Errorf("read the outcome order of %s: %w", uid, err)
	}
	if !o.since.IsZero() && stored.After(o.since) {
		stored = o.since
	}
	if stored.After(s.newest) {
		s.newest = stored
	}
	s.loaded = true
	return s, nil
}

// unlock releases the entry of source uid that lock returned.
func (o *order) unlock(uid types.UID, s *sourceOrder) {
	s.mu.Unlock()
	o.mu.Lock()
	defer o.mu.Unlock()
	s.users--
	if s.users == 0 && s.newest.IsZero() {
		delete(o.sources, uid)
	}
}

// superseded reports whether a job requested at requested is older than
// the newest job whose outcome was written for the source of s (locked).
func (s *sourceOrder) superseded(requested time.Time) bool {
	return requested.Before(s.newest)
}

// written records that the outcome of a job requested at requested was
// written for source uid, whose entry s is locked, in memory and in the
// store. An error from the store is returned, with the memory entry
// written: the outcome is written, and this process keeps its order.
func (o *order) written(ctx context.Context, uid types.UID, s *sourceOrder, requested time.Time) error {
	if !requested.After(s.newest) {
		return nil
	}
	s.newest = requested
	if o.store == nil {
		return nil
	}
	if err := o.store.Store(ctx, uid, requested); err != nil {
		return fmt.Errorf("record the outcome order of %s: %w", uid, err)
	}
	return nil
}

// forget drops source uid, deleted, in the store and in memory, where its
// entry goes once no outcome holds it.
func (o *order) forget(ctx context.Context, uid types.UID) error {
	o.mu.Lock()
	if s := o.sources[uid]; s != nil && s.users == 0 {
		delete(o.sources, uid)
	}
	o.mu.Unlock()
	if o.store == nil {
		return nil
	}
	if err := o.store.Forget(ctx, uid); err != nil {
		return fmt.Errorf("forget the outcome order of %s: %w", uid, err)
	}
	return nil
}

// len is the number of sources with an entry.
func (o *order) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.sources)
}

// NewSupersededCounter registers headwater_superseded_outcomes_total on
// reg: the outcomes not written because the outcome of a newer job of the
// same source was written first.
func NewSupersededCounter(reg prometheus.Registerer) prometheus.Counter {
	return newCounter(reg, "superseded_outcomes_total",
		"Job outcomes not written into status because a newer job's outcome for the same source was written first (a job that finished late, e.g. on a node cut off from the bus).")
}
