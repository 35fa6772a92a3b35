package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/testsupport/gitserver"
	"github.com/headwater-gitops/headwater/testsupport/otlpreceiver"
)

// The tenants of scenario f, each a namespace.
const (
	bigTenant   = "tenant-big"
	smallTenant = "tenant-small"
)

// FairLoad is scenario f (issue 30, fair share): a big tenant creates
// Big GitRepositories over as many distinct repositories, and Delay later
// a small tenant creates Small over repositories of their own; what is
// measured is the small tenant's time to Ready under that load against its
// time on the idle system, measured first in the same run (over other
// repositories of its own, so that no cache serves the second).
//
// The small tenant's repositories are served from a host of their own (the
// same git server's repositories on another loopback address) unless
// SameHost: the fetchers' polite limit (-rate-limits, 20 requests a second
// per host by default) is a budget per host, shared on purpose by every
// tenant of that host, and on one host it, not the queues, sets how fast
// either tenant is served (docs/design.md, "Fair share between
// namespaces").
type FairLoad struct {
	Big, Small int
	Delay      time.Duration
	// SameHost serves both tenants from one git host, so that they share
	// its rate limit.
	SameHost bool
	// UntilSmall ends the measurement once the small tenant's loaded round
	// is Ready rather than when the big tenant's last source is: what a
	// big tenant of 10,000 does to the small one is known long before its
	// last source is. The measurement's wall, CPU and requests are then
	// those of that window (and the settling after it), and it notes how
	// many of the big tenant's sources were Ready.
	UntilSmall bool
	// Stages, on Headwater, exports every service's spans to the
	// benchmark and notes where the small tenant's sources spent their
	// time, in each round (stages.go). Tracing costs CPU of its own: the
	// times of a run with Stages are not the scenario's figures.
	Stages bool
}

// Name is the scenario's row.
func (l FairLoad) Name() string {
	hosts := "the small tenant's on a git host of its own"
	if l.SameHost {
		hosts = "both tenants' on one git host"
	}
	until := ""
	if l.UntilSmall {
		until = ", measured until the small tenant is Ready"
	}
	return fmt.Sprintf("f. fair share: %d GitRepositories of a small tenant %s after %d of a big one (over %d distinct repositories, %s%s)",
		l.Small, l.Delay, l.Big, l.Big+2*l.Small, hosts, until)
}

// Fairness is what scenario f measured: the small tenant's time to Ready
// (its first create until its last source Ready with an artifact) on the
// idle system and under the big tenant's load.
type Fairness struct {
	Idle, Loaded time.Duration
}

// Ratio is Loaded / Idle, 0 when Idle is not positive.
func (f *Fairness) Ratio() float64 {
	if f == nil || f.Idle <= 0 {
		return 0
	}
	return float64(f.Loaded) / float64(f.Idle)
}

// String is "idle 1.2 s, loaded 2.0 s (1.7x)".
func (f *Fairness) String() string {
	if f == nil {
		return "not measured"
	}
	return fmt.Sprintf("idle %.2f s, loaded %.2f s (%.1fx)", f.Idle.Seconds(), f.Loaded.Seconds(), f.Ratio())
}

// FairShare runs scenario f on sys. Its measurement is the big tenant's
// (wall: until its last source is Ready), with the small tenant's times in
// Fairness.
func FairShare(ctx context.Context, o Options, sys System, load FairLoad) (m *Measurement, err error) {
	var traces *otlpreceiver.Receiver
	if load.Stages && sys == Headwater {
		if traces, err = otlpreceiver.Start(); err != nil {
			return nil, fmt.Errorf("scenario f: trace receiver: %w", err)
		}
		defer traces.Close()
		o.Harness.Env = append(slices.Clone(o.Harness.Env), stageOTelEnv(traces.HTTPEndpoint())...)
	}
	env, stop, err := startEnv(ctx, o, "fair-share", sys)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	urls, err := linkSmallRepos(env, load.Big+2*load.Small, o.Progress)
	if err != nil {
		return nil, err
	}
	if !load.SameHost {
		// The same repositories on another loopback address: another
		// host to the fetchers' limits (the egress policy of the Env lets
		// every service reach 127.0.0.0/8).
		own := &gitserver.Server{Root: env.GitRoot}
		if err := own.Start(smallTenantHost + ":0"); err != nil {
			return nil, fmt.Errorf("scenario f: the small tenant's git host: %w", err)
		}
		defer func() { err = errors.Join(err, own.Stop()) }()
		if err := moveHost(urls[load.Big:], env.Git.URL(), own.URL()); err != nil {
			return nil, fmt.Errorf("scenario f: %w", err)
		}
	}
	c, err := benchClient(ctx, env)
	if err != nil {
		return nil, err
	}
	for _, ns := range []string{bigTenant, smallTenant} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return nil, fmt.Errorf("scenario f: namespace %s: %w", ns, err)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()

	// The small tenant on the idle system.
	o.progress("f (%s): the small tenant's %d GitRepositories on the idle system", sys, load.Small)
	idle, err := tenantReady(sctx, c, smallTenant, "idle", urls[load.Big:load.Big+load.Small])
	if err != nil {
		return nil, fmt.Errorf("scenario f, idle: %w", err)
	}

	// The big tenant, and the small one Delay later.
	var loaded round
	o.progress("f (%s): the big tenant's %d, the small tenant's %d %s later", sys, load.Big, load.Small, load.Delay)
	big := newTracker(c, bigTenant, load.Big, func() client.ObjectList { return &sourcev1.GitRepositoryList{} },
		readyWithArtifact[*sourcev1.GitRepository])
	// What the measurement waits for: the big tenant's every source, or
	// with UntilSmall the small tenant's loaded round.
	measured, want := big, load.Big
	if load.UntilSmall {
		measured, want = newTracker(c, smallTenant, load.Small, func() client.ObjectList { return &sourcev1.GitRepositoryList{} },
			func(o *sourcev1.GitRepository) bool {
				return strings.HasPrefix(o.Name, "loaded-") && readyWithArtifact(o)
			}), load.Small
	}
	var bigReady int
	m, err = measureKind(sctx, o, "f", env, measured, want, func(ctx context.Context) error {
		names := sourceNames("big", load.Big)
		cctx, stopCreating := context.WithCancel(ctx)
		defer stopCreating()
		created := make(chan error, 1)
		go func() {
			created <- forEach(cctx, names, func(ctx context.Context, i int, name string) error {
				return c.Create(ctx, gitRepositoryIn(bigTenant, name, urls[i]))
			})
		}()
		if !sleep(ctx, load.Delay) {
			return ctx.Err()
		}
		var err error
		loaded, err = tenantReady(ctx, c, smallTenant, "loaded", urls[load.Big+load.Small:])
		if load.UntilSmall && err == nil {
			bigReady, err = countReady(ctx, c, bigTenant)
			stopCreating()
			if cerr := <-created; cerr != nil && !errors.Is(cerr, context.Canceled) {
				err = cerr
			}
			return err
		}
		return errors.Join(err, <-created)
	})
	if err != nil {
		return m, fmt.Errorf("scenario f: %w", err)
	}
	m.Fairness = &Fairness{Idle: idle.ready.Sub(idle.start), Loaded: loaded.ready.Sub(loaded.start)}
	m.Notes = append(m.Notes, "small tenant's time to Ready: "+m.Fairness.String())
	if load.UntilSmall {
		m.Notes = append(m.Notes, fmt.Sprintf("measured until the small tenant was Ready: the big tenant's sources Ready then, %d of %d "+
			"(its creates stopped there); wall, CPU and requests are that window's and its settling's", bigReady, load.Big))
	}
	if traces != nil {
		// The services export every 500 ms: wait for the last spans.
		if !sleep(ctx, 3*time.Second) {
			return m, ctx.Err()
		}
		spans := traces.Spans()
		for _, r := range []round{idle, loaded} {
			table, n := stageTable(spans, smallTenant, r.prefix, r.start)
			o.progress("f (%s): stages of the small tenant's %s round (%d of %d sources traced; %d spans received), from its first create "+
				"(its creates returned after %d ms, its last source Ready after %d ms):\n%s",
				sys, strings.TrimSuffix(r.prefix, "-"), n, load.Small, len(spans), r.created.Sub(r.start).Milliseconds(),
				r.ready.Sub(r.start).Milliseconds(), table)
		}
		m.Notes = append(m.Notes, "run with -stages (tracing on): its times are not the scenario's figures")
	}
	return m, nil
}

// smallTenantHost is the loopback address of the small tenant's git host
// (the big tenant's is 127.0.0.1).
const smallTenantHost = "127.0.0.2"

// moveHost points every url of base from at base to, in place; each must
// start with from.
func moveHost(urls []string, from, to string) error {
	for i, u := range urls {
		rest, ok := strings.CutPrefix(u, from+"/")
		if !ok {
			return fmt.Errorf("repository URL %s is not on %s", u, from)
		}
		urls[i] = to + "/" + rest
	}
	return nil
}

// countReady is how many GitRepositories of ns are Ready with an artifact.
func countReady(ctx context.Context, c client.Client, ns string) (int, error) {
	var list sourcev1.GitRepositoryList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return 0, fmt.Errorf("list %s: %w", ns, err)
	}
	n := 0
	for i := range list.Items {
		if readyWithArtifact(&list.Items[i]) {
			n++
		}
	}
	return n, nil
}

// round is a tenant's round of creates: when it started, when its
// creates had returned and when its last source was Ready.
type round struct {
	prefix                string
	start, created, ready time.Time
}

// tenantReady creates a GitRepository of each url in ns (names prefixed
// with prefix) and awaits them all Ready with an artifact.
func tenantReady(ctx context.Context, c client.WithWatch, ns, prefix string, urls []string) (round, error) {
	// The idle round's sources are Ready already when the loaded round
	// starts: each round counts its own.
	t := newTracker(c, ns, len(urls), func() client.ObjectList { return &sourcev1.GitRepositoryList{} },
		func(o *sourcev1.GitRepository) bool {
			return strings.HasPrefix(o.Name, prefix+"-") && readyWithArtifact(o)
		})
	r := round{prefix: prefix + "-", start: time.Now()}
	done := make(chan error, 1)
	var ready time.Time
	go func() {
		var err error
		ready, err = t.run(ctx)
		done <- err
	}()
	names := sourceNames(prefix, len(urls))
	if err := forEach(ctx, names, func(ctx context.Context, i int, name string) error {
		return c.Create(ctx, gitRepositoryIn(ns, name, urls[i]))
	}); err != nil {
		return r, fmt.Errorf("create: %w", err)
	}
	r.created = time.Now()
	err := <-done
	r.ready = ready
	return r, err
}

// sourceNames are n names prefix-00000 on.
func sourceNames(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return names
}

// gitRepositoryIn is gitRepository in namespace ns.
func gitRepositoryIn(ns, name, url string) *sourcev1.GitRepository {
	o := gitRepository(name, url, smallInterval)
	o.Namespace = ns
	return o
}
