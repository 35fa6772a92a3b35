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

// Sizes of scenario d: what Flux's idle cost was measured with.
const (
	steadySources  = 200
	steadyRepos    = 10
	steadyInterval = time.Minute
	steadyWindow   = 3 * time.Minute
)

// Counter names of scenario d's measurement (Measurement.Counters).
const (
	// CounterGitListings is the git server's reference listings.
	CounterGitListings = "git listings"
	// CounterGitFetches is the git server's clones and pulls.
	CounterGitFetches = "git fetches"
	// CounterSourceWrites is the writes to the sources (status or any other
	// part), seen as watch events of a new resourceVersion.
	CounterSourceWrites = "source writes"
)

// SteadyState runs scenario d on sys: 200 GitRepositories at a 1m interval
// over 10 repositories are created and awaited Ready; then, with nothing
// changing upstream, it measures 3 minutes: the CPU the system spends, the
// git requests it makes (listings and fetches) and its writes to the
// sources.
func SteadyState(ctx context.Context, o Options, sys System) (m *Measurement, err error) {
	env, stop, err := startEnv(ctx, o, "steady", sys)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	urls, err := linkSmallRepos(env, steadyRepos, o.Progress)
	if err != nil {
		return nil, err
	}
	c, err := benchClient(ctx, env)
	if err != nil {
		return nil, err
	}
	names := make([]string, steadySources)
	for i := range names {
		names[i] = fmt.Sprintf("steady-%03d", i)
	}
	sctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()
	o.progress("d (%s): creating %d GitRepositories at a %s interval", sys, steadySources, steadyInterval)
	if _, err := measure(sctx, o, "d", env, c, readyWithArtifact[*sourcev1.GitRepository], len(names), func(ctx context.Context) error {
		return forEach(ctx, names, func(ctx context.Context, i int, name string) error {
			return c.Create(ctx, gitRepository(name, urls[i%len(urls)], steadyInterval))
		})
	}); err != nil {
		return nil, wrapScenario("d", err)
	}

	list := &sourcev1.GitRepositoryList{}
	if err := c.List(sctx, list, client.InNamespace(namespace)); err != nil {
		return nil, wrapScenario("d", err)
	}
	w, err := c.Watch(sctx, &sourcev1.GitRepositoryList{}, client.InNamespace(namespace),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		return nil, wrapScenario("d", err)
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
		return nil, wrapScenario("d", err)
	}
	o.progress("d (%s): all Ready; measuring %s of steady state", sys, steadyWindow)
	if !sleep(sctx, steadyWindow) {
		return nil, wrapScenario("d", sctx.Err())
	}
	m, err = meter.stop(sctx, time.Now())
	if err != nil {
		return m, wrapScenario("d", err)
	}
	listings, fetches := env.Git.Counts()
	m.Counters = map[string]int64{
		CounterGitListings:  listings - listings0,
		CounterGitFetches:   fetches - fetches0,
		CounterSourceWrites: writes.Load(),
	}
	return m, nil
}
