package storage

import (
	"context"
	"sync"
	"time"
)

// DefaultVerifyInterval is how long a verified object is trusted while
// storage describes it unchanged.
const DefaultVerifyInterval = time.Hour

// maxVerified bounds the objects a Verified remembers.
const maxVerified = 1 << 16

// Verified is a cache of the stored objects found to match their digest,
// and of what storage said of each then (size and ETag, which on directory
// storage is the modification time and size). Its Verify reads an object
// through again only when storage describes it differently, or when
// Interval has passed since it was last read: a stat (a HEAD on S3)
// replaces a full read (a GET) on most checks of an unchanged artifact. A
// replaced, truncated or deleted object is caught at once; damage that
// leaves its size and modification time as they were (bit rot) within
// Interval. A nil Verified, or a zero Interval, remembers nothing: every
// Verify reads the object, as Flux does.
type Verified struct {
	// Interval is how long a verification counts.
	Interval time.Duration
	// Now, when set, is the clock; time.Now otherwise.
	Now func() time.Time

	mu      sync.Mutex
	entries map[verifiedKey]verifiedAt
}

// verifiedKey is an object and the digest it was found to match.
type verifiedKey struct{ key, digest string }

// verifiedAt is what storage said of a verified object, and when it was
// read.
type verifiedAt struct {
	size int64
	etag string
	at   time.Time
}

// Verify is the package's Verify, which it skips when key was found to
// match want within Interval and storage still describes it as it did
// then. A failed check is forgotten, so the next one reads the object.
func (v *Verified) Verify(ctx context.Context, s Storage, key, want string) error {
	var info Info
	statted := false
	if v.enabled() {
		// What storage says of the object before it is read: if it says
		// the same next time, the read can be skipped for a while.
		if i, err := s.Stat(ctx, key); err == nil {
			if v.fresh(key, want, i) {
				return nil
			}
			info, statted = i, true
		}
	}
	err := Verify(ctx, s, key, want)
	switch {
	case err != nil:
		v.forget(key, want)
	case statted:
		v.remember(key, want, info)
	}
	return err
}

func (v *Verified) enabled() bool { return v != nil && v.Interval > 0 }

func (v *Verified) clock() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

// fresh reports whether key was found to match digest within Interval and
// storage now describes it as it did then.
func (v *Verified) fresh(key, digest string, info Info) bool {
	if !v.enabled() {
		return false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	e, ok := v.entries[verifiedKey{key, digest}]
	return ok && e.size == info.Size && e.etag == info.ETag && v.clock().Sub(e.at) < v.Interval
}

// remember records that key, described by info before it was read,
// matched digest.
func (v *Verified) remember(key, digest string, info Info) {
	if !v.enabled() {
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
	v.entries[verifiedKey{key, digest}] = verifiedAt{size: info.Size, etag: info.ETag, at: now}
}

// forget drops what is remembered of key and digest.
func (v *Verified) forget(key, digest string) {
	if v == nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.entries, verifiedKey{key, digest})
}
