package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	helmregistry "helm.sh/helm/v3/pkg/registry"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	"github.com/headwater-gitops/headwater/testsupport/ratelimit"
	ociregistry "github.com/headwater-gitops/headwater/testsupport/registry"
)

// Limits of TestPoliteToUpstreams: the fetchers' own, and the pacing
// server's, a little more generous (the server sees the requests a moment
// after the fetchers took their slots).
const (
	politeRate, politeBurst = 8, 4
	serverRate, serverBurst = 10, 8
	politeSources           = 100
	politeCharts            = 40
)

// TestPoliteToUpstreams runs three fetcher replicas against a git server
// behind a host that answers 429 with Retry-After above its rate: with
// the fetchers' shared limit below the host's, 100 GitRepositories all
// become Ready and the host never has to refuse one request, over any
// window. Then hosts that refuse and send bad Retry-After values: a date in
// the past and a malformed one hold briefly and every source ends Ready;
// one years ahead is clamped to 10 minutes, during which no request reaches
// the host and the sources say when the next attempt is. With
// HEADWATER_E2E_MEASURE set, it also measures the CPU the watcher and the
// fetchers spend while 100 sources are held.
func TestPoliteToUpstreams(t *testing.T) {
	requireEnv(t)
	pe := startPrivateEnv(t, "polite", func(cfg *harness.Config) {
		cfg.FetcherReplicas = 3
		cfg.ExtraArgs = map[string][]string{harness.Fetcher: {
			// Every source makes its own requests.
			"-content-cache=false", "-ref-cache-ttl=0",
			fmt.Sprintf("-rate-limits=*=%d/%d", politeRate, politeBurst), "-rate-limit-max-wait=2s",
		}}
	})
	c, err := client.New(pe.RESTConfig, client.Options{Scheme: pe.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := pe.NewRepo("polite", branch)
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Write(map[string]string{"README.md": "polite"}); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Commit("polite"); err != nil {
		t.Fatal(err)
	}
	frontOf := func(t *testing.T, upstream string, o ratelimit.Options) *ratelimit.Server {
		s, err := ratelimit.Start(upstream, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	front := func(t *testing.T, o ratelimit.Options) *ratelimit.Server { return frontOf(t, pe.Git.URL(), o) }
	create := func(t *testing.T, prefix, url string, n int) []string {
		names := make([]string, n)
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range names {
			names[i] = fmt.Sprintf("%s-%03d", prefix, i)
			wg.Go(func() {
				errs <- c.Create(t.Context(), &sourcev1.GitRepository{
					ObjectMeta: metav1.ObjectMeta{Name: names[i], Namespace: "default"},
					Spec: sourcev1.GitRepositorySpec{URL: url, Interval: metav1.Duration{Duration: time.Hour},
						Timeout: &metav1.Duration{Duration: 60 * time.Second}, Reference: &sourcev1.GitRepositoryRef{Branch: branch}},
				})
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
	// states counts the sources by Ready status and reason.
	states := func(t *testing.T, names []string) (map[string]int, []sourcev1.GitRepository) {
		got := map[string]int{}
		var objs []sourcev1.GitRepository
		for _, name := range names {
			var obj sourcev1.GitRepository
			if err := c.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: name}, &obj); err != nil {
				t.Fatal(err)
			}
			state := "none"
			if ready := apimeta.FindStatusCondition(obj.Status.Conditions, "Ready"); ready != nil {
				state = string(ready.Status) + "/" + ready.Reason
			}
			got[state]++
			objs = append(objs, obj)
		}
		return got, objs
	}
	allReady := func(t *testing.T, names []string, within time.Duration) {
		deadline := time.Now().Add(within)
		for {
			got, _ := states(t, names)
			if got["True/Succeeded"] == len(names) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("sources by Ready after %s: %v, want all %d True", within, got, len(names))
			}
			time.Sleep(time.Second)
		}
	}

	t.Run("within the host's limit", func(t *testing.T) {
		host := front(t, ratelimit.Options{Rate: serverRate, Burst: serverBurst, RetryAfter: "5"})
		start := time.Now()
		allReady(t, create(t, "polite", host.URL()+"/polite.git", politeSources), 5*time.Minute)
		took := time.Since(start)
		served := host.Served()
		floor := time.Duration(float64(max(served-politeBurst, 0)) / politeRate * float64(time.Second))
		t.Logf("%d sources, 3 fetchers: %d requests served in %s (ready after %s); the limit's floor %s (%.2fx); most in any second %d",
			politeSources, served, host.Span().Round(time.Millisecond), took.Round(time.Millisecond), floor.Round(time.Millisecond),
			host.Span().Seconds()/max(floor.Seconds(), 0.001), host.MaxInWindow(time.Second))
		if n := host.Refused(); n != 0 {
			t.Errorf("the host refused %d requests: the fetchers outran its limit", n)
		}
		if most, limit := host.MaxInWindow(time.Second), serverBurst+serverRate; most > limit {
			t.Errorf("the host served %d requests within one second, over its %d", most, limit)
		}
	})

	t.Run("helm charts within the hosts' limits", func(t *testing.T) {
		// A chart repository and a registry, each behind a host of its
		// own pacing its clients as the git server's does.
		charts := &chartrepo.Server{Dir: t.TempDir()}
		if err := charts.Start("127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = charts.Stop() })
		if err := charts.Add(chartrepo.Chart{Name: "podinfo", Version: "6.0.0"}); err != nil {
			t.Fatal(err)
		}
		chartHost := frontOf(t, charts.URL(), ratelimit.Options{Rate: serverRate, Burst: serverBurst, RetryAfter: "5"})
		// The index names the charts by the host's URL, so that their
		// downloads pass it too.
		charts.SetIndex(bytes.ReplaceAll(charts.Index(), []byte(charts.URL()), []byte(chartHost.URL())))
		reg := ociregistry.New(t, ociregistry.Options{})
		push, err := helmregistry.NewClient(helmregistry.ClientOptPlainHTTP(), helmregistry.ClientOptWriter(io.Discard),
			helmregistry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "creds.json")))
		if err != nil {
			t.Fatal(err)
		}
		p, err := chartrepo.Package(t.TempDir(), chartrepo.Chart{Name: "podinfo", Version: "6.0.0"})
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := push.Push(data, reg.Host+"/charts/podinfo:6.0.0"); err != nil {
			t.Fatal(err)
		}
		regHost := frontOf(t, "http://"+reg.Host, ratelimit.Options{Rate: serverRate, Burst: serverBurst, RetryAfter: "5"})

		interval := metav1.Duration{Duration: time.Hour}
		objs := []client.Object{
			&sourcev1.HelmRepository{ObjectMeta: metav1.ObjectMeta{Name: "polite-charts", Namespace: "default"},
				Spec: sourcev1.HelmRepositorySpec{URL: chartHost.URL(), Interval: interval}},
			&sourcev1.HelmRepository{ObjectMeta: metav1.ObjectMeta{Name: "polite-oci", Namespace: "default"},
				Spec: sourcev1.HelmRepositorySpec{URL: "oci://" + strings.TrimPrefix(regHost.URL(), "http://") + "/charts",
					Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true, Interval: interval}},
		}
		var ready []client.Object // what must end Ready (an OCI HelmRepository has no status, as Flux)
		ready = append(ready, objs[0])
		for i := range politeCharts {
			// Half from each repository; an OCI chart's range lists the
			// registry's tags first.
			repo, version := "polite-charts", "6.0.0"
			if i%2 == 1 {
				repo, version = "polite-oci", "6.x"
			}
			chart := &sourcev1.HelmChart{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("polite-%03d", i), Namespace: "default"},
				Spec: sourcev1.HelmChartSpec{Chart: "podinfo", Version: version, Interval: interval,
					SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: repo}}}
			objs = append(objs, chart)
			ready = append(ready, chart)
		}
		var wg sync.WaitGroup
		errs := make(chan error, len(objs))
		for _, obj := range objs {
			wg.Go(func() { errs <- c.Create(t.Context(), obj) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(5 * time.Minute)
		for {
			got := map[string]int{}
			for _, obj := range ready {
				if err := c.Get(t.Context(), client.ObjectKeyFromObject(obj), obj); err != nil {
					t.Fatal(err)
				}
				state := "none"
				if r := apimeta.FindStatusCondition(obj.(interface{ GetConditions() []metav1.Condition }).GetConditions(), "Ready"); r != nil {
					state = string(r.Status) + "/" + r.Reason
				}
				got[state]++
			}
			if got["True/"+sourcev1.ChartPullSucceededReason]+got["True/Succeeded"] == len(ready) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("HelmRepositories and HelmCharts by Ready: %v, want all %d True", got, len(ready))
			}
			time.Sleep(time.Second)
		}
		for _, h := range []struct {
			name string
			host *ratelimit.Server
		}{{"chart repository", chartHost}, {"registry", regHost}} {
			t.Logf("%s: %d requests served in %s, most in any second %d, %d refused", h.name, h.host.Served(),
				h.host.Span().Round(time.Millisecond), h.host.MaxInWindow(time.Second), h.host.Refused())
			if h.host.Served() == 0 {
				t.Errorf("no request reached the %s's host: the test did not test it", h.name)
			}
			if n := h.host.Refused(); n != 0 {
				t.Errorf("the %s's host refused %d requests: the fetchers outran its limit", h.name, n)
			}
			if most, limit := h.host.MaxInWindow(time.Second), serverBurst+serverRate; most > limit {
				t.Errorf("the %s's host served %d requests within one second, over its %d", h.name, most, limit)
			}
		}
	})

	t.Run("bad Retry-After values", func(t *testing.T) {
		cases := []struct {
			name       string
			retryAfter func(now time.Time) string
		}{
			{"past", func(now time.Time) string { return now.Add(-time.Hour).Format(http.TimeFormat) }},
			{"malformed", func(time.Time) string { return "soon, please" }},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				// A host far stricter than the fetchers' limit: it refuses.
				host := front(t, ratelimit.Options{Rate: 1, Burst: 2, RetryAfterFunc: tc.retryAfter})
				names := create(t, "retry-"+tc.name, host.URL()+"/polite.git", 6)
				allReady(t, names, 3*time.Minute)
				if host.Refused() == 0 {
					t.Errorf("the host refused nothing: the test did not test %s Retry-After", tc.name)
				}
			})
		}
		t.Run("years ahead", func(t *testing.T) {
			host := front(t, ratelimit.Options{Rate: 0.001, Burst: 1,
				RetryAfterFunc: func(now time.Time) string { return now.AddDate(5, 0, 0).Format(http.TimeFormat) }})
			names := create(t, "retry-years", host.URL()+"/polite.git", 4)
			var objs []sourcev1.GitRepository
			deadline := time.Now().Add(3 * time.Minute)
			for {
				var got map[string]int
				got, objs = states(t, names)
				if got["False/RateLimited"] == len(names) || (got["False/RateLimited"] == len(names)-1 && got["True/Succeeded"] == 1) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("sources by Ready: %v, want them RateLimited (one may have gone first)", got)
				}
				time.Sleep(time.Second)
			}
			for _, obj := range objs {
				ready := conditionOf(t, &obj, "Ready")
				if ready.Reason != "RateLimited" {
					continue
				}
				if !strings.HasPrefix(ready.Message, "rate limited by "+strings.TrimPrefix(host.URL(), "http://")+", next attempt in ") ||
					!(strings.Contains(ready.Message, "in 10m") || strings.Contains(ready.Message, "in 9m")) {
					t.Errorf("%s: Ready message %q, want the next attempt within 10 minutes (clamped)", obj.Name, ready.Message)
				}
				if r := conditionOf(t, &obj, "Reconciling"); r.Status != metav1.ConditionTrue || r.Reason != "ProgressingWithRetry" {
					t.Errorf("%s: Reconciling %s/%s, want True/ProgressingWithRetry", obj.Name, r.Status, r.Reason)
				}
				if obj.Status.ObservedGeneration != obj.Generation {
					t.Errorf("%s: observedGeneration %d, want %d", obj.Name, obj.Status.ObservedGeneration, obj.Generation)
				}
			}
			seen := host.Served() + host.Refused()
			consistently(t, "no request reaches the held host", 5*time.Second, func() error {
				if now := host.Served() + host.Refused(); now != seen {
					return fmt.Errorf("the host got %d requests while held", now-seen)
				}
				return nil
			})
			for _, name := range names {
				if n := kubeEventCountIn(t, c, name, "RateLimited"); n > 1 {
					t.Errorf("%s: %d RateLimited Events, want one when the throttling started", name, n)
				}
			}
		})
	})

	t.Run("cost of a held host", func(t *testing.T) {
		// A measurement, not a check: how much CPU the watcher and the
		// fetchers spend while 100 sources wait for a host that holds
		// them (Retry-After 10 minutes), over 60 seconds.
		if os.Getenv("HEADWATER_E2E_MEASURE") == "" {
			t.Skip("a measurement: set HEADWATER_E2E_MEASURE=1 to run it")
		}
		host := front(t, ratelimit.Options{Rate: 0.001, Burst: 1, RetryAfter: "600"})
		names := create(t, "held", host.URL()+"/polite.git", politeSources)
		deadline := time.Now().Add(3 * time.Minute)
		for {
			got, _ := states(t, names)
			if got["False/RateLimited"]+got["True/Succeeded"] == len(names) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sources by Ready: %v, want them RateLimited", got)
			}
			time.Sleep(time.Second)
		}
		const window = 60 * time.Second
		before := map[string]time.Duration{}
		for _, s := range pe.Services() {
			before[s.Name] = cpuTime(t, s.Pid())
		}
		seen := host.Served() + host.Refused()
		time.Sleep(window)
		for _, s := range pe.Services() {
			if s.Name == harness.Watcher || strings.HasPrefix(s.Name, harness.Fetcher) {
				used := cpuTime(t, s.Pid()) - before[s.Name]
				t.Logf("%s: %v CPU over %v with %d sources held (%.3f%% of a core)", s.Name, used, window, len(names),
					100*used.Seconds()/window.Seconds())
			}
		}
		t.Logf("requests reaching the held host meanwhile: %d", host.Served()+host.Refused()-seen)
	})
}

// cpuTime is the user and system CPU time process pid has used so far,
// from /proc/<pid>/stat (Linux).
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Skipf("no process CPU times here: %v", err)
	}
	// The fields after the command, which is in parentheses: state is
	// the first, utime the 12th and stime the 13th.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 13 {
		t.Fatalf("/proc/%d/stat: %d fields", pid, len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	// USER_HZ is 100 on every Linux this runs on.
	return time.Duration(ticks) * 10 * time.Millisecond
}

// kubeEventCountIn counts the Events of reason about the GitRepository
// name in the default namespace, repeats included, through c.
func kubeEventCountIn(t *testing.T, c client.Client, name, reason string) int {
	t.Helper()
	var list corev1.EventList
	if err := c.List(t.Context(), &list, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == sourcev1.GitRepositoryKind && e.InvolvedObject.Name == name && e.Reason == reason {
			n += max(int(e.Count), 1)
		}
	}
	return n
}
