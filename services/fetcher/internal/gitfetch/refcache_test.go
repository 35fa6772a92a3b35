package gitfetch

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// countingProxy serves target through a reverse proxy that counts
// reference listings (GET info/refs) and clones (POST git-upload-pack).
type countingProxy struct {
	url               string
	listings, uploads atomic.Int64
}

func newCountingProxy(t *testing.T, target string) *countingProxy {
	t.Helper()
	u, err := url.Parse(target)
	must(t, err)
	p := &countingProxy{}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/info/refs"):
			p.listings.Add(1)
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack"):
			p.uploads.Add(1)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

// resolveAll resolves reqs concurrently and returns each one's result.
func resolveAll(src *Source, reqs []*events.FetchRequested) ([]string, []error) {
	revs := make([]string, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Go(func() {
			res, err := src.Resolve(context.Background(), req)
			errs[i] = err
			if err == nil {
				revs[i] = res.Revision()
			}
		})
	}
	wg.Wait()
	return revs, errs
}

func TestRefCacheSharesListings(t *testing.T) {
	f := newFixture(t, "", "")
	proxy := newCountingProxy(t, f.srv.URL())
	repoURL := proxy.url + "/repo.git"
	reg := prometheus.NewRegistry()
	src := &Source{RefCache: NewRefCache(time.Minute, 0, reg)}
	if n, err := testutil.GatherAndCount(reg, "headwater_git_ref_listings_total"); err != nil || n != 2 {
		t.Fatalf("registered listing series = %d, %v; want listed and shared", n, err)
	}

	const sources = 20
	reqs := make([]*events.FetchRequested, sources)
	for i := range reqs {
		ref := &sourcev1.GitRepositoryRef{Branch: "master"}
		if i%2 == 1 {
			ref = &sourcev1.GitRepositoryRef{Tag: "v1.0.0"} // another ref of the same remote
		}
		reqs[i] = request(repoURL, ref)
	}
	revs, errs := resolveAll(src, reqs)
	for i := range reqs {
		want := "master@sha1:" + f.c2
		if i%2 == 1 {
			want = "v1.0.0@sha1:" + f.c1
		}
		if errs[i] != nil || revs[i] != want {
			t.Fatalf("source %d resolved %q, %v; want %q", i, revs[i], errs[i], want)
		}
	}
	if n := proxy.listings.Load(); n != 1 {
		t.Errorf("%d concurrent resolves listed the remote %d times, want once", sources, n)
	}
	if listed, shared := testutil.ToFloat64(src.RefCache.listed), testutil.ToFloat64(src.RefCache.shared); listed != 1 || shared != sources-1 {
		t.Errorf("listings listed=%v shared=%v, want 1 and %d", listed, shared, sources-1)
	}
}

func TestRefCacheNeverSharesAcrossCredentials(t *testing.T) {
	f := newFixture(t, "git", "right")
	proxy := newCountingProxy(t, f.srv.URL())
	repoURL := proxy.url + "/repo.git"
	src := &Source{
		RefCache: NewRefCache(time.Minute, 0, nil),
		Secrets: fakeSecrets(t, map[string]map[string]string{
			"good":      {"username": "git", "password": "right"},
			"good-copy": {"username": "git", "password": "right"},
			"bad":       {"username": "git", "password": "wrong"},
		}),
	}
	withSecret := func(name string) *events.FetchRequested {
		req := request(repoURL, &sourcev1.GitRepositoryRef{Branch: "master"})
		req.GitRepository.SecretRef = &meta.LocalObjectReference{Name: name}
		return req
	}

	if _, errs := resolveAll(src, []*events.FetchRequested{withSecret("good"), withSecret("good-copy")}); errs[0] != nil || errs[1] != nil {
		t.Fatalf("resolve with valid credentials: %v", errs)
	}
	// The same credentials share a listing whichever Secret holds them.
	afterGood := proxy.listings.Load()
	if afterGood != 1 {
		t.Errorf("listings with the same credentials in two Secrets = %d, want 1", afterGood)
	}

	// A listing obtained with valid credentials never answers others.
	_, err := src.Resolve(context.Background(), withSecret("bad"))
	var ferr *failure.Error
	if !errors.As(err, &ferr) || ferr.Reason != sourcev1.AuthenticationFailedReason {
		t.Fatalf("resolve with wrong credentials = %v, want an AuthenticationFailed error", err)
	}
	if proxy.listings.Load() == afterGood {
		t.Error("the wrong credentials were answered from the cache")
	}
	// Nor does one without credentials.
	if _, err := src.Resolve(context.Background(), request(repoURL, nil)); !errors.As(err, &ferr) || ferr.Reason != sourcev1.AuthenticationFailedReason {
		t.Fatalf("resolve without credentials = %v, want an AuthenticationFailed error", err)
	}
}

func TestRefCacheExpiry(t *testing.T) {
	f := newFixture(t, "", "")
	proxy := newCountingProxy(t, f.srv.URL())
	cache := NewRefCache(2*time.Second, 0, nil)
	now := time.Now()
	cache.now = func() time.Time { return now }
	src := &Source{RefCache: cache}
	req := request(proxy.url+"/repo.git", nil)

	steps := []struct {
		advance  time.Duration
		listings int64
	}{
		{0, 1},
		{time.Second, 1}, // within the TTL: shared
		{time.Second, 2}, // the TTL passed: listed again
		{1500 * time.Millisecond, 2},
	}
	for i, st := range steps {
		now = now.Add(st.advance)
		if _, err := src.Resolve(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		if got := proxy.listings.Load(); got != st.listings {
			t.Fatalf("step %d: %d listings, want %d", i, got, st.listings)
		}
	}
}

func TestRefCacheDisabledAndFailures(t *testing.T) {
	f := newFixture(t, "", "")
	proxy := newCountingProxy(t, f.srv.URL())
	for _, tc := range []struct {
		name  string
		cache *RefCache
	}{
		{"nil cache", nil},
		{"ttl zero", NewRefCache(0, 0, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := proxy.listings.Load()
			src := &Source{RefCache: tc.cache}
			for range 3 {
				if _, err := src.Resolve(context.Background(), request(proxy.url+"/repo.git", nil)); err != nil {
					t.Fatal(err)
				}
			}
			if got := proxy.listings.Load() - before; got != 3 {
				t.Errorf("3 resolves listed %d times, want 3", got)
			}
		})
	}
	t.Run("a failed listing is not kept", func(t *testing.T) {
		src := &Source{RefCache: NewRefCache(time.Minute, 0, nil)}
		before := proxy.listings.Load()
		for range 2 {
			if _, err := src.Resolve(context.Background(), request(proxy.url+"/missing.git", nil)); err == nil {
				t.Fatal("resolving a missing repository succeeded")
			}
		}
		if got := proxy.listings.Load() - before; got != 2 {
			t.Errorf("2 resolves of a failing remote listed %d times, want 2", got)
		}
	})
}

func TestRefCacheBounded(t *testing.T) {
	cache := NewRefCache(time.Minute, 2, nil)
	now := time.Now()
	cache.now = func() time.Time { return now }
	calls := 0
	list := func(context.Context) (*advertised, error) {
		calls++
		return &advertised{refs: []*plumbing.Reference{plumbing.NewHashReference("refs/heads/master", plumbing.ZeroHash)}}, nil
	}
	ctx := context.Background()
	for _, key := range []string{"a", "b", "c"} {
		now = now.Add(time.Millisecond)
		if _, err := cache.list(ctx, key, time.Time{}, list); err != nil {
			t.Fatal(err)
		}
	}
	if n := cache.Len(); n != 2 {
		t.Fatalf("cache holds %d listings, want at most 2", n)
	}
	// The oldest went; the newest are shared.
	for _, key := range []string{"b", "c"} {
		if _, err := cache.list(ctx, key, time.Time{}, list); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 3 {
		t.Errorf("listed %d times, want 3 (b and c shared)", calls)
	}
	if _, err := cache.list(ctx, "a", time.Time{}, list); err != nil || calls != 4 {
		t.Errorf("evicted listing: %d calls, %v; want listed again", calls, err)
	}
}

func TestRefCacheDropsExpiredListings(t *testing.T) {
	cache := NewRefCache(2*time.Second, 0, nil)
	now := time.Now()
	cache.now = func() time.Time { return now }
	list := func(context.Context) (*advertised, error) {
		return &advertised{refs: []*plumbing.Reference{plumbing.NewHashReference("refs/heads/master", plumbing.ZeroHash)}}, nil
	}
	ctx := context.Background()
	steps := []struct {
		advance time.Duration
		key     string
		want    int // listings held afterwards
	}{
		{0, "a", 1},
		{time.Second, "b", 2},             // a is still fresh
		{1500 * time.Millisecond, "c", 2}, // a expired and went; b is fresh
		{500 * time.Millisecond, "d", 3},  // within a TTL of the sweep: nothing swept
		{3 * time.Second, "e", 1},         // all of b, c and d expired
	}
	for i, st := range steps {
		now = now.Add(st.advance)
		if _, err := cache.list(ctx, st.key, time.Time{}, list); err != nil {
			t.Fatal(err)
		}
		if got := cache.Len(); got != st.want {
			t.Fatalf("step %d (%s): cache holds %d listings, want %d", i, st.key, got, st.want)
		}
	}
}

func TestRefCacheWaiterCancelled(t *testing.T) {
	cache := NewRefCache(time.Minute, 0, nil)
	release := make(chan struct{})
	started := make(chan struct{})
	slow := func(ctx context.Context) (*advertised, error) {
		close(started)
		<-release
		return nil, ctx.Err()
	}
	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	leader := make(chan error, 1)
	go func() {
		_, err := cache.list(leaderCtx, "k", time.Time{}, slow)
		leader <- err
	}()
	<-started
	follower := make(chan error, 1)
	go func() {
		_, err := cache.list(context.Background(), "k", time.Time{}, func(context.Context) (*advertised, error) {
			t.Error("the follower listed instead of waiting")
			return nil, nil
		})
		follower <- err
	}()
	// The first caller gives up; the listing goes on for the other.
	cancelLeader()
	if err := <-leader; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled caller: %v, want context.Canceled", err)
	}
	close(release)
	if err := <-follower; err != nil {
		t.Errorf("waiting caller: %v, want the listing's result", err)
	}
}

// TestRefCacheRequestedReconcileIsFresh checks that a reconcile the user
// requested (after a push, say), or a webhook's job (Fresh), never takes a
// listing from before the request, while other fetches share it.
func TestRefCacheRequestedReconcileIsFresh(t *testing.T) {
	root := t.TempDir()
	repo, err := gitserver.NewRepo(root, "app", t.TempDir(), "master")
	must(t, err)
	must(t, repo.Write(map[string]string{"a": "1"}))
	c1, err := repo.Commit("one")
	must(t, err)
	srv := &gitserver.Server{Root: root}
	must(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = srv.Stop() })
	proxy := newCountingProxy(t, srv.URL())

	cache := NewRefCache(time.Minute, 0, nil)
	now := time.Now()
	cache.now = func() time.Time { return now }
	src := &Source{RefCache: cache}
	resolve := func(token string, requestedAt time.Time, fresh ...bool) string {
		t.Helper()
		req := request(proxy.url+"/app.git", nil)
		req.Job.ReconcileToken, req.Job.RequestedAt = token, requestedAt
		req.Fresh = len(fresh) > 0 && fresh[0]
		res, err := src.Resolve(context.Background(), req)
		must(t, err)
		return res.Revision()
	}

	if rev := resolve("", now); rev != "master@sha1:"+c1 {
		t.Fatalf("first resolve: %s", rev)
	}
	must(t, repo.Write(map[string]string{"a": "2"}))
	c2, err := repo.Commit("two")
	must(t, err)

	steps := []struct {
		name        string
		token       string
		requestedAt time.Duration // after the first listing
		commit      string
		listings    int64
	}{
		{"interval reconcile within the TTL shares", "", time.Second, c1, 1},
		{"requested reconcile lists again", "token-1", time.Second, c2, 2},
		{"interval reconcile shares the newer listing", "", 2 * time.Second, c2, 2},
		{"requested before the newer listing shares it", "token-1", 500 * time.Millisecond, c2, 2},
	}
	start := now
	for _, st := range steps {
		now = start.Add(st.requestedAt)
		if rev := resolve(st.token, now); rev != "master@sha1:"+st.commit {
			t.Errorf("%s: revision %s, want commit %s", st.name, rev, st.commit)
		}
		if got := proxy.listings.Load(); got != st.listings {
			t.Errorf("%s: %d listings, want %d", st.name, got, st.listings)
		}
	}

	// A webhook's job carries no token but is fresh: it lists again.
	must(t, repo.Write(map[string]string{"a": "3"}))
	c3, err := repo.Commit("three")
	must(t, err)
	now = start.Add(3 * time.Second)
	if rev := resolve("", now); rev != "master@sha1:"+c2 {
		t.Errorf("interval reconcile after a push: revision %s, want the shared listing's %s", rev, c2)
	}
	if rev := resolve("", now, true); rev != "master@sha1:"+c3 {
		t.Errorf("webhook job: revision %s, want commit %s", rev, c3)
	}
	if got := proxy.listings.Load(); got != 3 {
		t.Errorf("webhook job: %d listings, want 3", got)
	}
}
