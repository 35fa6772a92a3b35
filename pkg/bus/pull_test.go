package bus_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// TestWorkerPullsOnlyForFreeSlots: a replica pulls no more jobs than it
// has free slots, so a job waiting in the stream goes to the next replica
// with a free slot instead of waiting, pulled ahead, behind the busy
// replica's long jobs (issue 30: the small tenant's job behind the big
// tenant's clones).
func TestWorkerPullsOnlyForFreeSlots(t *testing.T) {
	b := newTestBus(t)
	cons := b.consumer(t, "free-slots", events.ConsumerOptions{})
	// long-* jobs run until the test ends, med-* ones until released.
	release, releaseMed := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	handledBy := map[string]string{}
	handler := func(name string) bus.Handler {
		return func(ctx context.Context, m *events.Message, _ bus.Delivery) error {
			id := events.JobOf(m.Data).ID
			mu.Lock()
			handledBy[id] = name
			mu.Unlock()
			var wait chan struct{}
			switch {
			case strings.HasPrefix(id, "long-"):
				wait = release
			case strings.HasPrefix(id, "med-"):
				wait = releaseMed
			}
			if wait != nil {
				select {
				case <-wait:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}
	}
	who := func(id string) string {
		mu.Lock()
		defer mu.Unlock()
		return handledBy[id]
	}
	t.Cleanup(func() { close(release) })

	// Replica A has both slots busy.
	runWorker(t, &bus.Worker{Service: "test", Consumer: cons, Concurrency: 2, Handler: handler("A")})
	b.publish(t, "med-0", events.TypePackaged)
	b.publish(t, "long-1", events.TypePackaged)
	eventually(t, "both slots of A busy", func() bool {
		return who("med-0") == "A" && who("long-1") == "A"
	})
	// Two jobs wait in the stream, pulled by no one.
	b.publish(t, "long-2", events.TypePackaged)
	b.publish(t, "new-0", events.TypePackaged)
	eventually(t, "two jobs waiting in the stream and no pull request", func() bool {
		info := consumerInfo(t, cons)
		return info.NumPending == 2 && info.NumWaiting == 0
	})
	// One slot of A frees: A takes one job, the next long one, and leaves
	// the other in the stream.
	close(releaseMed)
	eventually(t, "A running the next long job", func() bool { return who("long-2") == "A" })
	eventually(t, "the other job still in the stream, pulled by no one", func() bool {
		info := consumerInfo(t, cons)
		return info.NumPending == 1 && info.NumAckPending == 2 && info.NumWaiting == 0
	})

	// Replica B, with its slots free, gets it while A is busy.
	runWorker(t, &bus.Worker{Service: "test", Consumer: cons, Concurrency: 2, Handler: handler("B")})
	eventually(t, "the waiting job handled by B while A runs its long jobs", func() bool {
		return who("new-0") == "B"
	})
	eventually(t, "the job acknowledged, the long ones still in flight", func() bool {
		return b.streamMsgs(t, events.PublishStream) == 2
	})
}
