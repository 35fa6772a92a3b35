package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Scenario m's counters.
const (
	// CounterOutputsRebuilt counts the ExternalArtifacts that got a new
	// revision from the measured commit; the goal is the one app it
	// touched.
	CounterOutputsRebuilt = "outputs rebuilt"
)

// GeneratorLoad is scenario m: Generators ArtifactGenerators over one
// monorepo GitRepository of Apps apps (apps/app-NNN/), generator i
// publishing app i as one ExternalArtifact.
type GeneratorLoad struct {
	Generators, Apps int
}

// Name names the scenario in the table.
func (l GeneratorLoad) Name() string {
	return fmt.Sprintf("m. %d ArtifactGenerators over one monorepo of %d apps: commit touching one app -> every generator Ready on it (Headwater only)",
		l.Generators, l.Apps)
}

// Target is the goal: one output rebuilt per commit touching one app.
func (l GeneratorLoad) Target() Target {
	return Target{MaxCounters: map[string]int64{CounterOutputsRebuilt: 1}}
}

func appName(i int) string { return fmt.Sprintf("app-%03d", i) }

func appFiles(apps, changed, version int) map[string]string {
	files := map[string]string{"README.md": "# monorepo\n"}
	for i := range apps {
		v := 1
		if i == changed {
			v = version
		}
		files["apps/"+appName(i)+"/deployment.yaml"] = fmt.Sprintf("kind: Deployment\nmetadata:\n  name: %s\nspec:\n  replicas: %d\n", appName(i), v)
		files["apps/"+appName(i)+"/service.yaml"] = fmt.Sprintf("kind: Service\nmetadata:\n  name: %s\n", appName(i))
	}
	return files
}

// Generators runs scenario m on Headwater: the generators are applied and
// awaited Ready (not measured); then one commit changes app 0 and the
// GitRepository is asked to reconcile, and the measurement runs from the
// commit until every generator has applied the new sources (its
// observedSourcesDigest moved on, Ready True). It counts the
// ExternalArtifacts whose revision changed.
func Generators(ctx context.Context, o Options, l GeneratorLoad) (m *Measurement, err error) {
	env, stop, err := startEnv(ctx, o, "generators", Headwater)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	c, err := benchClient(ctx, env)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()

	repo, err := env.NewRepo("monorepo", branch)
	if err != nil {
		return nil, err
	}
	if err := repo.Write(appFiles(l.Apps, -1, 1)); err != nil {
		return nil, err
	}
	if _, err := repo.Commit("Initial apps"); err != nil {
		return nil, err
	}
	src := gitRepository("monorepo", env.Git.RepoURL("monorepo"), time.Hour)
	if err := c.Create(sctx, src); err != nil {
		return nil, fmt.Errorf("create gitrepository: %w", err)
	}
	names := make([]string, l.Generators)
	for i := range names {
		names[i] = fmt.Sprintf("gen-%03d", i)
	}
	if err := forEach(sctx, names, func(ctx context.Context, i int, name string) error {
		app := appName(i % l.Apps)
		return c.Create(ctx, &swv1beta1.ArtifactGenerator{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec: swv1beta1.ArtifactGeneratorSpec{
				Sources: []swv1beta1.SourceReference{{Alias: "repo", Kind: sourcev1.GitRepositoryKind, Name: "monorepo"}},
				OutputArtifacts: []swv1beta1.OutputArtifact{{Name: name + "-" + app, OriginRevision: "@repo",
					Copy: []swv1beta1.CopyOperation{{From: "@repo/apps/" + app + "/**", To: "@artifact/"}}}},
			},
		})
	}); err != nil {
		return nil, fmt.Errorf("create generators: %w", err)
	}
	o.progress("m: waiting for %d generators", l.Generators)
	digests, err := waitGenerators(sctx, c, names, nil)
	if err != nil {
		return nil, err
	}
	before, err := outputRevisions(sctx, c)
	if err != nil {
		return nil, err
	}

	meter, err := startMeter(sctx, env)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := repo.Write(appFiles(l.Apps, 0, 2)); err != nil {
		return nil, err
	}
	if _, err := repo.Commit("Scale app 0"); err != nil {
		return nil, err
	}
	token := start.UTC().Format(time.RFC3339Nano)
	patch := client.RawPatch("application/merge-patch+json",
		fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, meta.ReconcileRequestAnnotation, token))
	if err := c.Patch(sctx, src, patch); err != nil {
		return nil, fmt.Errorf("request reconcile: %w", err)
	}
	if _, err := waitGenerators(sctx, c, names, digests); err != nil {
		return nil, err
	}
	end := time.Now()
	settle(sctx, env)
	m, err = meter.stop(sctx, end)
	if err != nil {
		return nil, err
	}
	after, err := outputRevisions(sctx, c)
	if err != nil {
		return nil, err
	}
	var rebuilt int64
	for name, rev := range after {
		if before[name] != rev {
			rebuilt++
		}
	}
	if m.Counters == nil {
		m.Counters = map[string]int64{}
	}
	m.Counters[CounterOutputsRebuilt] = rebuilt
	m.Notes = append(m.Notes, fmt.Sprintf("commit -> all %d generators Ready on it: %.2f s; %d of %d outputs rebuilt",
		l.Generators, end.Sub(start).Seconds(), rebuilt, len(after)))
	return m, nil
}

// waitGenerators waits until every generator is Ready for its generation
// with an observedSourcesDigest other than the one in old (any, when old
// is nil), and returns the digests.
func waitGenerators(ctx context.Context, c client.Client, names []string, old map[string]string) (map[string]string, error) {
	digests := map[string]string{}
	err := pollEvery(ctx, generatorsPoll, scenarioTimeout, func() (bool, error) {
		var list swv1beta1.ArtifactGeneratorList
		if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
			return false, err
		}
		ready := 0
		for _, g := range list.Items {
			cond := apimeta.FindStatusCondition(g.Status.Conditions, meta.ReadyCondition)
			if cond == nil || cond.Status != metav1.ConditionTrue || cond.ObservedGeneration != g.Generation {
				continue
			}
			if old != nil && g.Status.ObservedSourcesDigest == old[g.Name] {
				continue
			}
			digests[g.Name] = g.Status.ObservedSourcesDigest
			ready++
		}
		return ready >= len(names), nil
	})
	if err != nil {
		return nil, fmt.Errorf("generators Ready: %w", err)
	}
	return digests, nil
}

// generatorsPoll is how often scenario m lists the generators: a list of
// all of them is not a cheap read to repeat every few milliseconds.
const generatorsPoll = 100 * time.Millisecond

// pollEvery calls done every step until it reports true, fails, or within
// passes.
func pollEvery(ctx context.Context, step, within time.Duration, done func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		if !sleep(ctx, step) {
			return ctx.Err()
		}
	}
}

// outputRevisions returns the revision of every ExternalArtifact.
func outputRevisions(ctx context.Context, c client.Client) (map[string]string, error) {
	var list sourcev1.ExternalArtifactList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, ea := range list.Items {
		if ea.Status.Artifact != nil {
			out[ea.Name] = ea.Status.Artifact.Revision
		}
	}
	return out, nil
}
