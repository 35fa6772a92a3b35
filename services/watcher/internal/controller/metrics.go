package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/watcher/internal/source"
)

// Metrics are the watcher's reconcile families:
// headwater_reconcile_duration_seconds{kind}, the time one Reconcile takes
// (publishing the job included; the fetch is the fetcher's).
type Metrics struct {
	duration *prometheus.HistogramVec
}

// NewMetrics registers the reconcile families on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: telemetry.Namespace, Name: "reconcile_duration_seconds",
		Help:    "Time one reconcile of a source takes in the watcher, by kind: reading it, writing its status and publishing its job.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"kind"})}
	reg.MustRegister(m.duration)
	return m
}

// observe records one reconcile of kind that started at start.
func (m *Metrics) observe(kind string, start time.Time) {
	if m != nil {
		m.duration.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	}
}

// SourceConditions exports each source's Ready condition as Flux's
// gotk_reconcile_condition does:
// headwater_source_condition{kind,namespace,name,type="Ready",status} is 1
// for the status the condition has ("Unknown" without one) and absent for
// the others, and gone once the object is. It reads the informer cache,
// every Every: no request to the API server. It is a manager Runnable that
// runs on the leader only, so one replica reports.
type SourceConditions struct {
	// Reader is the manager's cached client.
	Reader client.Reader
	// Scheme makes the list types of the source kinds.
	Scheme *runtime.Scheme
	// Every is how often the cache is read; default 30s.
	Every time.Duration
	// Log reports a failed read.
	Log logr.Logger

	gauge *prometheus.GaugeVec
	seen  map[[5]string]bool
}

// NewSourceConditions registers headwater_source_condition on reg.
func NewSourceConditions(reg prometheus.Registerer, r client.Reader, scheme *runtime.Scheme, every time.Duration, log logr.Logger) *SourceConditions {
	s := &SourceConditions{Reader: r, Scheme: scheme, Every: every, Log: log, seen: map[[5]string]bool{},
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: telemetry.Namespace, Name: "source_condition",
			Help: "1 for the status (True, False, Unknown) of each source's Ready condition, as Flux's gotk_reconcile_condition.",
		}, []string{"kind", "namespace", "name", "type", "status"})}
	reg.MustRegister(s.gauge)
	return s
}

// Start records the conditions at once, then every Every until ctx ends.
func (s *SourceConditions) Start(ctx context.Context) error {
	every := s.Every
	if every <= 0 {
		every = 30 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := s.scan(ctx); err != nil && ctx.Err() == nil {
			s.Log.Error(err, "reading sources for their conditions")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// scan sets the gauge from every source in the cache and removes the
// series of the sources and statuses no longer there.
func (s *SourceConditions) scan(ctx context.Context) error {
	now := map[[5]string]bool{}
	for _, kind := range source.Kinds() {
		gvk := sourcev1.GroupVersion.WithKind(kind.Name + "List")
		obj, err := s.Scheme.New(gvk)
		if err != nil {
			return fmt.Errorf("list type of %s: %w", kind.Name, err)
		}
		list, ok := obj.(client.ObjectList)
		if !ok {
			return fmt.Errorf("%s is no list", gvk)
		}
		if err := s.Reader.List(ctx, list); err != nil {
			return fmt.Errorf("list %s: %w", kind.Name, err)
		}
		err = apimeta.EachListItem(list, func(o runtime.Object) error {
			src, ok := o.(source.Object)
			if !ok {
				return nil
			}
			status := "Unknown"
			if c := apimeta.FindStatusCondition(src.GetConditions(), meta.ReadyCondition); c != nil {
				status = string(c.Status)
			}
			now[[5]string{kind.Name, src.GetNamespace(), src.GetName(), meta.ReadyCondition, status}] = true
			return nil
		})
		if err != nil {
			return err
		}
	}
	for l := range now {
		s.gauge.WithLabelValues(l[:]...).Set(1)
	}
	for l := range s.seen {
		if !now[l] {
			s.gauge.DeleteLabelValues(l[:]...)
		}
	}
	s.seen = now
	return nil
}
