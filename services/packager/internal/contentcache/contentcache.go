// Package contentcache is the packager's side of the content cache, which
// makes identical sources cost one fetch (see docs/design.md). Having
// stored an artifact for a Fetched job that carries a content key, the
// packager records it under the internal directory .cache of the shared
// storage:
//
//	.cache/<key>.json    the index: what the artifact is (Index)
//	.cache/<key>.tar.gz  the cache's own copy of the artifact
//
// A fetcher that finds the key's index reuses the entry: its Fetched job
// names the cached artifact instead of staged content, and the packager
// copies it into the source's directory. The copy is a hard link on a
// directory storage and a server-side copy on S3: no bytes move through a
// service. The cache's copy belongs to no source, so no source's retention
// deletes it; the Janitor removes entries nobody used for a TTL (a fetcher
// that uses an entry rewrites its index now and then).
//
// The fetcher keeps the same layout and index format (its own package
// contentcache).
package contentcache

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/storage"
)

// Dir is the internal storage directory of the cache.
const Dir = ".cache"

const (
	indexSuffix    = ".json"
	artifactSuffix = ".tar.gz"
)

// Index is the content of .cache/<key>.json.
type Index struct {
	// Key is the content key.
	Key string `json:"key"`
	// Artifact is the storage key of the cache's copy of the artifact,
	// .cache/<key>.tar.gz.
	Artifact string `json:"artifact"`
	// Digest of the artifact, "<algorithm>:<hex>".
	Digest string `json:"digest"`
	// Algorithm of the digest, e.g. "sha256".
	Algorithm string `json:"algorithm"`
	// Size of the artifact in bytes.
	Size int64 `json:"size"`
	// Revision the artifact was made from.
	Revision string `json:"revision"`
	// ArtifactName is the file name sources store the artifact under.
	ArtifactName string `json:"artifactName"`
	// EventMessage is the message of the NewArtifact event for it.
	EventMessage string `json:"eventMessage,omitempty"`
}

// IndexKey is the storage key of the index of a content key.
func IndexKey(key string) string { return Dir + "/" + key + indexSuffix }

// ArtifactKey is the storage key of the cache's copy of the artifact of a
// content key.
func ArtifactKey(key string) string { return Dir + "/" + key + artifactSuffix }

// ValidKey reports whether key is a content key: 64 lowercase hex digits.
func ValidKey(key string) bool {
	if len(key) != 64 {
		return false
	}
	for _, c := range key {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// KeyOfArtifact returns the content key of a cached artifact's storage key,
// and false when key is not one.
func KeyOfArtifact(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, Dir+"/")
	if !ok {
		return "", false
	}
	k, ok := strings.CutSuffix(rest, artifactSuffix)
	if !ok || !ValidKey(k) {
		return "", false
	}
	return k, true
}

// Record adds the artifact stored at from to the cache under idx.Key: it
// writes the index, then copies the artifact to idx.Artifact. A reader
// that finds the index before the copy exists sees a miss, never a wrong
// artifact: a key's artifact is the same bytes whoever makes it.
func Record(ctx context.Context, store storage.Storage, from string, idx Index) error {
	if !ValidKey(idx.Key) {
		return fmt.Errorf("content cache: invalid key %q", idx.Key)
	}
	idx.Artifact = ArtifactKey(idx.Key)
	body, err := json.Marshal(idx)
	if err != nil {
		return fmt.Errorf("content cache: %w", err)
	}
	if _, err := store.Put(ctx, IndexKey(idx.Key), bytes.NewReader(body)); err != nil {
		return fmt.Errorf("content cache: write index: %w", err)
	}
	info, err := store.Copy(ctx, from, idx.Artifact)
	if err != nil {
		return fmt.Errorf("content cache: %w", err)
	}
	if info.Size != idx.Size {
		return fmt.Errorf("content cache: copied %d bytes of %s, want %d", info.Size, from, idx.Size)
	}
	return nil
}

// Forget removes the entry of key, index first.
func Forget(ctx context.Context, store storage.Storage, key string) error {
	return errors.Join(store.Delete(ctx, IndexKey(key)), store.Delete(ctx, ArtifactKey(key)))
}

// Jobs returns the storage keys that jobs still waiting on the bus refer
// to; a cached artifact they name is kept.
type Jobs func(ctx context.Context) (map[string]bool, error)

// Janitor removes the cache entries nobody used for TTL: the index of an
// entry goes when it is older than TTL (a fetcher using an entry rewrites
// its index every contentcache.RefreshAfter of the fetcher), and a cached
// artifact goes when it has no index left and no pending job names it.
// Several replicas may run one each: deletes are idempotent.
type Janitor struct {
	// Store holds the cache.
	Store storage.Storage
	// TTL is how long an unused entry is kept.
	TTL time.Duration
	// Interval between sweeps; TTL/4 (from 1s to 10m) when zero.
	Interval time.Duration
	// Jobs lists the cached artifacts still wanted.
	Jobs Jobs
	// Log is the janitor's logger.
	Log logr.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Run sweeps every Interval until ctx ends. A TTL of zero or less disables it.
func (j *Janitor) Run(ctx context.Context) {
	if j.TTL <= 0 {
		return
	}
	every := j.Interval
	if every <= 0 {
		every = min(max(j.TTL/4, time.Second), 10*time.Minute)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		deleted, err := j.Sweep(ctx)
		if len(deleted) > 0 {
			j.Log.Info("removed unused content cache entries", "deleted", len(deleted))
		}
		if err != nil && ctx.Err() == nil {
			j.Log.Error(err, "content cache sweep failed")
		}
	}
}

// Sweep removes the unused entries once and returns the keys it deleted.
// When the pending jobs cannot be listed it deletes indexes only.
func (j *Janitor) Sweep(ctx context.Context) ([]string, error) {
	now := time.Now
	if j.Now != nil {
		now = j.Now
	}
	objs, err := j.Store.List(ctx, Dir)
	if err != nil {
		return nil, fmt.Errorf("list content cache: %w", err)
	}
	cutoff := now().Add(-j.TTL)
	indexes := map[string]bool{}
	var artifacts []string
	var expired []storage.Info
	for _, o := range objs {
		name := strings.TrimPrefix(o.Key, Dir+"/")
		if k, ok := strings.CutSuffix(name, indexSuffix); ok && ValidKey(k) {
			indexes[k] = true
			if o.ModTime.Before(cutoff) {
				expired = append(expired, o)
			}
		} else if k, ok := strings.CutSuffix(name, artifactSuffix); ok && ValidKey(k) {
			artifacts = append(artifacts, k)
		}
	}
	var deleted []string
	var errs []error
	for _, o := range expired {
		// A fetcher may have refreshed it since the listing.
		if st, err := j.Store.Stat(ctx, o.Key); err == nil && !st.ModTime.Before(cutoff) {
			continue
		}
		if err := j.Store.Delete(ctx, o.Key); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(indexes, strings.TrimSuffix(strings.TrimPrefix(o.Key, Dir+"/"), indexSuffix))
		deleted = append(deleted, o.Key)
	}
	var orphans []string
	for _, k := range artifacts {
		if !indexes[k] {
			orphans = append(orphans, k)
		}
	}
	if len(orphans) == 0 {
		return deleted, errors.Join(errs...)
	}
	wanted, err := j.Jobs(ctx)
	if err != nil {
		return deleted, errors.Join(append(errs, fmt.Errorf("list pending jobs: %w", err))...)
	}
	for _, k := range orphans {
		if wanted[ArtifactKey(k)] {
			continue
		}
		// A packager may be recording it again.
		if _, err := j.Store.Stat(ctx, IndexKey(k)); !errors.Is(err, storage.ErrNotFound) {
			continue
		}
		if err := j.Store.Delete(ctx, ArtifactKey(k)); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, ArtifactKey(k))
	}
	return deleted, errors.Join(errs...)
}
