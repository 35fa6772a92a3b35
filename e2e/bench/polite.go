package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/testsupport/ratelimit"
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

// Target is what the host must never see: a 429, or more requests in a
// second than its rate and burst allow.
func (l PoliteLoad) Target() Target {
	return Target{MaxCounters: map[string]int64{CounterHost429s: 0, CounterHostMaxPerSecond: int64(l.HostRate + l.HostBurst)}}
}

// Polite runs scenario p on Headwater: the GitRepositories are created at
// once and awaited Ready with an artifact, every fetch making its own
// requests (no content cache, no reference cache). It notes the time to
// all Ready beside the limit's floor (two requests a source, less the
// burst, at the fetchers' rate) and what the host counted.
func Polite(ctx context.Context, o Options, load PoliteLoad) (m *Measurement, err error) {
	o.Harness.FetcherReplicas = load.Replicas
	o.Harness.ExtraArgs = cloneArgs(o.Harness.ExtraArgs)
	o.Harness.ExtraArgs[harness.Fetcher] = append(o.Harness.ExtraArgs[harness.Fetcher],
		"-content-cache=false", "-ref-cache-ttl=0", fmt.Sprintf("-rate-limits=*=%g/%g", load.Rate, load.Burst))
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
