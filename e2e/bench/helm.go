package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
)

// helmIndexSize is the size of scenario h's generated index: 48 MiB, about
// 80,000 chart versions over 2,000 charts.
const helmIndexSize = 48 << 20

// HelmIndex runs scenario h on sys: one HelmRepository whose index is 48 MiB
// (generated, served by the benchmark), awaited Ready, then one HelmChart
// of a chart listed in it, awaited Ready. Flux holds the whole index in
// memory to store it and again to pick the chart's version.
func HelmIndex(ctx context.Context, o Options, sys System) (m *Measurement, err error) {
	dir, err := os.MkdirTemp(o.Harness.Dir, "headwater-bench-charts-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	srv := &chartrepo.Server{Dir: dir}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		return nil, err
	}
	defer srv.Stop()
	if err := srv.Add(chartrepo.Chart{Name: "podinfo", Version: "6.1.0"}); err != nil {
		return nil, err
	}
	// The generated charts first, then the real one, as the last entry.
	real := srv.Index()
	i := bytes.Index(real, []byte("entries:\n"))
	if i < 0 {
		return nil, errors.New("the chart repository's index has no entries")
	}
	var index bytes.Buffer
	index.WriteString("apiVersion: v1\nentries:\n")
	if err := chartrepo.WriteBigIndex(&index, helmIndexSize, 2000); err != nil {
		return nil, err
	}
	index.Write(real[i+len("entries:\n"):])
	srv.SetIndex(index.Bytes())
	o.progress("h: serving a %.1f MiB index", float64(index.Len())/(1<<20))

	env, stop, err := startEnv(ctx, o, "helm-index", sys)
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
	meter, err := startMeter(sctx, env)
	if err != nil {
		return nil, err
	}
	repo := &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "big-index", Namespace: namespace},
		Spec:       sourcev1.HelmRepositorySpec{URL: srv.URL(), Interval: metav1.Duration{Duration: smallInterval}},
	}
	chart := &sourcev1.HelmChart{
		ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: namespace},
		Spec: sourcev1.HelmChartSpec{Chart: "podinfo", Interval: metav1.Duration{Duration: smallInterval},
			SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: repo.Name}},
	}
	start := time.Now()
	if err := c.Create(sctx, repo); err != nil {
		return nil, fmt.Errorf("scenario h: %w", err)
	}
	if err := waitReady(sctx, c, &sourcev1.HelmRepository{}, repo.Name); err != nil {
		return nil, errors.Join(fmt.Errorf("scenario h: %w", err), serviceState(env))
	}
	o.progress("h (%s): HelmRepository Ready after %.1f s", sys, time.Since(start).Seconds())
	if err := c.Create(sctx, chart); err != nil {
		return nil, fmt.Errorf("scenario h: %w", err)
	}
	if err := waitReady(sctx, c, &sourcev1.HelmChart{}, chart.Name); err != nil {
		return nil, errors.Join(fmt.Errorf("scenario h: %w", err), serviceState(env))
	}
	at := time.Now()
	o.progress("h (%s): HelmChart Ready after %.1f s", sys, at.Sub(start).Seconds())
	settle(sctx, env)
	m, err = meter.stop(sctx, at)
	if err != nil {
		return m, err
	}
	m.ArtifactBytes = int64(index.Len())
	return m, nil
}

// readyObject is a Flux source the scenario waits for.
type readyObject interface {
	client.Object
	GetConditions() []metav1.Condition
}

// failingFor is how long an object may stay Ready=False with one message
// before waitReady gives up on it: a failure that outlasts the controller's
// retries for that long is the system's answer, not a step on the way.
const failingFor = 2 * time.Minute

// waitReady polls the object name until it is Ready, or until it has been
// Ready=False with the same message for failingFor.
func waitReady(ctx context.Context, c client.Client, obj readyObject, name string) error {
	var failing string
	var since time.Time
	for {
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj); err == nil {
			cond := apimeta.FindStatusCondition(obj.GetConditions(), meta.ReadyCondition)
			switch {
			case cond != nil && cond.Status == metav1.ConditionTrue:
				return nil
			case cond != nil && cond.Status == metav1.ConditionFalse && cond.Message != "":
				if cond.Message != failing {
					failing, since = cond.Message, time.Now()
				} else if time.Since(since) >= failingFor {
					return fmt.Errorf("%T %s not Ready for %s: %s: %s", obj, name, failingFor, cond.Reason, cond.Message)
				}
			default:
				failing = ""
			}
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return fmt.Errorf("%T %s not Ready: %w", obj, name, ctx.Err())
		}
	}
}

// Counter names of scenario i's measurements (Measurement.Counters).
const (
	// CounterIndexDownloads is the index downloads the chart repository
	// served in full.
	CounterIndexDownloads = "index downloads"
	// CounterIndexNotModified is its 304 answers.
	CounterIndexNotModified = "index 304s"
)

// helmSameURL is the number of HelmRepositories of scenario i.
const helmSameURL = 100

// HelmSameURL runs scenario i on sys: 100 HelmRepositories of one URL created at
// once, awaited Ready; then a reconcile request to all of them with the
// index unchanged, awaited handled. The notes count what the repository
// served: index downloads (target 1) and 304s.
func HelmSameURL(ctx context.Context, o Options, sys System) (created, requested *Measurement, err error) {
	dir, err := os.MkdirTemp(o.Harness.Dir, "headwater-bench-charts-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	srv := &chartrepo.Server{Dir: dir}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		return nil, nil, err
	}
	defer srv.Stop()
	if err := srv.Add(chartrepo.Chart{Name: "podinfo", Version: "6.1.0"}); err != nil {
		return nil, nil, err
	}
	env, stop, err := startEnv(ctx, o, "helm-same-url", sys)
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	c, err := benchClient(ctx, env)
	if err != nil {
		return nil, nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()
	names := make([]string, helmSameURL)
	for i := range names {
		names[i] = fmt.Sprintf("same-url-%03d", i)
	}
	served := func(m *Measurement, d, nm int) {
		m.Counters = map[string]int64{CounterIndexDownloads: int64(d), CounterIndexNotModified: int64(nm)}
	}

	meter, err := startMeter(sctx, env)
	if err != nil {
		return nil, nil, err
	}
	if err := forEach(sctx, names, func(ctx context.Context, _ int, name string) error {
		return c.Create(ctx, &sourcev1.HelmRepository{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec:       sourcev1.HelmRepositorySpec{URL: srv.URL(), Interval: metav1.Duration{Duration: smallInterval}},
		})
	}); err != nil {
		return nil, nil, fmt.Errorf("scenario i: %w", err)
	}
	for _, name := range names {
		if err := waitReady(sctx, c, &sourcev1.HelmRepository{}, name); err != nil {
			return nil, nil, errors.Join(fmt.Errorf("scenario i: %w", err), serviceState(env))
		}
	}
	at := time.Now()
	o.progress("i: %d HelmRepositories Ready", helmSameURL)
	settle(sctx, env)
	if created, err = meter.stop(sctx, at); err != nil {
		return created, nil, err
	}
	d, nm, _ := srv.Counts()
	served(created, d, nm)

	d0, nm0, _ := srv.Counts()
	if meter, err = startMeter(sctx, env); err != nil {
		return created, nil, err
	}
	token := time.Now().UTC().Format(time.RFC3339Nano)
	if err := forEach(sctx, names, func(ctx context.Context, _ int, name string) error {
		obj := &sourcev1.HelmRepository{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj); err != nil {
			return err
		}
		base := client.MergeFrom(obj.DeepCopy())
		obj.SetAnnotations(map[string]string{meta.ReconcileRequestAnnotation: token})
		return c.Patch(ctx, obj, base)
	}); err != nil {
		return created, nil, fmt.Errorf("scenario i: %w", err)
	}
	for _, name := range names {
		for {
			obj := &sourcev1.HelmRepository{}
			if err := c.Get(sctx, client.ObjectKey{Namespace: namespace, Name: name}, obj); err == nil && obj.Status.LastHandledReconcileAt == token {
				break
			}
			if !sleep(sctx, 100*time.Millisecond) {
				return created, nil, fmt.Errorf("scenario i: %s did not handle the reconcile request: %w", name, sctx.Err())
			}
		}
	}
	at = time.Now()
	settle(sctx, env)
	if requested, err = meter.stop(sctx, at); err != nil {
		return created, requested, err
	}
	d1, nm1, _ := srv.Counts()
	served(requested, d1-d0, nm1-nm0)
	return created, requested, nil
}
