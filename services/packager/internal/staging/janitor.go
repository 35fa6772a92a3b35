// Package staging keeps the staging area of the shared storage clean: staged
// content is deleted by the packager once its job is done, and the janitor
// removes what is left behind (a job that expired from its stream, a
// fetcher that crashed between staging and publishing).
package staging

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/services/packager/internal/sweep"
)

// Janitor deletes staged content that is older than TTL and that no job
// refers to. Several replicas may run one each: deletes are idempotent.
type Janitor struct {
	// Store holds the staging area.
	Store storage.Storage
	// TTL is the age staged content must reach before it may be deleted.
	TTL time.Duration
	// Interval between sweeps; TTL/4 (from 1s to 10m) when zero.
	Interval time.Duration
	// Jobs lists the staged content still wanted.
	Jobs sweep.Jobs
	// Log is the janitor's logger.
	Log logr.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Run sweeps every Interval until ctx ends. A TTL of zero or less disables it.
func (j *Janitor) Run(ctx context.Context) {
	sweep.Every(ctx, j.TTL, j.Interval, j.Sweep, j.Log, "staged content")
}

// Sweep deletes the abandoned staged content once and returns its keys. When
// the pending jobs cannot be listed it deletes nothing.
func (j *Janitor) Sweep(ctx context.Context) ([]string, error) {
	now := time.Now
	if j.Now != nil {
		now = j.Now
	}
	objs, err := j.Store.List(ctx, storage.StagingDir)
	if err != nil {
		return nil, fmt.Errorf("list staging: %w", err)
	}
	cutoff := now().Add(-j.TTL)
	var old []storage.Info
	for _, o := range objs {
		if o.ModTime.Before(cutoff) {
			old = append(old, o)
		}
	}
	if len(old) == 0 {
		return nil, nil
	}
	wanted, err := j.Jobs(ctx)
	if err != nil {
		return nil, fmt.Errorf("list pending jobs: %w", err)
	}
	var deleted []string
	var errs []error
	for _, o := range old {
		if wanted[o.Key] {
			continue
		}
		if err := j.Store.Delete(ctx, o.Key); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, o.Key)
	}
	return deleted, errors.Join(errs...)
}

// StreamJobs returns a sweep.Jobs that reads every message still in stream (a work
// queue: what is in it is not done) and collects the storage keys the
// Fetched jobs read: their Staging keys and the cached artifacts they
// reuse (for the content cache's janitor). It gives up on a stream holding more than limit messages,
// so the janitor skips the sweep rather than guess.
func StreamJobs(stream jetstream.Stream, limit int) sweep.Jobs {
	return func(ctx context.Context) (map[string]bool, error) {
		info, err := stream.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("stream info: %w", err)
		}
		wanted := map[string]bool{}
		if info.State.Msgs == 0 {
			return wanted, nil
		}
		if info.State.Msgs > uint64(limit) {
			return nil, fmt.Errorf("stream %s holds %d messages, more than the %d scanned", info.Config.Name, info.State.Msgs, limit)
		}
		seq := info.State.FirstSeq
		// The next message of any subject at or after seq skips the gaps
		// acknowledged messages leave in a work queue.
		for range limit + 1 {
			msg, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return wanted, nil
			}
			if err != nil {
				return nil, fmt.Errorf("read stream %s at %d: %w", info.Config.Name, seq, err)
			}
			if m, err := events.Decode(msg.Data); err == nil {
				if f, ok := m.Data.(*events.Fetched); ok {
					wanted[f.Staging] = true
					if f.Reuse != nil {
						wanted[f.Reuse.Key] = true
					}
				}
			}
			seq = msg.Sequence + 1
		}
		return nil, fmt.Errorf("stream %s grew past %d messages while scanned", info.Config.Name, limit)
	}
}
