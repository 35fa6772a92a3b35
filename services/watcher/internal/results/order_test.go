package results

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/types"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// mustLock locks source uid's entry of o for an outcome of a job
// requested at requested, failing t on an error.
func mustLock(t *testing.T, o *order, uid types.UID, requested time.Time) *sourceOrder {
	t.Helper()
	s, err := o.lock(context.Background(), uid, requested)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// mustWrite records requested as written for uid, failing t on an error.
func mustWrite(t *testing.T, o *order, uid types.UID, s *sourceOrder, requested time.Time) {
	t.Helper()
	if err := o.written(context.Background(), uid, s, requested); err != nil {
		t.Fatal(err)
	}
}

// TestOrder checks the per-source order: an older job is superseded once
// a newer one is written, not before; entries of sources with nothing
// written go with their last user, written ones with forget.
func TestOrder(t *testing.T) {
	var o order
	t0 := time.Date(2026, 12, 4, 20, 0, 0, 0, time.UTC)
	older, newer := t0, t0.Add(time.Second)

	s := mustLock(t, &o, "a", older)
	if s.superseded(older) {
		t.Error("a job superseded before any outcome was written")
	}
	o.unlock("a", s)
	if n := o.len(); n != 0 {
		t.Errorf("entries after a check that wrote nothing = %d, want 0", n)
	}

	s = mustLock(t, &o, "a", older)
	mustWrite(t, &o, "a", s, newer)
	o.unlock("a", s)
	s = mustLock(t, &o, "a", older)
	if !s.superseded(older) || s.superseded(newer) || s.superseded(newer.Add(time.Millisecond)) {
		t.Errorf("after writing %s: superseded(older)=%t, superseded(same)=%t, superseded(later)=%t; want true, false, false",
			newer, s.superseded(older), s.superseded(newer), s.superseded(newer.Add(time.Millisecond)))
	}
	// Writing an older job (a redelivery of one written before the
	// order began) keeps the newest.
	mustWrite(t, &o, "a", s, older)
	if !s.superseded(older) {
		t.Error("writing an older job moved the newest back")
	}
	o.unlock("a", s)
	if s := mustLock(t, &o, "b", older); s.superseded(older) {
		t.Error("another source's order leaked")
	} else {
		o.unlock("b", s)
	}
	if err := o.forget(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if n := o.len(); n != 0 {
		t.Errorf("entries after forget = %d, want 0", n)
	}
}

// TestOrderSerializes runs outcomes of one source from many goroutines:
// each sees every write before it, so the newest survives whatever the
// order they run in.
func TestOrderSerializes(t *testing.T) {
	var o order
	const n = 200
	t0 := time.Date(2026, 12, 4, 20, 0, 0, 0, time.UTC)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		written []time.Time
	)
	inside := 0
	for i := range n {
		wg.Go(func() {
			at := t0.Add(time.Duration(i) * time.Millisecond)
			s, err := o.lock(context.Background(), "x", at)
			if err != nil {
				t.Error(err)
				return
			}
			defer o.unlock("x", s)
			inside++ // a race the detector reports if lock does not serialize
			if !s.superseded(at) {
				_ = o.written(context.Background(), "x", s, at)
				mu.Lock()
				written = append(written, at)
				mu.Unlock()
			}
			inside--
		})
	}
	wg.Wait()
	for i := 1; i < len(written); i++ {
		if !written[i].After(written[i-1]) {
			t.Fatalf("write %d (%s) after %s: an older job written after a newer", i, written[i], written[i-1])
		}
	}
	s := mustLock(t, &o, "x", t0)
	defer o.unlock("x", s)
	if want := t0.Add((n - 1) * time.Millisecond); !s.newest.Equal(want) || inside != 0 {
		t.Errorf("newest = %s, want %s", s.newest, want)
	}
}

// orderBucket starts a NATS server and returns the watcher's bucket of
// the outcome order on it, as the watcher's connection makes it.
func orderBucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir(), Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range events.Buckets(1) {
		if cfg.Bucket != events.OrderBucket {
			continue
		}
		kv, err := js.CreateOrUpdateKeyValue(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return kv
	}
	t.Fatalf("no bucket %s in events.Buckets", events.OrderBucket)
	return nil
}

// TestOrderOutlivesTheProcess runs two orders on one bucket, as a leader
// and the next: the next supersedes the jobs older than the newest one
// the first wrote, from the first outcome it sees, and lets its own
// through even when the first's clock was ahead of its own; a deleted
// source's entry goes.
func TestOrderOutlivesTheProcess(t *testing.T) {
	ctx := context.Background()
	kv := orderBucket(t)
	t0 := time.Date(2026, 12, 4, 20, 0, 0, 0, time.UTC)

	first := &order{store: KVOrder{KV: kv}, since: t0}
	s := mustLock(t, first, "a", t0.Add(2*time.Second))
	mustWrite(t, first, "a", s, t0.Add(2*time.Second))
	first.unlock("a", s)
	// A redelivery of an older job's outcome, written before, writes no
	// older entry.
	s = mustLock(t, first, "a", t0.Add(time.Second))
	mustWrite(t, first, "a", s, t0.Add(time.Second))
	first.unlock("a", s)
	if got, err := (KVOrder{KV: kv}).Load(ctx, "a"); err != nil || !got.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("the bucket's entry = %s, %v; want %s", got, err, t0.Add(2*time.Second))
	}

	// The next leader, elected a minute later.
	next := &order{store: KVOrder{KV: kv}, since: t0.Add(time.Minute)}
	s = mustLock(t, next, "a", t0.Add(time.Second))
	if !s.superseded(t0.Add(time.Second)) {
		t.Error("the next leader did not supersede a job older than the newest the first wrote")
	}
	if s.superseded(t0.Add(2*time.Second)) || s.superseded(t0.Add(time.Minute)) {
		t.Error("the next leader superseded the newest job written, or one of its own")
	}
	next.unlock("a", s)

	// A leader whose clock is behind the first's: elected, by its
	// clock, before the first's newest job; its own jobs still pass.
	behind := &order{store: KVOrder{KV: kv}, since: t0.Add(time.Second + 500*time.Millisecond)}
	s = mustLock(t, behind, "a", t0)
	if s.superseded(t0.Add(time.Second + 600*time.Millisecond)) {
		t.Error("a job of a leader whose clock is behind was superseded by the previous leader's")
	}
	if !s.superseded(t0) {
		t.Error("a job older than the new leader's election was not superseded")
	}
	behind.unlock("a", s)

	if err := next.forget(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got, err := (KVOrder{KV: kv}).Load(ctx, "a"); err != nil || !got.IsZero() {
		t.Errorf("the bucket's entry after the source's deletion = %s, %v; want none", got, err)
	}
	if err := next.forget(ctx, "a"); err != nil {
		t.Errorf("forgetting a source twice: %v", err)
	}
}

// failingStore is an OrderStore whose every call fails.
type failingStore struct{}

var errStore = errors.New("bucket unreachable")

func (failingStore) Load(context.Context, types.UID) (time.Time, error) { return time.Time{}, errStore }
func (failingStore) Store(context.Context, types.UID, time.Time) error  { return errStore }
func (failingStore) Forget(context.Context, types.UID) error            { return errStore }

// TestOrderStoreFails checks that an entry that cannot be read is an
// error (the outcome is tried again) that leaves the source unlocked, and
// that the store is read only for the outcome of a job older than the
// process's start: a job of its own needs no previous leader's order.
func TestOrderStoreFails(t *testing.T) {
	since := time.Date(2026, 12, 4, 20, 0, 0, 0, time.UTC)
	o := &order{store: failingStore{}, since: since}
	for range 2 { // a second lock would block if the first failed locked
		if _, err := o.lock(context.Background(), "a", since.Add(-time.Second)); !errors.Is(err, errStore) {
			t.Fatalf("lock with an unreadable bucket: %v, want %v", err, errStore)
		}
	}
	s, err := o.lock(context.Background(), "a", since)
	if err != nil {
		t.Fatalf("lock for a job of this process read the bucket: %v", err)
	}
	if err := o.written(context.Background(), "a", s, since); !errors.Is(err, errStore) {
		t.Errorf("write with an unwritable bucket: %v, want %v", err, errStore)
	}
	o.unlock("a", s)
	// Ordered in memory all the same, and the bucket is not read again.
	s, err = o.lock(context.Background(), "a", since.Add(-time.Second))
	if err != nil || !s.superseded(since.Add(-time.Second)) {
		t.Errorf("after a job of this process was written: lock for an older job = %v, superseded %t; want no error, true", err, err == nil && s.superseded(since.Add(-time.Second)))
	}
	if err == nil {
		o.unlock("a", s)
	}
	if err := o.forget(context.Background(), "a"); !errors.Is(err, errStore) {
		t.Errorf("forget with an unwritable bucket: %v, want %v", err, errStore)
	}
	if n := o.len(); n != 0 {
		t.Errorf("entries after failed locks = %d, want 0", n)
	}
}
