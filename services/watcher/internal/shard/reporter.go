package shard

import (
	"context"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// NewUnownedGauge registers headwater_watcher_unowned_sources on reg: the
// sources, by kind, whose labels match no shard of the fleet.
func NewUnownedGauge(reg prometheus.Registerer) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "headwater_watcher_unowned_sources",
		Help: "Sources whose labels match no watcher shard of the fleet (-fleet-selectors): no watcher reconciles them.",
	}, []string{"kind"})
	reg.MustRegister(g)
	return g
}

// Reporter reports the sources that match none of a fleet's shards, which
// Flux ignores silently: a gauge by kind and a log line naming each when
// it becomes unowned (and when a shard owns it again). It watches the
// metadata of every source object (a metadata-only informer: labels, not
// specs) in the namespaces the watcher watches. It runs on the elected
// leader alone (manager.LeaderElectionRunnable), so one replica reports.
type Reporter struct {
	// Config reaches the API server.
	Config *rest.Config
	// Scheme maps the kinds to their resources.
	Scheme *runtime.Scheme
	// Kinds are the source kinds watched, by name (as in a job).
	Kinds map[string]schema.GroupVersionKind
	// Namespace is the one namespace watched; empty for all.
	Namespace string
	// Fleet are the selectors of every shard.
	Fleet Fleet
	// Unowned is the gauge (NewUnownedGauge).
	Unowned *prometheus.GaugeVec
	// Log says which sources are unowned.
	Log logr.Logger

	mu      sync.Mutex
	unowned map[string]map[types.NamespacedName]bool
}

var (
	_ manager.Runnable               = (*Reporter)(nil)
	_ manager.LeaderElectionRunnable = (*Reporter)(nil)
)

// Start watches until ctx ends.
func (r *Reporter) Start(ctx context.Context) error {
	opts := cache.Options{Scheme: r.Scheme, DefaultTransform: cache.TransformStripManagedFields()}
	if r.Namespace != "" {
		opts.DefaultNamespaces = map[string]cache.Config{r.Namespace: {}}
	}
	c, err := cache.New(r.Config, opts)
	if err != nil {
		return fmt.Errorf("unowned sources: cache: %w", err)
	}
	for kind, gvk := range r.Kinds {
		obj := &metav1.PartialObjectMetadata{}
		obj.SetGroupVersionKind(gvk)
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("unowned sources: %s informer: %w", kind, err)
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { r.Observe(kind, obj) },
			UpdateFunc: func(_, obj any) { r.Observe(kind, obj) },
			DeleteFunc: func(obj any) { r.Forget(kind, obj) },
		}); err != nil {
			return fmt.Errorf("unowned sources: %s handler: %w", kind, err)
		}
	}
	r.Log.Info("reporting the sources no shard owns", "fleet", r.Fleet.String())
	return c.Start(ctx)
}

// NeedLeaderElection makes the reporter run on the leader alone.
func (r *Reporter) NeedLeaderElection() bool { return true }

// Observe notes a source of kind as it is now: unowned when its labels
// match none of the fleet's selectors.
func (r *Reporter) Observe(kind string, obj any) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	key := types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()}
	owned := r.Fleet.Owns(m.GetLabels()) || !m.GetDeletionTimestamp().IsZero()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unowned == nil {
		r.unowned = map[string]map[types.NamespacedName]bool{}
	}
	set := r.unowned[kind]
	if set == nil {
		set = map[types.NamespacedName]bool{}
		r.unowned[kind] = set
	}
	switch {
	case !owned && !set[key]:
		set[key] = true
		r.Log.Info("source matches no watcher shard: nothing reconciles it; fix its labels or the shards' selectors",
			"kind", kind, "namespace", key.Namespace, "name", key.Name, "labels", m.GetLabels())
	case owned && set[key]:
		delete(set, key)
		r.Log.Info("source matches a watcher shard again", "kind", kind, "namespace", key.Namespace, "name", key.Name)
	}
	r.Unowned.WithLabelValues(kind).Set(float64(len(set)))
}

// Forget drops a deleted source of kind.
func (r *Reporter) Forget(kind string, obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.unowned[kind]
	delete(set, types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()})
	r.Unowned.WithLabelValues(kind).Set(float64(len(set)))
}
