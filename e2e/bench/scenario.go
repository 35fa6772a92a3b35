package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
)

// Scenario sizes, as in the Flux measurements they compare with.
const (
	smallInterval   = 10 * time.Minute
	bigTreeTimeout  = 10 * time.Minute
	scenarioTimeout = 20 * time.Minute
	applyWorkers    = 16
	namespace       = "default"
	branch          = "master"
	progressEvery   = 5 * time.Second
	envStartTimeout = 3 * time.Minute
	settleTimeout   = 30 * time.Second
	bigTreeRepoName = "big-tree"
)

// Options configure the scenarios.
type Options struct {
	// Harness is the Env configuration; its Dir is the parent of each
	// scenario's fresh state directory (the system temporary directory
	// when empty).
	Harness harness.Config
	// FluxBin is Flux's source-controller binary; when empty, scenarios
	// run Headwater only.
	FluxBin string
	// Progress, when set, is told what is happening.
	Progress func(msg string)
}

func (o Options) progress(format string, args ...any) {
	if o.Progress != nil {
		o.Progress(fmt.Sprintf(format, args...))
	}
}

// GitLoad is a scenario of many GitRepositories over small repositories.
type GitLoad struct {
	// Name is the scenario's letter, for progress and errors.
	Name string
	// Repos is the number of distinct repositories, Sources the number of
	// GitRepositories spread over them round-robin.
	Repos, Sources int
	// Request, when set, follows with a reconcile request to every source
	// (`flux reconcile`: the unchanged path) measured on its own.
	Request bool
	// Shards, when above 0, runs Headwater with that many watcher shards
	// instead of its one watcher, the sources labelled round-robin, one
	// shard per label (shardWatchers, shardLabels); the fetcher, packager
	// and artifact-server stay shared. Flux runs as without it (its
	// sources carry the labels, which it ignores).
	Shards int
}

// ManyGit runs a GitLoad on sys: the GitRepositories are created at once
// and awaited Ready with an artifact; then, with load.Request, every one
// gets a reconcile request and the requests are awaited handled (the
// remote is listed, nothing is cloned).
func ManyGit(ctx context.Context, o Options, sys System, load GitLoad) (created, requested *Measurement, err error) {
	var shards []Shard
	if load.Shards > 0 && sys == Headwater {
		shardWatchers(&o.Harness, load.Shards)
		shards = shardTable(load.Sources, load.Shards)
	}
	env, stop, err := startEnv(ctx, o, "many-git-"+load.Name, sys)
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()

	urls, err := linkSmallRepos(env, load.Repos, o.Progress)
	if err != nil {
		return nil, nil, err
	}
	c, err := benchClient(ctx, env)
	if err != nil {
		return nil, nil, err
	}
	names := make([]string, load.Sources)
	for i := range names {
		names[i] = fmt.Sprintf("src-%05d", i)
	}

	sctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()
	o.progress("%s (%s): creating %d GitRepositories over %d repositories", load.Name, sys, load.Sources, load.Repos)
	created, err = measure(sctx, o, load.Name, env, c, readyWithArtifact[*sourcev1.GitRepository], len(names), func(ctx context.Context) error {
		return forEach(ctx, names, func(ctx context.Context, i int, name string) error {
			src := gitRepository(name, urls[i%len(urls)], smallInterval)
			src.Labels = shardLabels(i, load.Shards)
			return c.Create(ctx, src)
		})
	})
	if created != nil {
		created.Shards = shards
	}
	if err != nil || !load.Request {
		return created, nil, wrapScenario(load.Name, err)
	}
	cancel()

	dctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()
	token := time.Now().UTC().Format(time.RFC3339Nano)
	patch := client.RawPatch(types.MergePatchType,
		fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, meta.ReconcileRequestAnnotation, token))
	o.progress("%s' (%s): requesting a reconcile of all %d", load.Name, sys, load.Sources)
	requested, err = measure(dctx, o, load.Name+"'", env, c, handled(token), len(names), func(ctx context.Context) error {
		return forEach(ctx, names, func(ctx context.Context, _ int, name string) error {
			return c.Patch(ctx, &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}, patch)
		})
	})
	if requested != nil {
		requested.Shards = shards
	}
	return created, requested, wrapScenario(load.Name+"'", err)
}

// gitRepository is a GitRepository of url's master branch.
func gitRepository(name, url string, interval time.Duration) *sourcev1.GitRepository {
	return &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: sourcev1.GitRepositorySpec{
			URL:       url,
			Interval:  metav1.Duration{Duration: interval},
			Reference: &sourcev1.GitRepositoryRef{Branch: branch},
		},
	}
}

// wrapScenario names the scenario in err, if any.
func wrapScenario(name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("scenario %s: %w", name, err)
}

// LargeTree runs scenario c on sys: one GitRepository of a repository
// whose tree is 256 MiB, awaited Ready with an artifact.
func LargeTree(ctx context.Context, o Options, sys System) (m *Measurement, err error) {
	bare, err := bigTreeRepo(o.Progress)
	if err != nil {
		return nil, err
	}
	env, stop, err := startEnv(ctx, o, "large-tree", sys)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	if err := os.Symlink(bare, filepath.Join(env.GitRoot, bigTreeRepoName+".git")); err != nil {
		return nil, fmt.Errorf("serve the big tree: %w", err)
	}
	c, err := benchClient(ctx, env)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()
	obj := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: bigTreeRepoName, Namespace: namespace},
		Spec: sourcev1.GitRepositorySpec{
			URL:       env.Git.RepoURL(bigTreeRepoName),
			Interval:  metav1.Duration{Duration: smallInterval},
			Timeout:   &metav1.Duration{Duration: bigTreeTimeout},
			Reference: &sourcev1.GitRepositoryRef{Branch: "master"},
		},
	}
	o.progress("c (%s): creating one GitRepository of a %d MiB tree", sys, bigTreeSize>>20)
	m, err = measure(sctx, o, "c", env, c, readyWithArtifact[*sourcev1.GitRepository], 1, func(ctx context.Context) error {
		return c.Create(ctx, obj)
	})
	if err != nil {
		return m, fmt.Errorf("scenario c: %w", err)
	}
	if err := c.Get(sctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return m, fmt.Errorf("scenario c: %w", err)
	}
	if a := obj.Status.Artifact; a != nil && a.Size != nil {
		m.ArtifactBytes = *a.Size
	}
	m.ContentBytes = bigTreeSize
	return m, nil
}

// measure starts measuring GitRepositories, applies, and waits until want
// of them match.
func measure(ctx context.Context, o Options, scenario string, env *harness.Env, c client.WithWatch,
	match func(*sourcev1.GitRepository) bool, want int, apply func(context.Context) error) (*Measurement, error) {
	gitRepositories := func() client.ObjectList { return &sourcev1.GitRepositoryList{} }
	return measureKind(ctx, o, scenario, env, newTracker(c, namespace, want, gitRepositories, match), want, apply)
}

// measureKind starts measuring, applies, and waits until t has seen want
// objects match.
func measureKind[T fluxSource](ctx context.Context, o Options, scenario string, env *harness.Env, t *tracker[T], want int,
	apply func(context.Context) error) (*Measurement, error) {
	m, err := startMeter(ctx, env)
	if err != nil {
		return nil, err
	}
	listings0, fetches0 := env.Git.Counts()
	// Objects created from here on (creationTimestamp has whole seconds).
	t.createdSince = m.start.Truncate(time.Second)
	type result struct {
		at  time.Time
		err error
	}
	done := make(chan result, 1)
	go func() {
		at, err := t.run(ctx)
		done <- result{at, err}
	}()
	if err := apply(ctx); err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	applied := time.Now()
	if err := m.markApplied(ctx); err != nil {
		m.notes = append(m.notes, "the API server's share after the apply not measured: "+err.Error())
	}
	o.progress("%s: applied in %.1f s", scenario, applied.Sub(m.start).Seconds())
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			if r.err != nil {
				return nil, errors.Join(r.err, serviceState(env))
			}
			// The wall time ends here; the CPU time also counts what the
			// services finish after (acks, clean-up), once nothing is in flight.
			settle(ctx, env)
			out, err := m.stop(ctx, r.at)
			out.Apply = applied.Sub(m.start)
			listings, fetches := env.Git.Counts()
			out.Counters = map[string]int64{CounterGitListings: listings - listings0, CounterGitFetches: fetches - fetches0}
			out.CreatedToReady, out.CreatedToLastReady = t.createdToReady()
			o.progress("%s: %d/%d after %.1f s", scenario, want, want, out.Wall.Seconds())
			return out, err
		case <-tick.C:
			o.progress("%s: %d/%d after %.0f s", scenario, t.count(), want, time.Since(m.start).Seconds())
		}
	}
}

// settle waits, for up to settleTimeout, until no service has a job in
// flight and no controller a reconcile queued or running.
func settle(ctx context.Context, env *harness.Env) {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	for {
		busy := 0.0
		for _, s := range env.Services() {
			if s.TelemetryAddr == "" {
				continue
			}
			ss, err := scrape(ctx, s.TelemetryAddr)
			if err != nil {
				return
			}
			// Headwater's jobs, and controller-runtime's queued and running
			// reconciles (the watcher's, and Flux's).
			busy += ss.SumBy("headwater_jobs_in_flight")[""] + ss.SumBy("workqueue_depth")[""] +
				ss.SumBy("controller_runtime_active_workers")[""]
		}
		if busy == 0 || !sleep(ctx, 100*time.Millisecond) {
			return
		}
	}
}

// serviceState reports services that are no longer running.
func serviceState(env *harness.Env) error {
	var errs []error
	for _, s := range env.Services() {
		if !s.Running() {
			errs = append(errs, fmt.Errorf("%s exited (%v); see %s", s.Name, s.ExitErr(), s.LogPath))
		}
	}
	return errors.Join(errs...)
}

// forEach calls f for every name with applyWorkers at once, stopping at
// the first error.
func forEach(ctx context.Context, names []string, f func(ctx context.Context, i int, name string) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range applyWorkers {
		wg.Go(func() {
			for i := range next {
				if err := f(ctx, i, names[i]); err != nil {
					cancel(fmt.Errorf("%s: %w", names[i], err))
				}
			}
		})
	}
feed:
	for i := range names {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

// benchClient is a client without client-side throttling, so the load
// generator applies as fast as the API server takes it.
func benchClient(ctx context.Context, env *harness.Env) (client.WithWatch, error) {
	cfg := rest.CopyConfig(env.RESTConfig)
	cfg.QPS, cfg.Burst = -1, -1
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	// The first requests discover the API and make the API server build
	// its GitRepository handler (seconds on this machine): a dry-run create
	// does both now rather than in the measured apply.
	warm := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-warm-up", Namespace: namespace},
		Spec: sourcev1.GitRepositorySpec{
			URL:       env.Git.RepoURL("warm-up"),
			Interval:  metav1.Duration{Duration: smallInterval},
			Reference: &sourcev1.GitRepositoryRef{Branch: branch},
		},
	}
	if err := c.Create(ctx, warm, client.DryRunAll); err != nil {
		return nil, fmt.Errorf("kubernetes client warm-up: %w", err)
	}
	return c, nil
}
