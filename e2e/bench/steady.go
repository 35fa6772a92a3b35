package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SteadyLoad is a steady-state scenario: Sources GitRepositories at
// Interval, spread round-robin over Repos repositories, are created and
// awaited Ready; then, with nothing changing upstream, Window is measured.
type SteadyLoad struct {
	// Name is the scenario's name, for progress and errors.
	Name string
	// Sources and Repos are the numbers of GitRepositories and of the
	// repositories they are spread over.
	Sources, Repos int
	// Interval is every source's spec.interval.
	Interval time.Duration
	// Window is how long the steady state is measured.
	Window time.Duration
}

// Counter names of the measurements (Measurement.Counters).
const (
	// CounterGitListings is the git server's reference listings.
	CounterGitListings = "git listings"
	// CounterGitFetches is the git server's clones and pulls.
	CounterGitFetches = "git fetches"
	// CounterGitRequests is CounterGitListings plus CounterGitFetches:
	// every request the system made of the git server.
	CounterGitRequests = "git requests"
	// CounterSourceWrites is the writes to the sources (status or any other
	// part), seen as watch events of a new resourceVersion.
	CounterSourceWrites = "source writes"
	// CounterAPIRequests is the requests the system made to the API server
	// (Measurement.SystemAPIRequests), counted in its audit log.
	CounterAPIRequests = "API requests"
)

// SteadyState runs a steady-state scenario (d, d15) on sys: load's
// GitRepositories are created and awaited Ready; then, with nothing
// changing upstream, it measures load.Window: the CPU and memory the system
// spends, the git requests it makes (listings and fetches), its writes to
// the sources and its requests to the API server.
func SteadyState(ctx context.Context, o Options, sys System, load SteadyLoad) (m *Measurement, err error) {
	// Every request to the API server is logged, so that the system's can
	// be told from the benchmark's by user agent.
	o.Harness.AuditLog = true
	env, stop, err := startEnv(ctx, o, "steady-"+load.Name, sys)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	urls, err := linkSmallRepos(env, load.Repos, o.Progress)
	if err != nil {
		return nil, err
	}
	c, err := benchClient(ctx, env)
	if err != nil {
		return nil, err
	}
	names := make([]string, load.Sources)
	for i := range names {
		names[i] = fmt.Sprintf("steady-%04d", i)
	}
	sctx, cancel := context.WithTimeout(ctx, scenarioTimeout+load.Window)
	defer cancel()
	o.progress("%s (%s): creating %d GitRepositories over %d repositories at a %s interval", load.Name, sys, load.Sources, load.Repos, load.Interval)
	if _, err := measure(sctx, o, load.Name, env, c, readyWithArtifact[*sourcev1.GitRepository], len(names), func(ctx context.Context) error {
		return forEach(ctx, names, func(ctx context.Context, i int, name string) error {
			return c.Create(ctx, gitRepository(name, urls[i%len(urls)], load.Interval))
		})
	}); err != nil {
		return nil, wrapScenario(load.Name, err)
	}

	list := &sourcev1.GitRepositoryList{}
	if err := c.List(sctx, list, client.InNamespace(namespace)); err != nil {
		return nil, wrapScenario(load.Name, err)
	}
	w, err := c.Watch(sctx, &sourcev1.GitRepositoryList{}, client.InNamespace(namespace),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		return nil, wrapScenario(load.Name, err)
	}
	defer w.Stop()
	var writes atomic.Int64
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				writes.Add(1)
			}
		}
	}()
	listings0, fetches0 := env.Git.Counts()
	meter, err := startMeter(sctx, env)
	if err != nil {
		return nil, wrapScenario(load.Name, err)
	}
	o.progress("%s (%s): all Ready; measuring %s of steady state", load.Name, sys, load.Window)
	if !sleep(sctx, load.Window) {
		return nil, wrapScenario(load.Name, sctx.Err())
	}
	m, err = meter.stop(sctx, time.Now())
	if err != nil {
		return m, wrapScenario(load.Name, err)
	}
	listings, fetches := env.Git.Counts()
	m.Counters = map[string]int64{
		CounterGitListings:  listings - listings0,
		CounterGitFetches:   fetches - fetches0,
		CounterGitRequests:  listings - listings0 + fetches - fetches0,
		CounterSourceWrites: writes.Load(),
	}
	if n, ok := m.SystemAPIRequests(); ok {
		m.Counters[CounterAPIRequests] = n
	}
	return m, nil
}
