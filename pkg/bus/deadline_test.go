package bus_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
)

// TestWorkerJobDeadline: a job that outlives its deadline fails, Final
// (terminated, not retried), with DeadlineExceeded and the condition its
// handler's failure names or DeadlineCondition's; a handler that ignores
// its context is left behind after the grace, so its slot serves the next
// job.
func TestWorkerJobDeadline(t *testing.T) {
	tests := []struct {
		name          string
		cooperative   bool
		wantCondition string
	}{
		{"handler returns at the deadline", true, "FetchFailed"},
		{"handler ignores the deadline", false, "StorageOperationFailed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBus(t)
			cons := b.consumer(t, "deadline", events.ConsumerOptions{MaxDeliver: 3})
			terminated := b.subscribe(t, server.JSAdvisoryConsumerMsgTerminatedPre+"."+events.PublishStream+".deadline")
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			var rec recorder
			var mu sync.Mutex
			var reported []*failure.Error
			runWorker(t, &bus.Worker{
				Service: "test", Consumer: cons, Concurrency: 1,
				JobTimeout: 200 * time.Millisecond, DeadlineGrace: 200 * time.Millisecond,
				DeadlineCondition: func(*events.Message) string { return "StorageOperationFailed" },
				Handler: func(ctx context.Context, m *events.Message, d bus.Delivery) error {
					rec.add(m, d)
					if events.JobOf(m.Data).ID != "slow" {
						return nil
					}
					if tc.cooperative {
						<-ctx.Done()
						return failure.New(failure.Transient, "FetchFailed", "GitOperationFailed", "clone: %w", ctx.Err())
					}
					<-release
					return nil
				},
				Report: func(_ context.Context, m *events.Message, f *failure.Error) error {
					mu.Lock()
					defer mu.Unlock()
					reported = append(reported, f)
					return nil
				},
			})
			b.publish(t, "slow", events.TypeFetchFailed)
			if a := nextAdvisory(t, terminated); a.Deliveries != 1 {
				t.Errorf("terminated on delivery %d, want 1", a.Deliveries)
			}
			b.publish(t, "next", events.TypeFetchFailed)
			eventually(t, "the next job handled", func() bool { return len(rec.of("next")) == 1 })
			if got := attempts(rec.of("slow")); !slices.Equal(got, []uint64{1}) {
				t.Errorf("attempts %v, want [1]", got)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(reported) != 1 {
				t.Fatalf("%d reports, want 1", len(reported))
			}
			f := reported[0]
			if f.Handling != failure.Final || f.Reason != failure.DeadlineExceededReason || f.Condition != tc.wantCondition ||
				f.Error() != "the job did not finish within its deadline of 200ms" {
				t.Errorf("reported %s %s %s %q", f.Handling, f.Condition, f.Reason, f.Error())
			}
		})
	}
}

// TestWorkerJobTimeoutOf: a job's own deadline replaces the worker's.
func TestWorkerJobTimeoutOf(t *testing.T) {
	b := newTestBus(t)
	cons := b.consumer(t, "timeoutof", events.ConsumerOptions{})
	deadlines := make(chan time.Duration, 1)
	runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Concurrency: 1, JobTimeout: time.Hour,
		TimeoutOf: func(*events.Message) time.Duration { return 3 * time.Minute },
		Handler: func(ctx context.Context, _ *events.Message, _ bus.Delivery) error {
			dl, _ := ctx.Deadline()
			deadlines <- time.Until(dl)
			return nil
		},
	})
	b.publish(t, "own", events.TypeFetchFailed)
	select {
	case d := <-deadlines:
		if d > 3*time.Minute || d < 2*time.Minute {
			t.Errorf("the handler's deadline is %s away, want about 3m", d)
		}
	case <-time.After(wait):
		t.Fatal("job not handled")
	}
}
