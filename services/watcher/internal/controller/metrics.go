package controller

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/watcher/internal/source"
)

// Metrics are the watcher's reconcile families:
// headwater_reconcile_duration_seconds{kind}, the time one Reconcile takes
// (publishing the job included; the fetch is the fetcher's), and
// headwater_fetch_retried_total{kind,after}, the sources fetched again
// before their interval because their last fetch failed for a reason that
// passes (after "failure", on the backoff) or was rate limited (after
// "rate_limited", when the host allows; see Retries).
//
// Beside them, Flux's own family, under Flux's name and with Flux's
// labels and buckets (fluxcd/pkg/runtime/metrics), so that Flux's
// dashboards and alerts read the watcher as they read source-controller:
// gotk_reconcile_duration_seconds{kind,name,namespace}, the same time as
// headwater_reconcile_duration_seconds, per object; an object's series is
// deleted once the object is gone.
type Metrics struct {
	duration *prometheus.HistogramVec
	retries  *prometheus.CounterVec
	flux     *prometheus.HistogramVec
}

// FluxDurationBuckets are those of Flux's gotk_reconcile_duration_seconds:
// ten, exponential, from 10ms to 30 minutes.
var FluxDurationBuckets = prometheus.ExponentialBucketsRange(10e-3, 1800, 10)

// Values of the after label of headwater_fetch_retried_total.
const (
	retriedAfterFailure     = "failure"
	retriedAfterRateLimited = "rate_limited"
)

// NewMetrics registers the reconcile families on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: telemetry.Namespace, Name: "reconcile_duration_seconds",
			Help:    "Time one reconcile of a source takes in the watcher, by kind: reading it, writing its status and publishing its job.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"kind"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "fetch_retried_total",
			Help: "Sources fetched again before their interval, by kind and by what their last fetch met: a failure that passes (failure, on a per-source backoff) or a host's limit (rate_limited, when it allows).",
		}, []string{"kind", "after"}),
		flux: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gotk_reconcile_duration_seconds",
			Help:    "The duration in seconds of a GitOps Toolkit resource reconciliation (Flux's family; in Headwater, the watcher's part of it: the fetch is the fetcher's).",
			Buckets: FluxDurationBuckets,
		}, []string{"kind", "name", "namespace"}),
	}
	reg.MustRegister(m.duration, m.retries, m.flux)
	return m
}

// initRetried makes kind's retry series, at zero, so that they are served
// before the first retry.
func (m *Metrics) initRetried(kind string) {
	if m != nil && kind != "" {
		m.retries.WithLabelValues(kind, retriedAfterFailure)
		m.retries.WithLabelValues(kind, retriedAfterRateLimited)
	}
}

// retried counts a retry of a source of kind that fired.
func (m *Metrics) retried(kind, after string) {
	if m != nil {
		m.retries.WithLabelValues(kind, after).Inc()
	}
}

// observe records one reconcile of the object key of kind that started at
// start; gone says the object no longer exists (or its finalizer is off),
// and deletes its series of gotk_reconcile_duration_seconds, as Flux does.
func (m *Metrics) observe(kind string, key types.NamespacedName, start time.Time, gone bool) {
	if m == nil {
		return
	}
	d := time.Since(start).Seconds()
	m.duration.WithLabelValues(kind).Observe(d)
	if gone {
		m.flux.DeleteLabelValues(kind, key.Name, key.Namespace)
		return
	}
	m.flux.WithLabelValues(kind, key.Name, key.Namespace).Observe(d)
}

// SourceConditions exports each source's Ready condition as Flux's
// gotk_reconcile_condition does:
// headwater_source_condition{kind,namespace,name,type="Ready",status} is 1
// for the status the condition has ("Unknown" without one) and absent for
// the others, and gone once the object is. It is a prometheus.Collector
// that reads the informer cache when Prometheus scrapes, at most once
// every Every (a scrape sooner gets the last figures), without copying
// the objects (client.UnsafeDisableDeepCopy): no request to the API server,
// and no work while nobody scrapes. It is also a manager Runnable that runs
// on the leader only, so one replica reports: the others export nothing.
type SourceConditions struct {
	// Reader is the manager's cached client.
	Reader client.Reader
	// Scheme makes the list types of the source kinds.
	Scheme *runtime.Scheme
	// Every is the least time between two reads of the cache; default 30s.
	Every time.Duration
	// Plugins are the plug-in kinds whose objects are reported too, read
	// from the cache unstructured.
	Plugins []source.Registration
	// Log reports a failed read.
	Log logr.Logger

	desc    *prometheus.Desc
	leading atomic.Bool
	// now is the clock, for the age of the last read.
	now func() time.Time

	mu     sync.Mutex // held across a read, so concurrent scrapes share it
	series [][5]string
	at     time.Time // of the last read; zero before the first
}

// sourceConditionReadTimeout bounds one read of the cache at a scrape.
const sourceConditionReadTimeout = 10 * time.Second

// NewSourceConditions registers headwater_source_condition on reg.
func NewSourceConditions(reg prometheus.Registerer, r client.Reader, scheme *runtime.Scheme, every time.Duration, log logr.Logger) *SourceConditions {
	s := &SourceConditions{Reader: r, Scheme: scheme, Every: every, Log: log, now: time.Now,
		desc: prometheus.NewDesc(prometheus.BuildFQName(telemetry.Namespace, "", "source_condition"),
			"1 for the status (True, False, Unknown) of each source's Ready condition, as Flux's gotk_reconcile_condition.",
			[]string{"kind", "namespace", "name", "type", "status"}, nil)}
	reg.MustRegister(s)
	return s
}

// Start makes the collector report while this replica leads, until ctx
// ends.
func (s *SourceConditions) Start(ctx context.Context) error {
	s.leading.Store(true)
	defer s.leading.Store(false)
	<-ctx.Done()
	return nil
}

// Describe sends the family's description.
func (s *SourceConditions) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }

// Collect sends a series per source, read from the cache if the last read
// is older than Every; a failed read is logged and sends the last one's.
func (s *SourceConditions) Collect(ch chan<- prometheus.Metric) {
	if !s.leading.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	every := s.Every
	if every <= 0 {
		every = 30 * time.Second
	}
	if s.at.IsZero() || s.now().Sub(s.at) >= every {
		ctx, cancel := context.WithTimeout(context.Background(), sourceConditionReadTimeout)
		series, err := s.scan(ctx)
		cancel()
		if err != nil {
			s.Log.Error(err, "reading sources for their conditions")
		} else {
			s.series, s.at = series, s.now()
		}
	}
	for _, l := range s.series {
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, 1, l[:]...)
	}
}

// scan returns the labels of every source's series, from the cache.
func (s *SourceConditions) scan(ctx context.Context) ([][5]string, error) {
	var series [][5]string
	for _, kind := range source.Kinds() {
		gvk := sourcev1.GroupVersion.WithKind(kind.Name + "List")
		obj, err := s.Scheme.New(gvk)
		if err != nil {
			return nil, fmt.Errorf("list type of %s: %w", kind.Name, err)
		}
		list, ok := obj.(client.ObjectList)
		if !ok {
			return nil, fmt.Errorf("%s is no list", gvk)
		}
		// The objects are the cache's own: read, never written.
		if err := s.Reader.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("list %s: %w", kind.Name, err)
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
			series = append(series, [5]string{kind.Name, src.GetNamespace(), src.GetName(), meta.ReadyCondition, status})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	for _, reg := range s.Plugins {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(reg.GVK.GroupVersion().WithKind(reg.GVK.Kind + "List"))
		if err := s.Reader.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("list %s: %w", reg.GVK.Kind, err)
		}
		for _, u := range list.Items {
			status := "Unknown"
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				if m, ok := c.(map[string]any); ok && m["type"] == meta.ReadyCondition {
					if v, ok := m["status"].(string); ok {
						status = v
					}
				}
			}
			series = append(series, [5]string{reg.GVK.Kind, u.GetNamespace(), u.GetName(), meta.ReadyCondition, status})
		}
	}
	return series, nil
}
