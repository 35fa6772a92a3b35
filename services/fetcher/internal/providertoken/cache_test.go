package providertoken

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testingclock "k8s.io/utils/clock/testing"
)

func newTestCache(t *testing.T, max int) (*Cache, *testingclock.FakeClock, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	c := NewCache(max, reg)
	clk := testingclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c.now = clk.Now
	return c, clk, reg
}

// minter mints numbered tokens valid for ttl from clk's time.
type minter struct {
	clk   *testingclock.FakeClock
	ttl   time.Duration
	calls atomic.Int32
}

func (m *minter) mint(context.Context) (Token, error) {
	n := m.calls.Add(1)
	return Token{Value: fmt.Sprintf("t%d", n), ExpiresAt: m.clk.Now().Add(m.ttl)}, nil
}

func TestCacheReusesUntil80PercentOfLifetime(t *testing.T) {
	c, clk, reg := newTestCache(t, 0)
	m := &minter{clk: clk, ttl: 10 * time.Minute}
	ctx := context.Background()
	get := func() string {
		t.Helper()
		tok, err := c.Get(ctx, ProviderGitHub, "k", m.mint)
		if err != nil {
			t.Fatal(err)
		}
		return tok.Value
	}
	if got := get(); got != "t1" {
		t.Fatalf("first token %q, want t1", got)
	}
	clk.Step(7*time.Minute + 59*time.Second)
	if got := get(); got != "t1" {
		t.Errorf("token at 79%% of its lifetime %q, want the cached t1", got)
	}
	clk.Step(2 * time.Second)
	if got := get(); got != "t2" {
		t.Errorf("token past 80%% of its lifetime %q, want a new one", got)
	}
	if n := testutil.ToFloat64(c.metrics.WithLabelValues(ProviderGitHub, ResultMinted)); n != 2 {
		t.Errorf("minted counter %v, want 2", n)
	}
	if n := testutil.ToFloat64(c.metrics.WithLabelValues(ProviderGitHub, ResultCached)); n != 1 {
		t.Errorf("cached counter %v, want 1", n)
	}
	if n, err := testutil.GatherAndCount(reg, "headwater_provider_tokens_total"); err != nil || n != 2 {
		t.Errorf("registered series %d (%v), want 2", n, err)
	}
}

func TestCacheCapsReuseAtAnHour(t *testing.T) {
	c, clk, _ := newTestCache(t, 0)
	m := &minter{clk: clk, ttl: 24 * time.Hour}
	for _, step := range []time.Duration{0, 59 * time.Minute, 2 * time.Minute} {
		clk.Step(step)
		if _, err := c.Get(context.Background(), ProviderAzure, "k", m.mint); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.calls.Load(); n != 2 {
		t.Errorf("mints over 61 minutes of a day-long token %d, want 2 (reuse capped at an hour)", n)
	}
}

func TestCacheMaxDurationIsSettable(t *testing.T) {
	c, clk, _ := newTestCache(t, 0)
	c.WithMaxDuration(5 * time.Minute)
	m := &minter{clk: clk, ttl: 24 * time.Hour}
	for _, step := range []time.Duration{0, 4 * time.Minute, 2 * time.Minute} {
		clk.Step(step)
		if _, err := c.Get(context.Background(), ProviderAWS, "k", m.mint); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.calls.Load(); n != 2 {
		t.Errorf("mints over 6 minutes with --token-cache-max-duration=5m %d, want 2", n)
	}
}

func TestCacheSharesOneMintAcrossConcurrentFetches(t *testing.T) {
	c, clk, _ := newTestCache(t, 0)
	release := make(chan struct{})
	var calls atomic.Int32
	mint := func(context.Context) (Token, error) {
		calls.Add(1)
		<-release
		return Token{Value: "shared", ExpiresAt: clk.Now().Add(time.Hour)}, nil
	}
	const n = 16
	var wg, started sync.WaitGroup
	got := make([]string, n)
	started.Add(n)
	for i := range n {
		wg.Go(func() {
			started.Done()
			tok, err := c.Get(context.Background(), ProviderGitHub, "k", mint)
			if err != nil {
				t.Error(err)
			}
			got[i] = tok.Value
		})
	}
	// The mint finishes once every fetch is on its way; those that come
	// after it are answered by the cached token.
	started.Wait()
	close(release)
	wg.Wait()
	if calls.Load() != 1 {
		t.Errorf("mints %d for %d concurrent fetches, want 1", calls.Load(), n)
	}
	for i, v := range got {
		if v != "shared" {
			t.Errorf("fetch %d got %q, want the shared token", i, v)
		}
	}
}

func TestCacheDoesNotKeepFailures(t *testing.T) {
	c, clk, _ := newTestCache(t, 0)
	boom := errors.New("boom")
	_, err := c.Get(context.Background(), ProviderGitHub, "k", func(context.Context) (Token, error) { return Token{}, boom })
	if !errors.Is(err, boom) {
		t.Fatalf("error %v, want boom", err)
	}
	m := &minter{clk: clk, ttl: time.Hour}
	if tok, err := c.Get(context.Background(), ProviderGitHub, "k", m.mint); err != nil || tok.Value != "t1" {
		t.Errorf("after a failure: %q, %v; want a new token", tok.Value, err)
	}
	if n := testutil.ToFloat64(c.metrics.WithLabelValues(ProviderGitHub, ResultFailed)); n != 1 {
		t.Errorf("failed counter %v, want 1", n)
	}
}

func TestCacheIsBounded(t *testing.T) {
	c, clk, _ := newTestCache(t, 3)
	for i := range 10 {
		m := &minter{clk: clk, ttl: time.Duration(i+1) * time.Minute}
		if _, err := c.Get(context.Background(), ProviderGitHub, fmt.Sprint(i), m.mint); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.Len(); n != 3 {
		t.Errorf("entries %d, want at most 3", n)
	}
	// The survivors are the longest-lived: 7, 8 and 9.
	m := &minter{clk: clk, ttl: time.Hour}
	if _, err := c.Get(context.Background(), ProviderGitHub, "9", m.mint); err != nil || m.calls.Load() != 0 {
		t.Errorf("the longest-lived token was evicted (%d mints, %v)", m.calls.Load(), err)
	}
}

func TestNilCacheMintsEveryTime(t *testing.T) {
	var c *Cache
	m := &minter{clk: testingclock.NewFakeClock(time.Now()), ttl: time.Hour}
	for range 3 {
		if _, err := c.Get(context.Background(), ProviderGitHub, "k", m.mint); err != nil {
			t.Fatal(err)
		}
	}
	if m.calls.Load() != 3 {
		t.Errorf("mints %d, want 3", m.calls.Load())
	}
}

func TestKeyDependsOnEveryPart(t *testing.T) {
	seen := map[string]bool{}
	for _, parts := range [][]string{{"a", "b"}, {"ab"}, {"a", "b", ""}, {"b", "a"}} {
		k := Key(parts...)
		if seen[k] {
			t.Errorf("Key(%q) collides", parts)
		}
		seen[k] = true
	}
}
