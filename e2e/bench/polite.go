package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	helmregistry "helm.sh/helm/v3/pkg/registry"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	"github.com/headwater-gitops/headwater/testsupport/ratelimit"
	"github.com/headwater-gitops/headwater/testsupport/registry"
)

// Counter names of scenario p's measurement (Measurement.Counters): what
// the host in front of the git server counted.
const (
	// CounterHostServed is the requests the host served.
	CounterHostServed = "host requests served"
	// CounterHost429s is the requests the host refused with 429.
	CounterHost429s = "host 429s"
	// CounterHostMaxPerSecond is the most requests the host served
	// within any one second.
	CounterHostMaxPerSecond = "host most requests in a second"
	// CounterHostListings and CounterHostPacks split the requests served
	// into reference listings (info/refs) and packs (git-upload-pack):
	// one of each per source when no fetch is made twice.
	CounterHostListings = "host reference listings served"
	CounterHostPacks    = "host packs served"
)

// PoliteLoad is scenario p (issue 22): many GitRepositories over several
// fetcher replicas against a git server behind a host that answers 429
// with Retry-After above its rate.
type PoliteLoad struct {
	// Sources GitRepositories spread round-robin over Repos repositories.
	Sources, Repos int
	// Replicas is the number of fetchers.
	Replicas int
	// Rate and Burst are the fetchers' shared limit for the host
	// (-rate-limits); HostRate and HostBurst the host's own, above which
	// it answers 429.
	Rate, Burst         float64
	HostRate, HostBurst float64
}

// Name is the scenario's row in the table.
func (l PoliteLoad) Name() string {
	return fmt.Sprintf("p. %d GitRepositories, %d fetchers, limit %g/s burst %g, behind a host answering 429 above %g/s burst %g (Headwater only)",
		l.Sources, l.Replicas, l.Rate, l.Burst, l.HostRate, l.HostBurst)
}

// Target is what the host must never see: a 429, more requests in a
// second than its rate and burst allow, or a source's listing or pack
// requested twice (a fetch refused halfway and made again).
func (l PoliteLoad) Target() Target {
	return Target{MaxCounters: map[string]int64{
		CounterHost429s:         0,
		CounterHostMaxPerSecond: int64(l.HostRate + l.HostBurst),
		CounterHostListings:     int64(l.Sources),
		CounterHostPacks:        int64(l.Sources),
		CounterFloorPercent:     120,
	}}
}

// Polite runs scenario p on Headwater: the GitRepositories are created at
// once and awaited Ready with an artifact, every fetch making its own
// requests (no content cache, no reference cache, no remote alignment). It notes the time to
// all Ready beside the limit's floor (two requests a source, less the
// burst, at the fetchers' rate) and what the host counted.
func Polite(ctx context.Context, o Options, load PoliteLoad) (m *Measurement, err error) {
	o.Harness.FetcherReplicas = load.Replicas
	o.Harness.ExtraArgs = cloneArgs(o.Harness.ExtraArgs)
	o.Harness.ExtraArgs[harness.Fetcher] = append(o.Harness.ExtraArgs[harness.Fetcher],
		"-content-cache=false", "-ref-cache-ttl=0", fmt.Sprintf("-rate-limits=*=%g/%g", load.Rate, load.Burst))
	// Each source is checked once: by default the watcher checks the
	// sources of a remote together at a phase of their interval, whose
	// first slot may fall within the run (as early as a second after a
	// source's first job), and with the caches off every source would
	// list (and, with its first job still queued, fetch) again.
	o.Harness.ExtraArgs[harness.Watcher] = append(o.Harness.ExtraArgs[harness.Watcher], "-align-remotes=false")
	env, stop, err := startEnv(ctx, o, "polite", Headwater)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	host, err := ratelimit.Start(env.Git.URL(), ratelimit.Options{Rate: load.HostRate, Burst: int(load.HostBurst), RetryAfter: "5"})
	if err != nil {
		return nil, fmt.Errorf("scenario p: %w", err)
	}
	defer func() { _ = host.Close() }()
	urls, err := linkSmallRepos(env, load.Repos, o.Progress)
	if err != nil {
		return nil, err
	}
	for i, u := range urls {
		urls[i] = strings.Replace(u, env.Git.URL(), host.URL(), 1)
	}
	c, err := benchClient(ctx, env)
	if err != nil {
		return nil, err
	}
	names := make([]string, load.Sources)
	for i := range names {
		names[i] = fmt.Sprintf("polite-%05d", i)
	}
	sctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()
	o.progress("p: creating %d GitRepositories behind a host answering 429 above %g/s", load.Sources, load.HostRate)
	m, err = measure(sctx, o, "p", env, c, readyWithArtifact[*sourcev1.GitRepository], len(names), func(ctx context.Context) error {
		return forEach(ctx, names, func(ctx context.Context, i int, name string) error {
			return c.Create(ctx, gitRepository(name, urls[i%len(urls)], smallInterval))
		})
	})
	if m == nil {
		return nil, wrapScenario("p", err)
	}
	if m.Counters == nil {
		m.Counters = map[string]int64{}
	}
	// A source needs two requests (the reference listing and the pack);
	// the host may have served more (sources reconciled again).
	served, needed := host.Served(), 2*load.Sources
	floor := time.Duration(max(float64(needed)-load.Burst, 0) / load.Rate * float64(time.Second))
	m.Counters[CounterHostServed] = int64(served)
	m.Counters[CounterHost429s] = int64(host.Refused())
	m.Counters[CounterHostMaxPerSecond] = int64(host.MaxInWindow(time.Second))
	m.Counters[CounterHostListings] = int64(host.ServedContaining("/info/refs"))
	m.Counters[CounterHostPacks] = int64(host.ServedContaining("/git-upload-pack"))
	m.Counters[CounterFloorPercent] = int64(math.Ceil(100 * m.Wall.Seconds() / max(floor.Seconds(), 0.001)))
	m.Notes = append(m.Notes, fmt.Sprintf("all Ready after %s; the limit's floor (%d requests needed, less the burst of %g, at %g/s) %s: %.2fx; "+
		"the host served %d requests over %s",
		m.Wall.Round(time.Millisecond), needed, load.Burst, load.Rate, floor.Round(time.Millisecond),
		m.Wall.Seconds()/max(floor.Seconds(), 0.001), served, host.Span().Round(time.Millisecond)))
	return m, wrapScenario("p", err)
}

// cloneArgs copies service flags, so that a scenario adds its own without
// changing the other scenarios'.
func cloneArgs(args map[string][]string) map[string][]string {
	out := make(map[string][]string, len(args))
	for k, v := range args {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// Counter names of scenario p' (PoliteHelm): the ratio of the time to all
// Ready to the limit's floor, and what each host counted.
const (
	// CounterFloorPercent is the time to all Ready in percent of the
	// limit's floor (100: as fast as the limit allows).
	CounterFloorPercent = "time over the limit's floor, %"
	// CounterChartHostServed and CounterRegistryHostServed are the
	// requests the chart repository's and the registry's hosts served.
	CounterChartHostServed    = "chart repository host requests served"
	CounterRegistryHostServed = "registry host requests served"
)

// PoliteHelm runs scenario p' on Headwater: load.Sources HelmCharts, half
// from a chart repository and half from a registry (an OCI HelmRepository,
// the version a range, so each fetch lists the registry's tags), each
// server behind a host of its own that answers 429 with Retry-After above
// its rate. The HelmRepositories and HelmCharts are created at once and the
// HelmCharts awaited Ready with an artifact, every fetch making its own
// requests. The limit's floor is the slower host's: the requests it served,
// less the burst, at the fetchers' rate; the notes give each host's
// requests per chart, so a request made twice shows.
func PoliteHelm(ctx context.Context, o Options, load PoliteLoad, tb testing.TB) (m *Measurement, err error) {
	o.Harness.FetcherReplicas = load.Replicas
	o.Harness.ExtraArgs = cloneArgs(o.Harness.ExtraArgs)
	o.Harness.ExtraArgs[harness.Fetcher] = append(o.Harness.ExtraArgs[harness.Fetcher],
		"-content-cache=false", fmt.Sprintf("-rate-limits=*=%g/%g", load.Rate, load.Burst))
	o.Harness.ExtraArgs[harness.Watcher] = append(o.Harness.ExtraArgs[harness.Watcher], "-align-remotes=false")
	env, stop, err := startEnv(ctx, o, "polite-helm", Headwater)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	fail := func(err error) (*Measurement, error) { return nil, fmt.Errorf("scenario p': %w", err) }
	hostOpts := ratelimit.Options{Rate: load.HostRate, Burst: int(load.HostBurst), RetryAfter: "5"}

	charts := &chartrepo.Server{Dir: tb.TempDir()}
	if err := charts.Start("127.0.0.1:0"); err != nil {
		return fail(err)
	}
	defer func() { _ = charts.Stop() }()
	chart := chartrepo.Chart{Name: "podinfo", Version: "6.0.0"}
	if err := charts.Add(chart); err != nil {
		return fail(err)
	}
	chartHost, err := ratelimit.Start(charts.URL(), hostOpts)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = chartHost.Close() }()
	// The index names the charts by the host's URL, so their downloads
	// pass the host too.
	charts.SetIndex(bytes.ReplaceAll(charts.Index(), []byte(charts.URL()), []byte(chartHost.URL())))

	reg := registry.New(tb, registry.Options{})
	push, err := helmregistry.NewClient(helmregistry.ClientOptPlainHTTP(), helmregistry.ClientOptWriter(io.Discard),
		helmregistry.ClientOptCredentialsFile(filepath.Join(tb.TempDir(), "creds.json")))
	if err != nil {
		return fail(err)
	}
	pkg, err := chartrepo.Package(tb.TempDir(), chart)
	if err != nil {
		return fail(err)
	}
	data, err := os.ReadFile(pkg)
	if err != nil {
		return fail(err)
	}
	if _, err := push.Push(data, reg.Host+"/charts/podinfo:6.0.0"); err != nil {
		return fail(err)
	}
	regHost, err := ratelimit.Start("http://"+reg.Host, hostOpts)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = regHost.Close() }()

	c, err := benchClient(ctx, env)
	if err != nil {
		return nil, err
	}
	interval := metav1.Duration{Duration: smallInterval}
	repos := []client.Object{
		&sourcev1.HelmRepository{ObjectMeta: metav1.ObjectMeta{Name: "polite-charts", Namespace: namespace},
			Spec: sourcev1.HelmRepositorySpec{URL: chartHost.URL(), Interval: interval}},
		&sourcev1.HelmRepository{ObjectMeta: metav1.ObjectMeta{Name: "polite-oci", Namespace: namespace},
			Spec: sourcev1.HelmRepositorySpec{URL: "oci://" + strings.TrimPrefix(regHost.URL(), "http://") + "/charts",
				Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true, Interval: interval}},
	}
	names := make([]string, load.Sources)
	for i := range names {
		names[i] = fmt.Sprintf("polite-%05d", i)
	}
	sctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()
	o.progress("p': creating %d HelmCharts from a chart repository and a registry, each behind a host answering 429 above %g/s",
		load.Sources, load.HostRate)
	helmCharts := func() client.ObjectList { return &sourcev1.HelmChartList{} }
	t := newTracker(c, namespace, len(names), helmCharts, readyWithArtifact[*sourcev1.HelmChart])
	m, err = measureKind(sctx, o, "p'", env, t, len(names), func(ctx context.Context) error {
		for _, r := range repos {
			if err := c.Create(ctx, r); err != nil {
				return err
			}
		}
		return forEach(ctx, names, func(ctx context.Context, i int, name string) error {
			// Half from each repository.
			repo, version := "polite-charts", "6.0.0"
			if i%2 == 1 {
				repo, version = "polite-oci", "6.x"
			}
			return c.Create(ctx, &sourcev1.HelmChart{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec: sourcev1.HelmChartSpec{Chart: "podinfo", Version: version, Interval: interval,
					SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: repo}}})
		})
	})
	if m == nil {
		return nil, wrapScenario("p'", err)
	}
	if m.Counters == nil {
		m.Counters = map[string]int64{}
	}
	fromRepo, fromRegistry := (load.Sources+1)/2, load.Sources/2
	floorOf := func(served int) time.Duration {
		return time.Duration(max(float64(served)-load.Burst, 0) / load.Rate * float64(time.Second))
	}
	floor := max(floorOf(chartHost.Served()), floorOf(regHost.Served()))
	m.Counters[CounterHost429s] = int64(chartHost.Refused() + regHost.Refused())
	m.Counters[CounterHostMaxPerSecond] = int64(max(chartHost.MaxInWindow(time.Second), regHost.MaxInWindow(time.Second)))
	m.Counters[CounterChartHostServed] = int64(chartHost.Served())
	m.Counters[CounterRegistryHostServed] = int64(regHost.Served())
	m.Counters[CounterFloorPercent] = int64(math.Ceil(100 * m.Wall.Seconds() / max(floor.Seconds(), 0.001)))
	m.Notes = append(m.Notes, fmt.Sprintf("all Ready after %s; the limit's floor (the slower host's requests, less the burst of %g, at %g/s) %s: %.2fx; "+
		"the chart repository's host served %d requests (%.2f a chart of its %d, the index included) over %s, the registry's %d (%.2f a chart of its %d) over %s",
		m.Wall.Round(time.Millisecond), load.Burst, load.Rate, floor.Round(time.Millisecond), m.Wall.Seconds()/max(floor.Seconds(), 0.001),
		chartHost.Served(), float64(chartHost.Served())/float64(max(fromRepo, 1)), fromRepo, chartHost.Span().Round(time.Millisecond),
		regHost.Served(), float64(regHost.Served())/float64(max(fromRegistry, 1)), fromRegistry, regHost.Span().Round(time.Millisecond)))
	m.Notes = append(m.Notes, fmt.Sprintf("the registry's host served %d tag lists, %d manifests, %d blobs, %d other requests",
		regHost.ServedContaining("/tags/list"), regHost.ServedContaining("/manifests/"), regHost.ServedContaining("/blobs/"),
		regHost.Served()-regHost.ServedContaining("/tags/list")-regHost.ServedContaining("/manifests/")-regHost.ServedContaining("/blobs/")))
	return m, wrapScenario("p'", err)
}

// HelmTarget is what scenario p' must meet: the hosts never answer 429
// nor see more requests in a second than their rate and burst allow, and
// every chart is Ready within 1.2x of the limit's floor.
func (l PoliteLoad) HelmTarget() Target {
	return Target{MaxCounters: map[string]int64{
		CounterHost429s:         0,
		CounterHostMaxPerSecond: int64(l.HostRate + l.HostBurst),
		CounterFloorPercent:     120,
	}}
}

// HelmName is the row of scenario p' in the table.
func (l PoliteLoad) HelmName() string {
	return fmt.Sprintf("p'. %d HelmCharts (half a chart repository's, half a registry's), %d fetchers, limit %g/s burst %g per host, each behind a host answering 429 above %g/s burst %g (Headwater only)",
		l.Sources, l.Replicas, l.Rate, l.Burst, l.HostRate, l.HostBurst)
}
