package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// memoryPointWindow is how long the memory of a stage of scenario es is
// sampled, once the stage's sources are Ready and the system has settled.
const memoryPointWindow = 3 * time.Second

// Stages of scenario es: Headwater's go to e's 10,000 sources; Flux's stop
// at 2,000, where issue 20 measures its slope.
const growthRepos = 100

var (
	growthStages     = []int{1000, 2000, 10000}
	growthStagesFlux = []int{1000, 2000}
)

// MemoryPoint is the memory of the system's processes when Sources
// sources were Ready.
type MemoryPoint struct {
	// Sources is the number of Ready sources.
	Sources int
	// PSS and Anon are the peaks of the sampled sums of the system's
	// processes' PSS and anonymous memory over memoryPointWindow.
	PSS, Anon uint64
}

// MemorySlope is the memory of a system's processes at growing numbers of
// Ready sources, in the order they were reached.
type MemorySlope []MemoryPoint

// PerThousand is the growth of the PSS sum per 1,000 sources from the
// point at from sources to the point at to, in bytes (negative when it
// shrank); ok is false when either point is missing.
func (s MemorySlope) PerThousand(from, to int) (perThousand float64, ok bool) {
	var a, b *MemoryPoint
	for i := range s {
		switch s[i].Sources {
		case from:
			a = &s[i]
		case to:
			b = &s[i]
		}
	}
	if a == nil || b == nil || to == from {
		return 0, false
	}
	return (float64(b.PSS) - float64(a.PSS)) / (float64(to-from) / 1000), true
}

// Slope is the growth per 1,000 sources from the first point to the last:
// what scenario es compares.
func (s MemorySlope) Slope() (perThousand float64, ok bool) {
	if len(s) < 2 {
		return 0, false
	}
	return s.PerThousand(s[0].Sources, s[len(s)-1].Sources)
}

// String lists the points and the slopes from the first point: "PSS 180
// MiB at 1000, 190 MiB at 2000 (+10.0 MiB per 1,000)".
func (s MemorySlope) String() string {
	var parts []string
	for i, p := range s {
		part := fmt.Sprintf("%.0f MiB (anon %.0f) at %d", float64(p.PSS)/mib, float64(p.Anon)/mib, p.Sources)
		if d, ok := s.PerThousand(s[0].Sources, p.Sources); ok && i > 0 {
			part += fmt.Sprintf(" (%+.1f MiB per 1,000 from %d)", d/mib, s[0].Sources)
		}
		parts = append(parts, part)
	}
	return "PSS " + strings.Join(parts, ", ")
}

// MemoryGrowth runs scenario es on sys: GitRepositories over repos
// repositories are created in stages, up to each of stages in turn; after
// each stage every source is awaited Ready with an artifact and the system
// left to settle, then its processes' memory is sampled (MemoryPoint). The
// Measurement covers the whole run, until the last stage was Ready; its
// MemorySlope holds the points.
func MemoryGrowth(ctx context.Context, o Options, sys System, repos int, stages []int) (m *Measurement, err error) {
	if len(stages) == 0 {
		return nil, errors.New("scenario es: no stages")
	}
	env, stop, err := startEnv(ctx, o, "memory-growth", sys)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	urls, err := linkSmallRepos(env, repos, o.Progress)
	if err != nil {
		return nil, err
	}
	c, err := benchClient(ctx, env)
	if err != nil {
		return nil, err
	}
	names := make([]string, stages[len(stages)-1])
	for i := range names {
		names[i] = fmt.Sprintf("grow-%05d", i)
	}
	sctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()
	meter, err := startMeter(sctx, env)
	if err != nil {
		return nil, wrapScenario("es", err)
	}
	gitRepositories := func() client.ObjectList { return &sourcev1.GitRepositoryList{} }
	var points MemorySlope
	var ready time.Time
	created := 0
	for _, n := range stages {
		o.progress("es (%s): creating GitRepositories %d to %d", sys, created+1, n)
		if err := forEach(sctx, names[created:n], func(ctx context.Context, i int, name string) error {
			return c.Create(ctx, gitRepository(name, urls[(created+i)%len(urls)], smallInterval))
		}); err != nil {
			return nil, wrapScenario("es", fmt.Errorf("apply: %w", err))
		}
		created = n
		t := newTracker(c, namespace, n, gitRepositories, readyWithArtifact[*sourcev1.GitRepository])
		if ready, err = t.run(sctx); err != nil {
			return nil, wrapScenario("es", errors.Join(err, serviceState(env)))
		}
		settle(sctx, env)
		p, err := meter.memoryPoint(sctx, n)
		if err != nil {
			return nil, wrapScenario("es", err)
		}
		points = append(points, p)
		o.progress("es (%s): %d Ready after %.0f s, PSS %.0f MiB", sys, n, time.Since(meter.start).Seconds(), float64(p.PSS)/mib)
	}
	m, err = meter.stop(sctx, ready)
	if m != nil {
		m.MemorySlope = points
	}
	return m, wrapScenario("es", err)
}

// memoryPoint samples the system's processes for memoryPointWindow and
// returns the peaks of the sampled sums, at sources Ready sources.
func (m *meter) memoryPoint(ctx context.Context, sources int) (MemoryPoint, error) {
	s := startMemorySampler(ctx, m.memory.pids, memoryEvery)
	waited := sleep(ctx, memoryPointWindow)
	peaks, stats := s.finish()
	if !waited {
		return MemoryPoint{}, fmt.Errorf("memory at %d sources: %w", sources, ctx.Err())
	}
	if stats.Samples == 0 {
		return MemoryPoint{}, fmt.Errorf("memory at %d sources: no sample: %w", sources, stats.Err)
	}
	return MemoryPoint{Sources: sources, PSS: peaks.pss, Anon: peaks.anon}, nil
}
