package results

import (
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
// It is memory: a new leader starts empty and orders from the first
// outcome it writes (docs/design.md, "Outcomes in job order").
type order struct {
	mu      sync.Mutex
	sources map[types.UID]*sourceOrder
}

// sourceOrder is one source's entry: its lock, held while one of its
// outcomes is checked and written, and the request time of the newest job
// written.
type sourceOrder struct {
	mu     sync.Mutex
	newest time.Time
	// users counts the outcomes holding or waiting for mu: an entry with
	// none and nothing written is dropped.
	users int
}

// lock returns the entry of source uid, locked.
func (o *order) lock(uid types.UID) *sourceOrder {
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
	return s
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
// written for the source of s (locked).
func (s *sourceOrder) written(requested time.Time) {
	if requested.After(s.newest) {
		s.newest = requested
	}
}

// forget drops source uid, deleted: its entry goes once no outcome holds
// it.
func (o *order) forget(uid types.UID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if s := o.sources[uid]; s != nil && s.users == 0 {
		delete(o.sources, uid)
	}
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
