package housekeeping

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// DefaultScanLimit bounds the package-stream messages StreamPending reads.
const DefaultScanLimit = 10000

// StreamPending returns the Pending of the package stream: it reads every
// message still in stream (a work queue: what is in it is not done) and
// collects the storage keys the Fetched jobs read: their Staging keys and
// the cached artifacts they reuse. It gives up on a stream holding more
// than limit messages, so the janitor skips the sweep rather than guess.
func StreamPending(stream jetstream.Stream, limit int) Pending {
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
