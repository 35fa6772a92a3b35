// Package cachejanitor removes the content cache entries (package
// contentcache) that nobody used for a while.
package cachejanitor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/services/packager/internal/sweep"
)

// Janitor removes the cache entries nobody used for TTL: the index of an
// entry goes when it is older than TTL (the packager, copying an entry for
// a source, rewrites its index every contentcache.RefreshAfter), and a
// cached artifact goes when it has no index left and no pending job names
// it. Several replicas may run one each: deletes are idempotent.
type Janitor struct {
	// Store holds the cache.
	Store storage.Storage
	// TTL is how long an unused entry is kept.
	TTL time.Duration
	// Interval between sweeps; TTL/4 (from 1s to 10m) when zero.
	Interval time.Duration
	// Jobs lists the cached artifacts still wanted.
	Jobs sweep.Jobs
	// Log is the janitor's logger.
	Log logr.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Run sweeps every Interval until ctx ends. A TTL of zero or less disables it.
func (j *Janitor) Run(ctx context.Context) {
	sweep.Every(ctx, j.TTL, j.Interval, j.Sweep, j.Log, "content cache entries")
}

// Sweep removes the unused entries once and returns the keys it deleted.
// When the pending jobs cannot be listed it deletes indexes only.
func (j *Janitor) Sweep(ctx context.Context) ([]string, error) {
	now := time.Now
	if j.Now != nil {
		now = j.Now
	}
	objs, err := j.Store.List(ctx, contentcache.Dir)
	if err != nil {
		return nil, fmt.Errorf("list content cache: %w", err)
	}
	cutoff := now().Add(-j.TTL)
	indexes := map[string]bool{}
	var artifacts []string
	var expired []storage.Info
	for _, o := range objs {
		if k, ok := contentcache.KeyOfIndex(o.Key); ok {
			indexes[k] = true
			if o.ModTime.Before(cutoff) {
				expired = append(expired, o)
			}
		} else if k, ok := contentcache.KeyOfArtifact(o.Key); ok {
			artifacts = append(artifacts, k)
		}
	}
	var deleted []string
	var errs []error
	for _, o := range expired {
		// A packager may have refreshed it since the listing.
		if st, err := j.Store.Stat(ctx, o.Key); err == nil && !st.ModTime.Before(cutoff) {
			continue
		}
		if err := j.Store.Delete(ctx, o.Key); err != nil {
			errs = append(errs, err)
			continue
		}
		k, _ := contentcache.KeyOfIndex(o.Key)
		delete(indexes, k)
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
		if wanted[contentcache.ArtifactKey(k)] {
			continue
		}
		// A packager may be recording it again.
		if _, err := j.Store.Stat(ctx, contentcache.IndexKey(k)); !errors.Is(err, storage.ErrNotFound) {
			continue
		}
		if err := j.Store.Delete(ctx, contentcache.ArtifactKey(k)); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, contentcache.ArtifactKey(k))
	}
	return deleted, errors.Join(errs...)
}
