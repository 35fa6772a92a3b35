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

// helmIndexSize is the size of scenario c's generated index: 48 MiB, about
// 80,000 chart versions over 2,000 charts.
const helmIndexSize = 48 << 20

// HelmIndex runs scenario c: one HelmRepository whose index is 48 MiB
// (generated, served by the benchmark), awaited Ready, then one HelmChart
// of a chart listed in it, awaited Ready. Flux holds the whole index in
// memory to store it and again to pick the chart's version.
func HelmIndex(ctx context.Context, o Options) (m *Measurement, err error) {
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
	o.progress("c: serving a %.1f MiB index", float64(index.Len())/(1<<20))

	env, stop, err := startEnv(ctx, o, "helm-index")
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
		return nil, fmt.Errorf("scenario c: %w", err)
	}
	if err := waitReady(sctx, c, &sourcev1.HelmRepository{}, repo.Name); err != nil {
		return nil, errors.Join(fmt.Errorf("scenario c: %w", err), serviceState(env))
	}
	o.progress("c: HelmRepository Ready after %.1f s", time.Since(start).Seconds())
	if err := c.Create(sctx, chart); err != nil {
		return nil, fmt.Errorf("scenario c: %w", err)
	}
	if err := waitReady(sctx, c, &sourcev1.HelmChart{}, chart.Name); err != nil {
		return nil, errors.Join(fmt.Errorf("scenario c: %w", err), serviceState(env))
	}
	at := time.Now()
	o.progress("c: HelmChart Ready after %.1f s", at.Sub(start).Seconds())
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

// waitReady polls the object name until it is Ready.
func waitReady(ctx context.Context, c client.Client, obj readyObject, name string) error {
	for {
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj); err == nil {
			if cond := apimeta.FindStatusCondition(obj.GetConditions(), meta.ReadyCondition); cond != nil && cond.Status == metav1.ConditionTrue {
				return nil
			}
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return fmt.Errorf("%T %s not Ready: %w", obj, name, ctx.Err())
		}
	}
}
