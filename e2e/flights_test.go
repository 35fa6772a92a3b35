package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
)

// flightSources is how many GitRepositories of one repository the
// combining test creates at once.
const flightSources = 60

// TestIdenticalFetchesCombineAcrossFetchers runs three fetcher replicas
// and creates many GitRepositories of one repository at once: the
// fetchers combine their fetches of the one content (see docs/design.md,
// "Combining fetches across replicas"), so the git server serves one
// clone in all, and every source becomes Ready with the same artifact.
// Then a leader whose clone fails: the fetches that followed it, in every
// fetcher, fetch themselves rather than wait, and all become Ready.
func TestIdenticalFetchesCombineAcrossFetchers(t *testing.T) {
	requireEnv(t)
	pe := startPrivateEnv(t, "flights", func(cfg *harness.Config) {
		cfg.FetcherReplicas = 3
	})
	c, err := client.New(pe.RESTConfig, client.Options{Scheme: pe.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	fetchers := pe.Replicas(harness.Fetcher)
	if len(fetchers) != 3 {
		t.Fatalf("%d fetchers, want 3", len(fetchers))
	}

	repo, err := pe.NewRepo("flights", branch)
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Write(map[string]string{"README.md": "combined", "deploy/app.yaml": "kind: ConfigMap\n"}); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Commit("one content"); err != nil {
		t.Fatal(err)
	}

	create := func(prefix, url string) []string {
		t.Helper()
		names := make([]string, flightSources)
		var wg sync.WaitGroup
		errs := make(chan error, flightSources)
		for i := range names {
			names[i] = fmt.Sprintf("%s-%02d", prefix, i)
			wg.Go(func() {
				obj := &sourcev1.GitRepository{
					ObjectMeta: metav1.ObjectMeta{Name: names[i], Namespace: "default"},
					Spec: sourcev1.GitRepositorySpec{URL: url, Interval: metav1.Duration{Duration: time.Hour},
						Timeout: &metav1.Duration{Duration: 45 * time.Second}, Reference: &sourcev1.GitRepositoryRef{Branch: branch}},
				}
				errs <- c.Create(t.Context(), obj)
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		return names
	}
	// allReady waits until every source is Ready with an artifact, and
	// returns the digest they share.
	allReady := func(names []string) string {
		t.Helper()
		var digest string
		eventually(t, "every source Ready with one artifact", func() error {
			digests := map[string]int{}
			for _, name := range names {
				var obj sourcev1.GitRepository
				if err := c.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: name}, &obj); err != nil {
					return err
				}
				if obj.Status.Artifact == nil || conditionOf(t, &obj, "Ready").Status != metav1.ConditionTrue {
					return fmt.Errorf("%s is not Ready with an artifact yet", name)
				}
				digests[obj.Status.Artifact.Digest]++
			}
			if len(digests) != 1 {
				return fmt.Errorf("digests %v, want one", digests)
			}
			for d := range digests {
				digest = d
			}
			return nil
		})
		return digest
	}
	combined := func(outcome string) float64 {
		t.Helper()
		var sum float64
		for _, f := range fetchers {
			n, err := metricSum(f.TelemetryAddr, "headwater_fetch_combined_total", `outcome="`+outcome+`"`)
			if err != nil {
				t.Fatal(err)
			}
			sum += n
		}
		return sum
	}

	t.Run("one clone", func(t *testing.T) {
		_, fetches0 := pe.Git.Counts()
		allReady(create("flights", pe.Git.RepoURL("flights")))
		if _, fetches := pe.Git.Counts(); fetches-fetches0 != 1 {
			t.Errorf("the git server served %d clones for %d sources of one content in 3 fetchers, want 1", fetches-fetches0, flightSources)
		}
		if n := combined("led"); n != 1 {
			t.Errorf("%v fetches led, want 1", n)
		}
	})

	t.Run("the leader fails", func(t *testing.T) {
		// The same repository behind a proxy that fails every clone
		// until a fetch followed the leader that failed; the first, the
		// leader's, fails slowly, once the other fetchers listed the
		// remote too: they are following it when it fails.
		target, err := url.Parse(pe.Git.URL())
		if err != nil {
			t.Fatal(err)
		}
		proxy := httputil.NewSingleHostReverseProxy(target)
		var clones, listings atomic.Int64
		var failing atomic.Bool
		failing.Store(true)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/info/refs") {
				listings.Add(1)
			}
			if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack") && failing.Load() {
				if clones.Add(1) == 1 {
					deadline := time.Now().Add(10 * time.Second)
					for listings.Load() < 4 && time.Now().Before(deadline) {
						time.Sleep(20 * time.Millisecond)
					}
					time.Sleep(500 * time.Millisecond)
				}
				http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
				return
			}
			proxy.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		failed := combined("leader-failed")
		names := create("failing", srv.URL+"/flights.git")
		eventually(t, "a fetch following the failed leader fetched itself", func() error {
			if n := combined("leader-failed") - failed; n < 1 {
				return fmt.Errorf("%v fetches followed a leader that failed", n)
			}
			return nil
		})
		failing.Store(false)
		allReady(names)
	})
}
