// Package housekeeping keeps the packager's internal storage clean: it
// removes what nothing needs any more, staged content left behind and
// content cache entries nobody uses, while keeping what a job still
// waiting on the package stream will read (Pending).
//
// Staged content is deleted by the packager once its job is done; the
// janitor removes what is left behind (a job that expired from its
// stream, a fetcher that crashed between staging and publishing, a job
// whose last attempt failed transiently). A content cache entry's index
// goes when nobody used the entry for the cache's TTL (the packager,
// copying an entry for a source, rewrites its index every
// contentcache.RefreshAfter), and a cached artifact goes when it has no
// index left and no pending job names it. The temporary files of writes a
// killed process abandoned (storage.TemporarySweeper) go after the staging
// TTL too.
package housekeeping

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// Janitor sweeps the staging area and the content cache, each every
// quarter of its TTL (from 1s to 10m). Several replicas may run one each:
// deletes are idempotent.
type Janitor struct {
	// Store holds the staging area and the cache.
	Store storage.Storage
	// StagingTTL is the age staged content must reach before it may be
	// deleted; zero or less disables the staging sweep.
	StagingTTL time.Duration
	// CacheTTL is how long an unused cache entry is kept; zero or less
	// disables the cache sweep.
	CacheTTL time.Duration
	// Pending lists what the jobs still waiting on the bus read.
	Pending Pending
	// Log is the janitor's logger.
	Log logr.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Pending returns the storage keys that jobs still waiting on the bus
// refer to (their staged content, the cached artifacts they reuse); the
// janitor keeps what they name.
type Pending func(ctx context.Context) (map[string]bool, error)

// Run sweeps until ctx ends.
func (j *Janitor) Run(ctx context.Context) {
	staging, temporary := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(staging)
		j.every(ctx, j.StagingTTL, j.SweepStaging, "staged content")
	}()
	go func() {
		defer close(temporary)
		j.every(ctx, j.StagingTTL, j.SweepTemporary, "temporary files")
	}()
	j.every(ctx, j.CacheTTL, j.SweepCache, "content cache entries")
	<-staging
	<-temporary
}

// SweepTemporary removes, once, the temporary files of writes last written
// to more than StagingTTL ago, when the storage leaves such files behind
// (storage.TemporarySweeper), and returns what it removed.
func (j *Janitor) SweepTemporary(ctx context.Context) ([]string, error) {
	ts, ok := j.Store.(storage.TemporarySweeper)
	if !ok {
		return nil, nil
	}
	now := time.Now
	if j.Now != nil {
		now = j.Now
	}
	return ts.SweepTemporary(ctx, now().Add(-j.StagingTTL))
}

// every calls sweep every quarter of ttl until ctx ends, logging how much
// it removed of what and any failure. A ttl of zero or less disables it.
func (j *Janitor) every(ctx context.Context, ttl time.Duration, sweep func(context.Context) ([]string, error), what string) {
	if ttl <= 0 {
		return
	}
	t := time.NewTicker(min(max(ttl/4, time.Second), 10*time.Minute))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		deleted, err := sweep(ctx)
		if len(deleted) > 0 {
			j.Log.Info("sweep removed objects", "what", what, "deleted", len(deleted))
		}
		if err != nil && ctx.Err() == nil {
			j.Log.Error(err, "sweep failed", "what", what)
		}
	}
}

// list describes the objects of dir and the time before which an object
// was last written more than ttl ago.
func (j *Janitor) list(ctx context.Context, dir string, ttl time.Duration) ([]storage.Info, time.Time, error) {
	now := time.Now
	if j.Now != nil {
		now = j.Now
	}
	objs, err := j.Store.List(ctx, dir)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("list %s: %w", dir, err)
	}
	return objs, now().Add(-ttl), nil
}

// remove deletes the keys that keep does not claim and returns those it
// deleted, with the errors it met.
func (j *Janitor) remove(ctx context.Context, keys []string, keep func(key string) bool) ([]string, error) {
	var deleted []string
	var errs []error
	for _, k := range keys {
		if keep(k) {
			continue
		}
		if err := j.Store.Delete(ctx, k); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, k)
	}
	return deleted, errors.Join(errs...)
}

// SweepStaging deletes the staged content older than StagingTTL that no
// pending job refers to, once, and returns the keys it deleted. When the
// pending jobs cannot be listed it deletes nothing.
func (j *Janitor) SweepStaging(ctx context.Context) ([]string, error) {
	objs, cutoff, err := j.list(ctx, storage.StagingDir, j.StagingTTL)
	if err != nil {
		return nil, err
	}
	var old []string
	for _, o := range objs {
		if o.ModTime.Before(cutoff) {
			old = append(old, o.Key)
		}
	}
	if len(old) == 0 {
		return nil, nil
	}
	wanted, err := j.Pending(ctx)
	if err != nil {
		return nil, fmt.Errorf("list pending jobs: %w", err)
	}
	return j.remove(ctx, old, func(key string) bool { return wanted[key] })
}

// SweepCache removes the content cache entries nobody used for CacheTTL,
// once, and returns the keys it deleted: first the indexes older than
// CacheTTL, then the cached artifacts that have no index and that no
// pending job reuses. When the pending jobs cannot be listed it deletes
// indexes only.
func (j *Janitor) SweepCache(ctx context.Context) ([]string, error) {
	objs, cutoff, err := j.list(ctx, contentcache.Dir, j.CacheTTL)
	if err != nil {
		return nil, err
	}
	indexes := map[string]bool{}
	var artifacts, expired []string
	for _, o := range objs {
		if k, ok := contentcache.KeyOfIndex(o.Key); ok {
			indexes[k] = true
			if o.ModTime.Before(cutoff) {
				expired = append(expired, o.Key)
			}
		} else if k, ok := contentcache.KeyOfArtifact(o.Key); ok {
			artifacts = append(artifacts, k)
		}
	}
	deleted, err := j.remove(ctx, expired, func(key string) bool {
		// The packager may have refreshed it since the listing.
		st, err := j.Store.Stat(ctx, key)
		return err == nil && !st.ModTime.Before(cutoff)
	})
	errs := []error{err}
	for _, key := range deleted {
		k, _ := contentcache.KeyOfIndex(key)
		delete(indexes, k)
	}
	var orphans []string
	for _, k := range artifacts {
		if !indexes[k] {
			orphans = append(orphans, contentcache.ArtifactKey(k))
		}
	}
	if len(orphans) == 0 {
		return deleted, errors.Join(errs...)
	}
	wanted, err := j.Pending(ctx)
	if err != nil {
		return deleted, errors.Join(append(errs, fmt.Errorf("list pending jobs: %w", err))...)
	}
	removed, err := j.remove(ctx, orphans, func(key string) bool {
		if wanted[key] {
			return true
		}
		// A packager may be recording it again.
		k, _ := contentcache.KeyOfArtifact(key)
		_, err := j.Store.Stat(ctx, contentcache.IndexKey(k))
		return !errors.Is(err, storage.ErrNotFound)
	})
	return append(deleted, removed...), errors.Join(append(errs, err)...)
}
