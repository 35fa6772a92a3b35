package packager

import (
	"context"
	"errors"
	"fmt"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/go-logr/logr"
	"github.com/opencontainers/go-digest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// cachedArtifact is the input of a Fetched job that reuses the content
// cache: the cached artifact, copied to the source's key (no bytes move
// through the packager on a directory or S3 storage) and checked against
// its record, size and digest. A cached artifact that vanished (the
// janitor removed it after the fetcher looked) fails the job without
// stalling, so the next reconcile fetches; one that does not match its
// record is removed from the cache likewise.
type cachedArtifact struct {
	p     *Packager
	reuse *events.Reuse
	// cacheKey is the content key of reuse.Key.
	cacheKey string
}

func (c *cachedArtifact) write(ctx context.Context, key string) (*meta.Artifact, storage.Info, error) {
	r := c.reuse
	// The cached artifact is checked before it is copied, so one that is
	// not what its record says never replaces what key holds (an intact
	// artifact of the same revision, say); the copy is of the object
	// checked (CopyMatching), never of one that replaced it meanwhile.
	artifact, cached, err := c.p.describe(ctx, r.Key)
	if err != nil {
		return nil, storage.Info{}, c.unavailable(err)
	}
	recorded, err := digest.Parse(r.Digest)
	switch {
	case *artifact.Size != r.Size:
		return nil, storage.Info{}, c.mismatch(ctx, "cached artifact %s is %d bytes, recorded as %d", r.Key, *artifact.Size, r.Size)
	case err != nil:
		return nil, storage.Info{}, c.mismatch(ctx, "cached artifact %s has an invalid digest %q", r.Key, r.Digest)
	case recorded.Algorithm() == c.p.opts.Algorithm() && recorded.String() != artifact.Digest:
		return nil, storage.Info{}, c.mismatch(ctx, "cached artifact %s does not match its digest '%s'", r.Key, r.Digest)
	}
	info, err := c.p.store.CopyMatching(ctx, cached, key)
	if err != nil {
		// A cached artifact replaced since it was checked (recorded
		// again) is checked again at the job's next attempt.
		return nil, storage.Info{}, c.unavailable(fmt.Errorf("copy cached artifact: %w", err))
	}
	if info.Size != r.Size {
		return nil, storage.Info{}, archiveFailure(failure.Transient, "copy of cached artifact %s is %d bytes, recorded as %d", r.Key, info.Size, r.Size)
	}
	artifact.Path = key
	artifact.LastUpdateTime = metav1.NewTime(c.p.now())
	return artifact, info, nil
}

// unavailable is the failure of a cached artifact storage cannot give:
// Final when it is gone, Transient otherwise.
func (c *cachedArtifact) unavailable(err error) *failure.Error {
	if errors.Is(err, storage.ErrNotFound) {
		return archiveFailure(failure.Final, "cached artifact %s is gone: %w", c.reuse.Key, err)
	}
	return archiveFailure(failure.Transient, "%w", err)
}

// mismatch removes an entry that is not what its record says from the
// cache and returns the job's Final failure.
func (c *cachedArtifact) mismatch(ctx context.Context, format string, args ...any) *failure.Error {
	if err := contentcache.Forget(ctx, c.p.store, c.cacheKey); err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "removing a broken content cache entry failed", "key", c.cacheKey)
	}
	return archiveFailure(failure.Final, format, args...)
}
