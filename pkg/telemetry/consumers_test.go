package telemetry

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestConsumerGaugesReadOnScrape: a watched consumer's state is read when
// Prometheus scrapes and only then; a state younger than
// ConsumerStateMaxAge answers the next scrapes; a failed read reports the
// last state; a consumer never read is absent, and so is one removed.
func TestConsumerGaugesReadOnScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewJobMetrics(reg, "test")
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m.consumers.now = func() time.Time { return now }
	var reads atomic.Int32
	var fail atomic.Bool
	pending := uint64(3)
	remove := m.WatchConsumer(func(context.Context) (ConsumerState, error) {
		reads.Add(1)
		if fail.Load() {
			return ConsumerState{}, errors.New("nats: timeout")
		}
		return ConsumerState{Stream: "S", Consumer: "c", Pending: pending, AckPending: 2, Redelivered: 1, AckFloor: 7}, nil
	})
	failing := m.WatchConsumer(func(context.Context) (ConsumerState, error) {
		reads.Add(1)
		return ConsumerState{}, errors.New("never answers")
	})
	defer failing()

	if n := reads.Load(); n != 0 {
		t.Fatalf("%d reads before any scrape, want 0", n)
	}
	// pendingGauge gathers once: the pending gauge's first value (-1
	// without one) and its number of series.
	pendingGauge := func() (float64, int) {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "headwater_consumer_pending_messages" {
				return mf.GetMetric()[0].GetGauge().GetValue(), len(mf.GetMetric())
			}
		}
		return -1, 0
	}
	if v, n := pendingGauge(); v != 3 || n != 1 {
		t.Fatalf("pending %v in %d series, want 3 in 1 (the consumer never read is left out)", v, n)
	}
	readsAfterFirst := reads.Load()
	pending = 5
	now = now.Add(ConsumerStateMaxAge / 2)
	if v, _ := pendingGauge(); v != 3 {
		t.Errorf("pending %v within ConsumerStateMaxAge, want the state read before (3)", v)
	}
	if n := reads.Load(); n != readsAfterFirst+1 {
		// The failing consumer is read again, the other one not.
		t.Errorf("%d reads, want %d", n, readsAfterFirst+1)
	}
	now = now.Add(ConsumerStateMaxAge)
	if v, _ := pendingGauge(); v != 5 {
		t.Errorf("pending %v after ConsumerStateMaxAge, want a new read (5)", v)
	}
	fail.Store(true)
	now = now.Add(2 * ConsumerStateMaxAge)
	if v, _ := pendingGauge(); v != 5 {
		t.Errorf("pending %v after a failed read, want the last state (5)", v)
	}
	remove()
	if v, n := pendingGauge(); n != 0 {
		t.Errorf("a removed consumer is still reported (pending %v)", v)
	}
	if problems, err := testutil.CollectAndLint(m.consumers); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}
