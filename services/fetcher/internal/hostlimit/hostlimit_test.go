package hostlimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestParseRules(t *testing.T) {
	rules, err := ParseRules(" github.com=10/20, *.example.com=5 ,registry.local:5000=0,*=50/100")
	must(t, err)
	if got, want := rules.String(), "github.com=10/20,*.example.com=5/5,registry.local:5000=0/1,*=50/100"; got != want {
		t.Errorf("rules %s, want %s", got, want)
	}
	for host, want := range map[string]string{
		"github.com": "github.com", "GitHub.com:443": "github.com", "charts.example.com": "*.example.com",
		"registry.local:5000": "registry.local:5000", "registry.local": "*", "[::1]:8080": "*",
	} {
		if got := rules.For(host).Pattern; got != want {
			t.Errorf("For(%s) = %s, want %s", host, got, want)
		}
	}
	if r := (Rules{}).For("a"); r.Rate != 0 {
		t.Errorf("no rules limit %s to %v/s", "a", r.Rate)
	}
	for _, bad := range []string{"github.com", "=1/1", "a=-1", "a=x/1", "a=1/0", "a=1/x", "[=1/1"} {
		if _, err := ParseRules(bad); err == nil {
			t.Errorf("ParseRules(%q) accepted", bad)
		}
	}
	if _, err := ParseRules(DefaultRules); err != nil {
		t.Errorf("the default rules do not parse: %v", err)
	}
}

// TestRetryAfter checks that every Retry-After is read as a hold within
// [MinHold, MaxHold]: seconds, an HTTP date, a past date, zero, years
// ahead; a malformed one is the default hold for a 429 and none for a 503.
func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		code   int
		header string
		want   time.Duration
		ok     bool
	}{
		{429, "40", 40 * time.Second, true},
		{503, "40", 40 * time.Second, true},
		{429, now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{429, now.Add(-time.Hour).Format(http.TimeFormat), MinHold, true},
		{429, "0", MinHold, true},
		{429, "-5", MinHold, true},
		{429, "315360000", MaxHold, true},
		{429, "99999999999999999999", DefaultHold, true},
		{429, now.AddDate(5, 0, 0).Format(http.TimeFormat), MaxHold, true},
		{429, "soon", DefaultHold, true},
		{429, "", DefaultHold, true},
		{503, "soon", 0, false},
		{503, "", 0, false},
		{500, "40", 0, false},
		{200, "40", 0, false},
	}
	for _, tc := range cases {
		resp := &http.Response{StatusCode: tc.code, Header: http.Header{}}
		if tc.header != "" {
			resp.Header.Set("Retry-After", tc.header)
		}
		d, ok := RetryAfter(resp, now)
		if d != tc.want || ok != tc.ok {
			t.Errorf("%d Retry-After %q: %v, %v; want %v, %v", tc.code, tc.header, d, ok, tc.want, tc.ok)
		}
	}
}

// TestLimiterBucket checks the token bucket at a frozen clock: a burst
// goes at once, the next request waits one interval (if MaxWait allows)
// or is refused with when it may go, a refused request takes no slot, a
// host without a rule is not limited, and a hold refuses everything until
// it ends.
func TestLimiterBucket(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	rules, err := ParseRules("limited=10/3,*=0")
	must(t, err)
	l := &Limiter{Rules: rules, Store: &MemoryStore{}, Now: func() time.Time { return now }}
	ctx := t.Context()
	for i := range 3 {
		if err := l.Acquire(ctx, "limited"); err != nil {
			t.Fatalf("request %d of the burst: %v", i+1, err)
		}
	}
	for range 2 {
		var held *HeldError
		if err := l.Acquire(ctx, "limited"); !errors.As(err, &held) || held.ByHost || !held.Until.Equal(now.Add(100*time.Millisecond)) {
			t.Fatalf("request over the burst: %v, want held by the limit until %v", err, now.Add(100*time.Millisecond))
		}
	}
	for range 100 {
		must(t, l.Acquire(ctx, "unlimited"))
	}
	must(t, l.Hold(ctx, "unlimited", now.Add(time.Minute)))
	must(t, l.Hold(ctx, "unlimited", now.Add(time.Second))) // an earlier end does not shorten it
	var held *HeldError
	if err := l.Acquire(ctx, "UNLIMITED"); !errors.As(err, &held) || !held.ByHost || !held.Until.Equal(now.Add(time.Minute)) {
		t.Fatalf("request to a held host: %v, want held by the host for a minute", err)
	}
	ctx2, tracker := Track(ctx)
	_ = l.Acquire(ctx2, "unlimited")
	if h := tracker.Held(); h == nil || h.Host != "unlimited" {
		t.Errorf("the fetch's tracker did not learn of the hold: %v", h)
	}
	now = now.Add(time.Minute)
	must(t, l.Acquire(ctx, "unlimited"))
}

// TestLimiterWaits checks a request waits for its slot within MaxWait,
// then goes.
func TestLimiterWaits(t *testing.T) {
	rules, err := ParseRules("h=20/1")
	must(t, err)
	l := &Limiter{Rules: rules, Store: &MemoryStore{}, MaxWait: time.Minute}
	for range 3 {
		must(t, l.Acquire(t.Context(), "h"))
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	l.Rules, _ = ParseRules("h=0.001/1")
	must(t, l.Acquire(t.Context(), "other"))
	if err := l.Acquire(ctx, "h"); !errors.Is(err, context.Canceled) {
		t.Errorf("a wait whose context ended: %v, want context.Canceled", err)
	}
}

// hostBus connects n fetchers (each with its own connection, as n
// replicas) to the host bucket on a real NATS server that knows only
// Headwater's identities.
func hostBus(t testing.TB, n int) []jetstream.KeyValue {
	t.Helper()
	ctx := context.Background()
	ids, err := natsserver.NewIdentities(t.TempDir())
	must(t, err)
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir(), Users: ids.Users})
	must(t, err)
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	var kvs []jetstream.KeyValue
	for i := range n {
		c, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL(), NKeyFile: ids.SeedFiles[events.FetcherIdentity]}, events.FetcherIdentity, logr.Discard())
		must(t, err)
		t.Cleanup(c.Close)
		if i == 0 {
			must(t, c.EnsureStreams(ctx))
		}
		kv, err := c.JS.KeyValue(ctx, events.HostBucket)
		must(t, err)
		kvs = append(kvs, kv)
	}
	return kvs
}

// TestKVStoreShared checks that three replicas racing for one host's
// bucket at a frozen clock grant exactly its burst between them
// (compare-and-set loses no write), and that a hold one records holds the
// others, seen through their watch.
func TestKVStoreShared(t *testing.T) {
	kvs := hostBus(t, 3)
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	rules, err := ParseRules("git.example.com=5/25")
	must(t, err)
	var limiters []*Limiter
	for _, kv := range kvs {
		s := &KVStore{KV: kv}
		must(t, s.Watch(t.Context()))
		limiters = append(limiters, &Limiter{Rules: rules, Store: s, Now: func() time.Time { return now }, Log: logr.Discard()})
	}
	var granted, refused atomic.Int64
	var wg sync.WaitGroup
	for _, l := range limiters {
		for range 4 {
			wg.Go(func() {
				for range 10 {
					switch err := l.Acquire(t.Context(), "git.example.com"); {
					case err == nil:
						granted.Add(1)
					case errors.As(err, new(*HeldError)):
						refused.Add(1)
					default:
						t.Error(err)
					}
				}
			})
		}
	}
	wg.Wait()
	if granted.Load() != 25 || refused.Load() != 95 {
		t.Errorf("granted %d, refused %d of 120; want the burst, 25, granted", granted.Load(), refused.Load())
	}
	must(t, limiters[0].Hold(t.Context(), "held.example.com", now.Add(time.Minute)))
	for i, l := range limiters[1:] {
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := l.Acquire(t.Context(), "held.example.com")
			if errors.As(err, new(*HeldError)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d does not see the hold: %v", i+2, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestTransport checks the transport against a real server that answers
// 429 with Retry-After: the answer reaches the caller, the host is held,
// and the next request is not sent.
func TestTransport(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if served.Add(1) > 2 {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	l := &Limiter{Rules: Rules{}, Store: &MemoryStore{}}
	c := &http.Client{Transport: &Transport{Limiter: l}}
	ctx, tracker := Track(t.Context())
	get := func() (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		must(t, err)
		return c.Do(req)
	}
	for range 3 {
		resp, err := get()
		must(t, err)
		resp.Body.Close()
	}
	h := tracker.Held()
	if h == nil || !h.ByHost || !strings.HasPrefix(srv.URL, "http://"+h.Host) {
		t.Fatalf("held %v, want the server's host held", h)
	}
	if _, err := get(); !errors.As(err, new(*HeldError)) {
		t.Errorf("request to a held host: %v, want a *HeldError", err)
	}
	if n := served.Load(); n != 3 {
		t.Errorf("the server saw %d requests, want 3: none while it is held", n)
	}
}

// TestTransportAdmits checks that a fetch's first request to a host waits
// for its slot at most MaxWait, while its later ones queue for theirs:
// a second fetch is refused at its first request, the first fetch's
// second request waits beyond MaxWait and is sent, and a later request
// whose slot comes after its fetch's deadline is refused at once.
func TestTransportAdmits(t *testing.T) {
	var served atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		_, _ = io.WriteString(w, "ok")
	})
	srv, other := httptest.NewServer(handler), httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	t.Cleanup(other.Close)
	// One request a second, none waiting: MaxWait is far below a slot.
	rules, err := ParseRules("*=1/1")
	must(t, err)
	l := &Limiter{Rules: rules, Store: &MemoryStore{}, MaxWait: 10 * time.Millisecond}
	c := &http.Client{Transport: &Transport{Limiter: l}}
	get := func(ctx context.Context, url string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		must(t, err)
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	}
	fetchA, _ := Track(t.Context())
	fetchB, trackerB := Track(t.Context())
	must(t, get(fetchA, srv.URL+"/info/refs"))
	if err := get(fetchB, srv.URL+"/info/refs"); !errors.As(err, new(*HeldError)) {
		t.Fatalf("a second fetch's first request, a slot away: %v, want refused with a *HeldError", err)
	}
	if trackerB.Held() == nil {
		t.Error("the refused fetch's tracker did not learn of the hold")
	}
	if err := get(fetchA, srv.URL+"/git-upload-pack"); err != nil {
		t.Fatalf("the admitted fetch's second request: %v, want it sent when its slot comes", err)
	}
	if n := served.Load(); n != 2 {
		t.Errorf("the host served %d requests, want the admitted fetch's 2", n)
	}
	// A fetch that must end before its next slot is refused, not left
	// waiting for its context to end.
	short, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	fetchC, _ := Track(short)
	must(t, get(fetchC, other.URL+"/info/refs"))
	if err := get(fetchC, other.URL+"/git-upload-pack"); !errors.As(err, new(*HeldError)) {
		t.Errorf("a later request whose slot is after its fetch's deadline: %v, want a *HeldError", err)
	}
	if short.Err() != nil {
		t.Error("the request waited for its fetch's deadline instead of being refused at once")
	}
}

// TestTransportPlainHTTPProbe checks the HTTPS probe go-containerregistry
// makes of a registry marked insecure that speaks plain HTTP: the first
// one takes a slot and is not counted as sent (the host's HTTP layer never
// saw it); later ones take no slot; the plain HTTP requests are limited
// as any.
func TestTransportPlainHTTPProbe(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	rules, err := ParseRules("*=1/1")
	must(t, err)
	now := time.Now()
	l := &Limiter{Rules: rules, Store: &MemoryStore{}, MaxWait: 10 * time.Millisecond, Metrics: NewMetrics(prometheus.NewRegistry()),
		Now: func() time.Time { return now }}
	c := &http.Client{Transport: &Transport{Limiter: l}}
	get := func(url string) error {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		must(t, err)
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	}
	probe := "https" + strings.TrimPrefix(srv.URL, "http") + "/v2/"
	for i := range 3 {
		// The bucket has one slot a second and the clock stands still:
		// only the first probe could have had one.
		if err := get(probe); err == nil || errors.As(err, new(*HeldError)) {
			t.Fatalf("probe %d, HTTPS to a plain HTTP server: %v, want a failed handshake, not a hold", i+1, err)
		}
	}
	if err := get(srv.URL + "/v2/"); !errors.As(err, new(*HeldError)) {
		t.Errorf("plain HTTP within the second of the first probe: %v, want it refused: the probe's slot stays taken", err)
	}
	now = now.Add(time.Second)
	if err := get(srv.URL + "/v2/"); err != nil {
		t.Errorf("plain HTTP a second later: %v, want it sent", err)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	if n := testutil.ToFloat64(l.Metrics.requests.WithLabelValues(host)); n != 1 || served.Load() != 1 {
		t.Errorf("counted %v requests sent, the host served %d; want 1 and 1", n, served.Load())
	}
}

// TestLimiterWaitsForHold checks a request to a host held for less than
// MaxWait waits for the hold to end and goes, while one held for longer
// is refused at once.
func TestLimiterWaitsForHold(t *testing.T) {
	l := &Limiter{Rules: Rules{}, Store: &MemoryStore{}, MaxWait: time.Minute}
	ctx := t.Context()
	must(t, l.Hold(ctx, "short", time.Now().Add(20*time.Millisecond)))
	must(t, l.Acquire(ctx, "short"))
	must(t, l.Hold(ctx, "long", time.Now().Add(time.Hour)))
	if err := l.Acquire(ctx, "long"); !errors.As(err, new(*HeldError)) {
		t.Errorf("request to a host held beyond MaxWait: %v, want a *HeldError", err)
	}
	// A frozen clock: the hold's end is taken as passed once waited for.
	now := time.Now()
	frozen := &Limiter{Rules: Rules{}, Store: &MemoryStore{}, MaxWait: time.Minute, Now: func() time.Time { return now }}
	must(t, frozen.Hold(ctx, "h", now.Add(10*time.Millisecond)))
	must(t, frozen.Acquire(ctx, "h"))
}

// TestTransportResends checks that a request the host refuses with a
// hold shorter than MaxWait is sent again, body included, once the hold
// ends, and the caller sees only the answer to the second; a request
// whose body cannot be read again gets the host's answer, and the fetch
// learns of the hold.
func TestTransportResends(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		n := len(bodies)
		mu.Unlock()
		if n%2 == 1 {
			// In the past: the shortest hold.
			w.Header().Set("Retry-After", time.Now().Add(-time.Hour).Format(http.TimeFormat))
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	l := &Limiter{Rules: Rules{}, Store: &MemoryStore{}, MaxWait: time.Minute}
	c := &http.Client{Transport: &Transport{Limiter: l}}

	ctx, tracker := Track(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("want"))
	must(t, err)
	resp, err := c.Do(req)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("status %d, want 200 from the request sent again", resp.StatusCode)
	}
	mu.Lock()
	got := slices.Clone(bodies)
	mu.Unlock()
	if !slices.Equal(got, []string{"want", "want"}) {
		t.Errorf("the server got bodies %q, want the request twice", got)
	}
	if h := tracker.Held(); h != nil {
		t.Errorf("the fetch learnt of a hold it waited out: %v", h)
	}

	ctx, tracker = Track(t.Context())
	req, err = http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, io.NopCloser(strings.NewReader("once")))
	must(t, err)
	resp, err = c.Do(req)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("a body that cannot be read again: status %d, want the host's 429", resp.StatusCode)
	}
	mu.Lock()
	n := len(bodies)
	mu.Unlock()
	if n != 3 {
		t.Errorf("the server got %d requests, want 3: a body read once is not sent again", n)
	}
	if h := tracker.Held(); h == nil || !h.ByHost {
		t.Errorf("held %v, want the host's hold known to the fetch", h)
	}
}

// BenchmarkAcquire measures what the limiter costs per request: in the
// process (MemoryStore), and shared through a NATS key-value bucket by
// one replica and by three contending for the same host (KVStore, a real
// NATS server on loopback).
func BenchmarkAcquire(b *testing.B) {
	rules, err := ParseRules("*=1000000000/1000000000")
	must(b, err)
	b.Run("memory", func(b *testing.B) {
		l := &Limiter{Rules: rules, Store: &MemoryStore{}}
		for b.Loop() {
			_ = l.Acquire(context.Background(), "git.example.com")
		}
	})
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("kv-%d-replicas", n), func(b *testing.B) {
			kvs := hostBus(b, n)
			var ls []*Limiter
			for _, kv := range kvs {
				ls = append(ls, &Limiter{Rules: rules, Store: &KVStore{KV: kv}, Log: logr.Discard()})
			}
			var i atomic.Int64
			b.SetParallelism(n)
			b.RunParallel(func(pb *testing.PB) {
				l := ls[int(i.Add(1)-1)%len(ls)]
				for pb.Next() {
					must(b, l.Acquire(context.Background(), "git.example.com"))
				}
			})
		})
	}
}

// TestMetricsSeries checks that every per-host family has the series of
// a host once one request to it went, before any refusal.
func TestMetricsSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := &Limiter{Rules: Rules{}, Store: &MemoryStore{}, Metrics: NewMetrics(reg)}
	must(t, l.Acquire(t.Context(), "example.com"))
	families, err := reg.Gather()
	must(t, err)
	got := map[string]int{}
	for _, f := range families {
		got[f.GetName()] = len(f.GetMetric())
	}
	for name, want := range map[string]int{
		"headwater_fetch_host_requests_total": 1, "headwater_fetch_host_throttled_total": 2,
		"headwater_fetch_host_retry_after_total": 2, "headwater_fetch_host_wait_seconds_total": 1,
		"headwater_fetch_host_resent_total": 1,
	} {
		if got[name] != want {
			t.Errorf("%s: %d series, want %d", name, got[name], want)
		}
	}
}
