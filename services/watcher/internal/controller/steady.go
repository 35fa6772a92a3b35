package controller

import (
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"k8s.io/apimachinery/pkg/types"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/services/watcher/internal/sourcekind"
	"github.com/headwater-gitops/headwater/services/watcher/internal/status"
)

// DefaultAnnounceInterval is how often, at least, a steady source's
// reconcile is reported on the bus even when nothing changed (the
// watcher's -unchanged-announce-interval).
const DefaultAnnounceInterval = 10 * time.Minute

// Steady decides which reconciles are quiet (events.FetchRequested.Quiet):
// those of a steady source (status.Steady) whose artifact URL is the one
// the artifact-server advertises now and which was announced less than
// Announce ago. A quiet job's unchanged outcome is not published, so a
// steady source costs one bus message per interval; every Announce it
// takes the whole path, which announces artifact.unchanged to subscribers
// and records Flux's no-change trace Event.
//
// The advertised address is learned from the address every artifact-server
// announces when it starts (Listen) and from the artifacts announced
// (Learn): until one is seen no job is quiet; once the address changes,
// every source whose URL has the old one takes the whole path at its next
// reconcile, which rewrites its URL.
//
// A nil *Steady makes no job quiet.
type Steady struct {
	// Announce is the longest time between two announced reconciles of a
	// steady source; zero or less makes no job quiet.
	Announce time.Duration

	// base is the URL of an artifact minus its path: what the
	// artifact-server advertises ("http://host:port/").
	base atomic.Pointer[string]

	mu sync.Mutex
	// announced is when each source's last whole-path job was made.
	announced map[types.UID]time.Time
}

// NewSteady returns a Steady announcing every announce.
func NewSteady(announce time.Duration) *Steady {
	return &Steady{Announce: announce, announced: map[types.UID]time.Time{}}
}

// Learn records the advertised address an announced artifact's URL
// carries (http://<address>/<path>).
func (s *Steady) Learn(a *meta.Artifact) {
	if s == nil || a == nil || a.Path == "" {
		return
	}
	if base, ok := strings.CutSuffix(a.URL, a.Path); ok {
		s.learnBase(base)
	}
}

// learnBase records base, what artifact URLs start with.
func (s *Steady) learnBase(base string) {
	if base == "" {
		return
	}
	if cur := s.base.Load(); cur == nil || *cur != base {
		s.base.Store(&base)
	}
}

// Listen learns the address every artifact-server announces when it
// starts (events.TypeArtifactAddress), until the subscription returned is
// unsubscribed or nc closes. A malformed announcement is logged and
// ignored.
func (s *Steady) Listen(nc *nats.Conn, log logr.Logger) (*nats.Subscription, error) {
	sub, err := nc.Subscribe(events.ArtifactAddressSubject, func(m *nats.Msg) {
		msg, err := events.Decode(m.Data)
		if err != nil {
			log.Error(err, "ignoring an artifact address announcement")
			return
		}
		if a, ok := msg.Data.(*events.ArtifactAddress); ok {
			log.V(1).Info("artifact-server address announced", "baseURL", a.BaseURL)
			s.learnBase(a.BaseURL)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", events.ArtifactAddressSubject, err)
	}
	return sub, nil
}

// current reports whether a's URL is the one the artifact-server would
// announce now.
func (s *Steady) current(a *meta.Artifact) bool {
	base := s.base.Load()
	return base != nil && a != nil && a.URL == *base+a.Path
}

// Quiet reports whether the job made now for obj may be quiet, and
// records, when it may not, that this job is the source's announcement.
func (s *Steady) Quiet(kind sourcekind.Kind, obj sourcekind.Object, now time.Time) bool {
	if s == nil || s.Announce <= 0 {
		return false
	}
	steady := status.Steady(kind, obj) && s.current(obj.GetArtifact())
	s.mu.Lock()
	defer s.mu.Unlock()
	last, ok := s.announced[obj.GetUID()]
	if steady && ok && now.Sub(last) < s.Announce && !now.Before(last) {
		return true
	}
	s.announced[obj.GetUID()] = now
	return false
}

// Forget drops what is known of a deleted object.
func (s *Steady) Forget(uid types.UID) {
	if s == nil {
		return
	}
	s.mu.Lock()
	delete(s.announced, uid)
	s.mu.Unlock()
}

// untilSlot is how long from now until the next slot of remote for
// interval: every source of one remote (one listing answers them all)
// that shares an interval is due at the same moments, a phase of the
// interval derived from the remote, so that their jobs reach the fetchers
// together and share one listing. Different remotes fall at different
// phases, which spreads the load over the interval as jitter would. The
// result is in (0, interval].
func untilSlot(now time.Time, interval time.Duration, remote string) time.Duration {
	if interval <= 0 {
		return interval
	}
	h := fnv.New64a()
	h.Write([]byte(remote))
	phase := int64(h.Sum64() % uint64(interval))
	since := (now.UnixNano() - phase) % int64(interval)
	if since < 0 {
		since += int64(interval)
	}
	return time.Duration(int64(interval) - since)
}
