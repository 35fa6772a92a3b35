// Package retention decides which of a source's old artifacts to garbage
// collect, with Flux's two knobs (--artifact-retention-records and
// --artifact-retention-ttl), and deletes them.
//
// Unlike Flux, the TTL is a grace period and never a deadline: an artifact
// is deleted only when it is both beyond the newest Records and older than
// TTL, so a consumer that just read a status can still download the
// artifact it names, and a quiet source never loses its recent artifacts.
package retention

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/headwater-gitops/headwater/pkg/storage"
)

// Policy says how many old artifacts a source keeps, and for how long.
type Policy struct {
	// Records is the number of newest artifacts always kept.
	Records int
	// TTL is the age under which an artifact is never deleted.
	TTL time.Duration
}

// Select returns the objects of one source directory to delete: every one
// beyond the newest p.Records (by ModTime, newest first; ties broken by key)
// that is at least p.TTL old at now and that keep does not claim. keep may
// be nil. The result is ordered newest first.
func Select(objs []storage.Info, p Policy, now time.Time, keep func(storage.Info) bool) []storage.Info {
	sorted := slices.Clone(objs)
	slices.SortFunc(sorted, func(a, b storage.Info) int {
		if c := b.ModTime.Compare(a.ModTime); c != 0 {
			return c
		}
		return strings.Compare(b.Key, a.Key)
	})
	var out []storage.Info
	for i, o := range sorted {
		switch {
		case i < p.Records:
		case now.Sub(o.ModTime) < p.TTL:
		case keep != nil && keep(o):
		default:
			out = append(out, o)
		}
	}
	return out
}

// keeper returns what Collect keeps besides Select's count and age:
// current, and the latest pointer's target. The target is resolved by name
// (LatestTarget): on S3 the pointer is a copy whose ETag is not its
// target's when the target was uploaded in parts (over 1 MiB), and the
// target is the artifact the source's status names when a late job's
// artifact was stored after it. A pointer that names no target (on S3,
// one set before order records were kept) is recognised as before, by
// what Stat says of it: its target's ETag and size.
func keeper(ctx context.Context, s storage.Storage, dir, current string) (func(storage.Info) bool, error) {
	latestKey := path.Join(dir, storage.LatestName)
	target, err := s.LatestTarget(ctx, latestKey)
	switch {
	case err == nil:
		return func(o storage.Info) bool { return o.Key == current || o.Key == target }, nil
	case !errors.Is(err, storage.ErrNotFound):
		return nil, fmt.Errorf("garbage collect %s: resolve latest: %w", dir, err)
	}
	var latest *storage.Info
	li, err := s.Stat(ctx, latestKey)
	switch {
	case err == nil:
		latest = &li
	case !errors.Is(err, storage.ErrNotFound):
		return nil, fmt.Errorf("garbage collect %s: resolve latest: %w", dir, err)
	}
	return func(o storage.Info) bool {
		return o.Key == current || (latest != nil && o.ETag == latest.ETag && o.Size == latest.Size)
	}, nil
}

// Collect garbage-collects the source directory dir of s by Select. It never
// deletes current (the artifact just written) nor the target of the
// directory's latest pointer; when the pointer cannot be read it deletes
// nothing. It returns the keys it deleted and the errors it met on the way.
func Collect(ctx context.Context, s storage.Storage, dir, current string, p Policy, now time.Time) ([]string, error) {
	objs, err := s.List(ctx, dir)
	if err != nil {
		return nil, fmt.Errorf("garbage collect %s: %w", dir, err)
	}
	if len(objs) <= p.Records {
		// Select keeps the newest p.Records whatever else holds, so the
		// pointer need not be resolved (a HEAD saved on S3).
		return nil, nil
	}
	keep, err := keeper(ctx, s, dir, current)
	if err != nil {
		return nil, err
	}
	var deleted []string
	var errs []error
	for _, o := range Select(objs, p, now, keep) {
		if err := s.Delete(ctx, o.Key); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, o.Key)
	}
	if err := errors.Join(errs...); err != nil {
		return deleted, fmt.Errorf("garbage collect %s: %w", dir, err)
	}
	return deleted, nil
}
