package fetch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// Outcomes of combining a fetch of content that may be shared with the
// identical fetches in flight, the outcome label of
// headwater_fetch_combined_total.
const (
	// CombineLed: this fetch took the lease of its content key and
	// downloaded the content for every fetcher replica.
	CombineLed = "led"
	// CombineFollowedLocal: another fetch of the same content in this
	// fetcher downloaded it; its staged content was copied.
	CombineFollowedLocal = "followed-local"
	// CombineFollowedRemote: another fetcher replica downloaded the
	// content; what it staged was copied (or, once packaged, the content
	// cache served it).
	CombineFollowedRemote = "followed-remote"
	// CombineLeaderFailed: the replica that led failed and gave up its
	// lease; this fetch downloaded the content itself.
	CombineLeaderFailed = "leader-failed"
	// CombineLeaseExpired: the replica that led stopped renewing its lease
	// (it died); this fetch downloaded the content itself once the lease
	// expired.
	CombineLeaseExpired = "lease-expired"
	// CombineBypassed: the bucket could not be read, or held an entry
	// that is not a fetcher's; this fetch downloaded the content itself.
	CombineBypassed = "bypassed"
)

// Leases combines the fetches of the same content that run at the same
// time in different fetcher replicas, through the key-value bucket
// events.FlightBucket: the replica that creates the entry of a content key
// (an atomic create) leads and downloads, renewing its lease while it
// does; the others watch the entry until the leader writes its staged
// job into it, then copy the staged content as a follower in one fetcher
// does (see inflight). A leader that fails deletes its entry; one that
// dies stops renewing it and it expires: either way the followers fetch
// themselves. Only the leader of a flight in a fetcher (see inflight)
// uses Leases, so a content key costs a fetcher a few round trips to the
// bucket, however many of its jobs want it.
type Leases struct {
	// KV is the events.FlightBucket bucket.
	KV jetstream.KeyValue
	// Holder names this fetcher process in the entries it writes, for
	// the logs of the others.
	Holder string
	// TTL is how long an entry lives after its last write, the bucket's;
	// events.FlightTTL when zero. A leader renews its lease every quarter
	// of it, and a follower that sees no write for TTL takes the lease
	// as expired.
	TTL time.Duration
}

// flightEntry is the value of a content key in events.FlightBucket.
type flightEntry struct {
	// Key is the content key the entry is under, repeated: an entry that
	// names another key is not trusted.
	Key string `json:"key"`
	// Holder names the fetcher that leads.
	Holder string `json:"holder"`
	// Fetched is the leader's Fetched job once its content is staged;
	// nil while it fetches.
	Fetched *events.Fetched `json:"fetched,omitempty"`
}

// errMalformedEntry is an entry of the bucket no fetcher wrote.
var errMalformedEntry = errors.New("malformed entry")

// decodeEntry decodes the value of key in the bucket, and checks that it
// is what a leader writes: an entry of that key whose staged job, if any,
// names staged content (and not a cached artifact).
func decodeEntry(key string, value []byte) (*flightEntry, error) {
	var e flightEntry
	if err := json.Unmarshal(value, &e); err != nil {
		return nil, fmt.Errorf("%w: %w", errMalformedEntry, err)
	}
	if e.Key != key {
		return nil, fmt.Errorf("%w: under key %q, names key %q", errMalformedEntry, key, e.Key)
	}
	if f := e.Fetched; f != nil {
		if f.Revision == "" || f.Reuse != nil || !isStagingKey(f.Staging) ||
			(f.Format != events.FormatTree && f.Format != events.FormatFile) {
			return nil, fmt.Errorf("%w: staged job of key %q names no staged content", errMalformedEntry, key)
		}
	}
	return &e, nil
}

// isStagingKey reports whether key is an object right in the staging
// directory of the shared storage.
func isStagingKey(key string) bool {
	name, ok := strings.CutPrefix(key, storage.StagingDir+"/")
	return ok && name != "" && name != "." && name != ".." && !strings.Contains(name, "/") && path.Clean(key) == key
}

func (l *Leases) ttl() time.Duration {
	if l.TTL > 0 {
		return l.TTL
	}
	return events.FlightTTL
}

// Acquire creates the entry of key unless one exists: this fetcher then
// leads the fetch of the content across replicas and gets the lease,
// which it must Land or Release. When another fetcher leads, or landed a
// moment ago, lease is nil: Wait follows it. An error is the bucket's.
func (l *Leases) Acquire(ctx context.Context, key string) (*Lease, error) {
	value, err := json.Marshal(flightEntry{Key: key, Holder: l.Holder})
	if err != nil {
		return nil, fmt.Errorf("encode lease: %w", err)
	}
	rev, err := l.KV.Create(ctx, key, value)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("create lease %s: %w", key, err)
	}
	ls := &Lease{leases: l, key: key, value: value, rev: rev, stop: make(chan struct{}), stopped: make(chan struct{})}
	go ls.renew(logr.FromContextOrDiscard(ctx))
	return ls, nil
}

// Wait follows the fetch of key another fetcher leads, until ctx ends: it
// returns the leader's staged job once the leader landed it, or nil and
// why the leader is not followed (CombineLeaderFailed,
// CombineLeaseExpired, CombineBypassed; "" when ctx ended). A
// follower never waits past ctx, nor longer than the lease's TTL after
// the leader's last sign of life.
func (l *Leases) Wait(ctx context.Context, key string) (*events.Fetched, string) {
	log := logr.FromContextOrDiscard(ctx)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := l.KV.Watch(ctx, key)
	if err != nil {
		if ctx.Err() == nil {
			log.Error(err, "watching a fetch another fetcher leads failed: fetching", "key", key)
		}
		return nil, CombineBypassed
	}
	defer func() { _ = w.Stop() }()
	stale := time.NewTimer(l.ttl())
	defer stale.Stop()
	seen := false
	for {
		select {
		case <-ctx.Done():
			return nil, ""
		case <-stale.C:
			log.Info("the fetcher leading a fetch stopped renewing its lease: fetching", "key", key)
			return nil, CombineLeaseExpired
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				if ctx.Err() != nil {
					return nil, ""
				}
				return nil, CombineBypassed
			case e == nil:
				// The watch delivered what the bucket holds: nothing
				// means the entry expired between Acquire and Watch.
				if !seen {
					return nil, CombineLeaseExpired
				}
				continue
			}
			seen = true
			switch e.Operation() {
			case jetstream.KeyValueDelete:
				log.V(1).Info("the fetcher leading a fetch failed: fetching", "key", key)
				return nil, CombineLeaderFailed
			case jetstream.KeyValuePurge:
				// The bucket removed the entry: its TTL passed.
				return nil, CombineLeaseExpired
			}
			entry, err := decodeEntry(key, e.Value())
			if err != nil {
				log.Info("ignoring an entry of the fetches in flight: fetching", "key", key, "error", err.Error())
				return nil, CombineBypassed
			}
			if entry.Fetched != nil {
				log.V(1).Info("a fetch another fetcher leads landed", "key", key, "holder", entry.Holder)
				return entry.Fetched, CombineFollowedRemote
			}
			stale.Reset(l.ttl())
		}
	}
}

// Lease is this fetcher's lead of the fetch of a content key across
// fetcher replicas. It is renewed until Land or Release.
type Lease struct {
	leases *Leases
	key    string
	// value is the entry of the lease, rewritten to renew it.
	value []byte
	// mu guards rev and ended.
	mu sync.Mutex
	// rev is the revision of the entry last written.
	rev uint64
	// ended is set once Land or Release ran.
	ended bool
	// stop ends the renewal, which closes stopped when it returns.
	stop, stopped chan struct{}
}

// renewTimeout bounds one write of the bucket that no job's context bounds.
const renewTimeout = 5 * time.Second

// renew rewrites the entry every quarter of the TTL until stopped, or
// until the entry is no longer the lease's (it expired and another
// fetcher took it): then followers no longer wait for this fetcher.
func (ls *Lease) renew(log logr.Logger) {
	defer close(ls.stopped)
	t := time.NewTicker(ls.leases.ttl() / 4)
	defer t.Stop()
	for {
		select {
		case <-ls.stop:
			return
		case <-t.C:
		}
		ls.mu.Lock()
		ctx, cancel := context.WithTimeout(context.Background(), renewTimeout)
		rev, err := ls.leases.KV.Update(ctx, ls.key, ls.value, ls.rev)
		cancel()
		if err == nil {
			ls.rev = rev
		}
		ls.mu.Unlock()
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound) {
			log.Info("lost the lease of a fetch to another fetcher", "key", ls.key)
			return
		}
		if err != nil {
			log.Error(err, "renewing the lease of a fetch failed", "key", ls.key)
		}
	}
}

// end stops the renewal and reports whether the lease was still open, in
// which case it returns with mu held for the caller to write the entry
// and unlock.
func (ls *Lease) end() bool {
	ls.mu.Lock()
	if ls.ended {
		ls.mu.Unlock()
		return false
	}
	ls.ended = true
	ls.mu.Unlock()
	close(ls.stop)
	<-ls.stopped
	ls.mu.Lock()
	return true
}

// Land writes the staged job of the leader into its entry, where the
// followers find it, and ends the lease. The staged content must stay
// until the packager has it: the followers copy it before, or find the
// content cache after. The entry expires after the TTL, meanwhile it
// serves late fetches of the content too. An error is the bucket's: the
// followers then find that the lease expired.
func (ls *Lease) Land(ctx context.Context, staged *events.Fetched) error {
	if !ls.end() {
		return nil
	}
	defer ls.mu.Unlock()
	value, err := json.Marshal(flightEntry{Key: ls.key, Holder: ls.leases.Holder, Fetched: staged})
	if err != nil {
		return fmt.Errorf("encode landed fetch: %w", err)
	}
	if _, err := ls.leases.KV.Update(ctx, ls.key, value, ls.rev); err != nil {
		return fmt.Errorf("land fetch %s: %w", ls.key, err)
	}
	return nil
}

// Release ends a lease that did not land (the fetch failed): it deletes
// its entry, so the followers fetch themselves at once rather than when
// the lease expires. After Land it does nothing.
func (ls *Lease) Release(ctx context.Context) {
	if !ls.end() {
		return
	}
	defer ls.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), renewTimeout)
	defer cancel()
	if err := ls.leases.KV.Delete(ctx, ls.key, jetstream.LastRevision(ls.rev)); err != nil {
		logr.FromContextOrDiscard(ctx).Info("releasing the lease of a failed fetch failed: it expires", "key", ls.key, "error", err.Error())
	}
}
