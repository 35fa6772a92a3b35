package fetch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// secureBus starts a real NATS server that knows only Headwater's
// identities, with the permissions events.Permissions gives them, and
// returns a function that connects as one of them.
func secureBus(t *testing.T, ctx context.Context) func(identity string) *bus.Conn {
	t.Helper()
	ids, err := natsserver.NewIdentities(t.TempDir())
	must(t, err)
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir(), Users: ids.Users})
	must(t, err)
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return func(identity string) *bus.Conn {
		c, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL(), NKeyFile: ids.SeedFiles[identity]}, identity, logr.Discard())
		must(t, err)
		t.Cleanup(c.Close)
		return c
	}
}

// flightBucket connects two fetchers (each with its own connection, as
// two replicas) to the flight bucket, which the first creates as it
// starts, or with ttl when positive.
func flightBucket(t *testing.T, ctx context.Context, ttl time.Duration) (a, b jetstream.KeyValue) {
	t.Helper()
	connect := secureBus(t, ctx)
	first, second := connect(events.FetcherIdentity), connect(events.FetcherIdentity)
	if ttl > 0 {
		cfg := events.Buckets(1)[0]
		cfg.TTL, cfg.LimitMarkerTTL = ttl, ttl
		_, err := first.JS.CreateKeyValue(ctx, cfg)
		must(t, err)
	} else {
		must(t, first.EnsureStreams(ctx))
	}
	a, err := first.JS.KeyValue(ctx, events.FlightBucket)
	must(t, err)
	b, err = second.JS.KeyValue(ctx, events.FlightBucket)
	must(t, err)
	return a, b
}

// staged is a leader's Fetched job for content staged at key.
func staged(key string) *events.Fetched {
	return &events.Fetched{Job: events.Job{ID: "job-leader"}, Revision: "main@sha1:abc", Staging: storage.StagingKey("job-leader"),
		ArtifactName: "abc.tar.gz", ContentKey: key}
}

// waitResult is what Wait returned.
type waitResult struct {
	staged  *events.Fetched
	outcome string
}

// follow runs Wait in the background.
func follow(ctx context.Context, l *Leases, key string) <-chan waitResult {
	out := make(chan waitResult, 1)
	go func() {
		s, o := l.Wait(ctx, key)
		out <- waitResult{s, o}
	}()
	return out
}

// result returns what Wait returned, failing the test if it does not
// return within a minute.
func result(t *testing.T, c <-chan waitResult) waitResult {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(time.Minute):
		t.Fatal("the follower is still waiting")
	}
	return waitResult{}
}

// TestLeaseLandsForFollowers: of two fetchers (each with the fetcher
// identity's permissions only) fetching one content key, the first leads;
// the second follows and gets what the leader landed, as does one that
// comes once it landed.
func TestLeaseLandsForFollowers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, b := flightBucket(t, ctx, 0)
	leader, follower := &Leases{KV: a, Holder: "a"}, &Leases{KV: b, Holder: "b"}
	const key = "0123abcd"

	lease, err := leader.Acquire(ctx, key)
	if err != nil || lease == nil {
		t.Fatalf("first Acquire: %v, %v; want the lease", lease, err)
	}
	other, err := follower.Acquire(ctx, key)
	if err != nil || other != nil {
		t.Fatalf("second Acquire: %v, %v; want no lease", other, err)
	}
	waiting := follow(ctx, follower, key)
	want := staged(key)
	must(t, lease.Land(ctx, want))
	got := result(t, waiting)
	if got.outcome != CombineFollowedRemote || got.staged == nil || got.staged.Staging != want.Staging || got.staged.Revision != want.Revision {
		t.Errorf("follower got %+v, %q; want %+v, %q", got.staged, got.outcome, want, CombineFollowedRemote)
	}
	// Releasing a landed lease changes nothing.
	lease.Release(ctx)

	late, err := follower.Acquire(ctx, key)
	if err != nil || late != nil {
		t.Fatalf("Acquire after the landing: %v, %v; want no lease", late, err)
	}
	if got := result(t, follow(ctx, follower, key)); got.outcome != CombineFollowedRemote || got.staged == nil {
		t.Errorf("late follower got %+v, %q; want the landed job", got.staged, got.outcome)
	}
}

// TestLeaseReleasedByAFailedLeader: a leader that fails releases its
// lease; its follower stops waiting at once and the next fetch leads.
func TestLeaseReleasedByAFailedLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, b := flightBucket(t, ctx, 0)
	leader, follower := &Leases{KV: a, Holder: "a"}, &Leases{KV: b, Holder: "b"}
	const key = "failing"
	lease, err := leader.Acquire(ctx, key)
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v, %v; want the lease", lease, err)
	}
	waiting := follow(ctx, follower, key)
	lease.Release(ctx)
	if got := result(t, waiting); got.staged != nil || got.outcome != CombineLeaderFailed {
		t.Errorf("follower got %+v, %q; want nothing, %q", got.staged, got.outcome, CombineLeaderFailed)
	}
	next, err := follower.Acquire(ctx, key)
	if err != nil || next == nil {
		t.Fatalf("Acquire after the release: %v, %v; want the lease", next, err)
	}
	next.Release(ctx)
}

// TestLeaseOfADeadLeaderExpires: a leader that dies (it created its entry
// and never wrote it again) holds no one up past the bucket's TTL: the
// bucket removes its entry, the follower waiting sees it go, and the next
// fetch leads.
func TestLeaseOfADeadLeaderExpires(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, b := flightBucket(t, ctx, time.Second)
	const key = "dead"
	value, err := json.Marshal(flightEntry{Key: key, Holder: "dead"})
	must(t, err)
	_, err = a.Create(ctx, key, value)
	must(t, err)
	// The follower's own patience is long: the bucket's expiry ends the wait.
	follower := &Leases{KV: b, Holder: "b", TTL: time.Hour}
	if got := result(t, follow(ctx, follower, key)); got.staged != nil || got.outcome != CombineLeaseExpired {
		t.Errorf("follower got %+v, %q; want nothing, %q", got.staged, got.outcome, CombineLeaseExpired)
	}
	next, err := follower.Acquire(ctx, key)
	if err != nil || next == nil {
		t.Fatalf("Acquire after the expiry: %v, %v; want the lease", next, err)
	}
	next.Release(ctx)

	// A follower that sees no write for its TTL stops waiting too,
	// whatever the bucket does.
	_, err = a.Create(ctx, "silent", []byte(`{"key":"silent","holder":"dead"}`))
	must(t, err)
	impatient := &Leases{KV: b, Holder: "b", TTL: 100 * time.Millisecond}
	if got := result(t, follow(ctx, impatient, "silent")); got.outcome != CombineLeaseExpired {
		t.Errorf("impatient follower: %q, want %q", got.outcome, CombineLeaseExpired)
	}
}

// TestLeaseRenewedWhileTheLeaderFetches: a leader renews its lease while
// it fetches, for longer than the TTL: its follower waits on until its
// own job's time runs out.
func TestLeaseRenewedWhileTheLeaderFetches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ttl := time.Second
	a, b := flightBucket(t, ctx, ttl)
	leader, follower := &Leases{KV: a, Holder: "a", TTL: ttl}, &Leases{KV: b, Holder: "b", TTL: ttl}
	const key = "slow"
	lease, err := leader.Acquire(ctx, key)
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v, %v; want the lease", lease, err)
	}
	defer lease.Release(ctx)
	job, stop := context.WithTimeout(ctx, 6*ttl)
	defer stop()
	if got := result(t, follow(job, follower, key)); got.staged != nil || got.outcome != "" {
		t.Errorf("follower got %+v, %q while the leader renewed its lease; want to wait until its job's time ran out", got.staged, got.outcome)
	}
}

// TestForeignEntriesAreNotFollowed: an entry no leader wrote (not JSON,
// under another key, naming content outside the staging area or a cached
// artifact) neither crashes a fetcher nor sends it copying: it fetches.
func TestForeignEntriesAreNotFollowed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, b := flightBucket(t, ctx, 0)
	follower := &Leases{KV: b, Holder: "b"}
	landed := func(key string, mutate func(*events.Fetched)) string {
		f := staged(key)
		mutate(f)
		v, err := json.Marshal(flightEntry{Key: key, Holder: "x", Fetched: f})
		must(t, err)
		return string(v)
	}
	for _, tc := range []struct {
		name, key, value string
		ok               bool
	}{
		{"lease", "k1", `{"key":"k1","holder":"a"}`, true},
		{"landed", "k2", landed("k2", func(*events.Fetched) {}), true},
		{"not json", "k3", "\x00garbage", false},
		{"another key", "k4", `{"key":"k5","holder":"a"}`, false},
		{"outside staging", "k6", landed("k6", func(f *events.Fetched) { f.Staging = "gitrepository/default/app/abc.tar.gz" }), false},
		{"up from staging", "k7", landed("k7", func(f *events.Fetched) { f.Staging = storage.StagingDir + "/../secret" }), false},
		{"cached artifact", "k8", landed("k8", func(f *events.Fetched) { f.Reuse = &events.Reuse{Key: ".cache/x.tar.gz"} }), false},
		{"no revision", "k9", landed("k9", func(f *events.Fetched) { f.Revision = "" }), false},
		{"unknown format", "k10", landed("k10", func(f *events.Fetched) { f.Format = "exe" }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodeEntry(tc.key, []byte(tc.value)); (err == nil) != tc.ok {
				t.Fatalf("decodeEntry: %v, want ok %v", err, tc.ok)
			}
			if tc.ok {
				return
			}
			_, err := a.Put(ctx, tc.key, []byte(tc.value))
			must(t, err)
			if got := result(t, follow(ctx, follower, tc.key)); got.staged != nil || got.outcome != CombineBypassed {
				t.Errorf("follower got %+v, %q; want nothing, %q", got.staged, got.outcome, CombineBypassed)
			}
		})
	}
}

// TestOnlyFetchersUseTheFlightBucket: no other identity may read or write
// the fetches in flight.
func TestOnlyFetchersUseTheFlightBucket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var others []string
	for _, id := range events.Identities() {
		if id != events.FetcherIdentity {
			others = append(others, id)
		}
	}
	connect := secureBus(t, ctx)
	must(t, connect(events.FetcherIdentity).EnsureStreams(ctx))
	for _, id := range others {
		c := connect(id)
		short, stop := context.WithTimeout(ctx, 2*time.Second)
		_, err := c.JS.KeyValue(short, events.FlightBucket)
		stop()
		if err == nil {
			t.Errorf("%s opened the flight bucket", id)
		}
		short, stop = context.WithTimeout(ctx, 2*time.Second)
		_, err = c.JS.Publish(short, "$KV."+events.FlightBucket+".k", []byte(`{"key":"k"}`))
		stop()
		if err == nil || errors.Is(err, context.Canceled) {
			t.Errorf("%s wrote into the flight bucket: %v", id, err)
		}
	}
}

// combinedCount is the count of headwater_fetch_combined_total{outcome}
// summed over regs.
func combinedCount(t *testing.T, outcome string, regs ...*prometheus.Registry) float64 {
	t.Helper()
	return labelledCounter(t, "headwater_fetch_combined_total", "outcome", outcome, regs...)
}

// TestConcurrentFetchesInTwoFetchersDownloadOnce runs two fetchers (two
// replicas, each with its own flights and handling two jobs at once) on
// one bus and storage, and four fetches of one content at once: one
// clone in all; every job staged the same content at its own key.
func TestConcurrentFetchesInTwoFetchersDownloadOnce(t *testing.T) {
	withLeases := func(holder string) func(*Handler) {
		return func(h *Handler) { h.ContentCache, h.Leases = true, &Leases{Holder: holder} }
	}
	e := newEnv(t, 5, withLeases("a"))
	other := prometheus.NewRegistry()
	e.replica(t, other, withLeases("b"))
	// The clone waits until all four fetches listed the remote: each
	// fetcher then has two under way.
	hold := func() {
		deadline := time.Now().Add(10 * time.Second)
		for e.listings.Load() < 4 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	e.beforeClone.Store(&hold)
	for i := range 4 {
		name := fmt.Sprintf("podinfo-%d", i)
		e.request(t, "job-"+name, func(r *events.FetchRequested) { r.Job.Object.Name, r.Job.Object.UID = name, "uid-"+name })
	}
	var jobs []*events.Fetched
	for range 4 {
		jobs = append(jobs, e.fetched(t))
	}
	if n := e.uploads.Load(); n != 1 {
		t.Errorf("%d clones for four fetches of one content in two fetchers, want 1", n)
	}
	want := e.staged(t, jobs[0].Staging)
	seen := map[string]bool{}
	for _, f := range jobs {
		if seen[f.Staging] || f.ContentKey != jobs[0].ContentKey || f.Revision != jobs[0].Revision {
			t.Errorf("job %+v: want its own staging key, the content key and revision of %+v", f, jobs[0])
		}
		seen[f.Staging] = true
		if got := e.staged(t, f.Staging); len(want) == 0 || !slices.Equal(got, want) {
			t.Errorf("%s staged %q, want %q", f.Job.ID, got, want)
		}
	}
	// A follower counts itself once it published its job.
	for outcome, n := range map[string]float64{CombineLed: 1, CombineFollowedRemote: 1, CombineFollowedLocal: 2} {
		deadline := time.Now().Add(10 * time.Second)
		got := combinedCount(t, outcome, e.reg, other)
		for got < n && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			got = combinedCount(t, outcome, e.reg, other)
		}
		if got != n {
			t.Errorf("%s: %v fetches, want %v", outcome, got, n)
		}
	}
}
