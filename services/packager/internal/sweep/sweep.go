// Package sweep runs the packager's janitors, which remove from the shared
// storage what nothing needs any more: a sweep every so often.
package sweep

import (
	"context"
	"time"

	"github.com/go-logr/logr"
)

// Jobs returns the storage keys that jobs still waiting on the bus refer
// to; a janitor keeps what they name.
type Jobs func(ctx context.Context) (map[string]bool, error)

// Every calls sweep every interval until ctx ends, logging how much it
// removed of what and any failure. A ttl of zero or less disables it; an
// interval of zero or less means ttl/4, from 1s to 10m.
func Every(ctx context.Context, ttl, interval time.Duration, sweep func(context.Context) ([]string, error), log logr.Logger, what string) {
	if ttl <= 0 {
		return
	}
	if interval <= 0 {
		interval = min(max(ttl/4, time.Second), 10*time.Minute)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		deleted, err := sweep(ctx)
		if len(deleted) > 0 {
			log.Info("sweep removed objects", "what", what, "deleted", len(deleted))
		}
		if err != nil && ctx.Err() == nil {
			log.Error(err, "sweep failed", "what", what)
		}
	}
}
