package fetch

import (
	"sync"
	"time"

	"github.com/fluxcd/pkg/apis/meta"

	"github.com/headwater-gitops/headwater/pkg/storage"
)

// DefaultVerifyInterval is how long a verified artifact is trusted while
// storage reports it unchanged.
const DefaultVerifyInterval = time.Hour

// maxVerified bounds the artifacts a fetcher remembers as verified.
const maxVerified = 1 << 16

// Verified remembers the stored artifacts this fetcher found intact and
// what storage said of each then (size and ETag, which on directory
// storage is the modification time and size), so that an unchanged
// reconcile reads an artifact through again only when storage describes it
// differently, or when Interval has passed since it was last read. A stat
// (a HEAD on S3) replaces a full read (a GET) on most reconciles: a
// replaced, truncated or deleted artifact is caught at once, and damage
// that leaves its size and modification time as they were (bit rot) within
// Interval. The zero value, or a zero Interval, remembers nothing: every
// reconcile reads the artifact, as Flux does.
type Verified struct {
	// Interval is how long a verification counts.
	Interval time.Duration
	// now is the clock; time.Now when nil.
	now func() time.Time

	mu      sync.Mutex
	entries map[verifiedKey]verifiedAt
}

type verifiedKey struct{ path, digest string }

type verifiedAt struct {
	size int64
	etag string
	at   time.Time
}

func (v *Verified) clock() time.Time {
	if v.now != nil {
		return v.now()
	}
	return time.Now()
}

// Fresh reports whether a was verified within Interval and storage now
// describes it as it did then.
func (v *Verified) Fresh(a *meta.Artifact, info storage.Info) bool {
	if v == nil || v.Interval <= 0 {
		return false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	e, ok := v.entries[verifiedKey{a.Path, a.Digest}]
	return ok && e.size == info.Size && e.etag == info.ETag && v.clock().Sub(e.at) < v.Interval
}

// Remember records that a, described by info before it was read, matched
// its digest.
func (v *Verified) Remember(a *meta.Artifact, info storage.Info) {
	if v == nil || v.Interval <= 0 {
		return
	}
	now := v.clock()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.entries == nil {
		v.entries = map[verifiedKey]verifiedAt{}
	}
	if len(v.entries) >= maxVerified {
		for k, e := range v.entries {
			if now.Sub(e.at) >= v.Interval {
				delete(v.entries, k)
			}
		}
		// Still full: forget any one (map order), the price being one
		// more read of it.
		for k := range v.entries {
			if len(v.entries) < maxVerified {
				break
			}
			delete(v.entries, k)
		}
	}
	v.entries[verifiedKey{a.Path, a.Digest}] = verifiedAt{size: info.Size, etag: info.ETag, at: now}
}

// Forget drops what is remembered of a, so its next check reads it.
func (v *Verified) Forget(a *meta.Artifact) {
	if v == nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.entries, verifiedKey{a.Path, a.Digest})
}
