package generator

import (
	"context"
	"fmt"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/predicates"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/headwater-gitops/headwater/services/watcher/internal/sourcekind"
)

// sourceIndex is the field index of generators by source: one
// "<Kind>/<namespace>/<name>" entry per source.
const sourceIndex = ".spec.sources.ref"

// sourceKinds are the kinds a generator may name, and how to read their
// artifact.
var sourceKinds = map[string]func() artifactObject{
	sourcev1.GitRepositoryKind:    func() artifactObject { return &sourcev1.GitRepository{} },
	sourcev1.OCIRepositoryKind:    func() artifactObject { return &sourcev1.OCIRepository{} },
	sourcev1.BucketKind:           func() artifactObject { return &sourcev1.Bucket{} },
	sourcev1.HelmChartKind:        func() artifactObject { return &sourcev1.HelmChart{} },
	sourcev1.ExternalArtifactKind: func() artifactObject { return &sourcev1.ExternalArtifact{} },
}

// artifactObject is a source object with an artifact in its status.
type artifactObject interface {
	client.Object
	GetArtifact() *meta.Artifact
}

// SetupWithManager registers the reconciler: it reacts to spec changes and
// reconcile requests of generators, to artifact changes of the objects
// they name, and to the deletion of their ExternalArtifacts.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, concurrency int) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &swv1beta1.ArtifactGenerator{}, sourceIndex, func(o client.Object) []string {
		g := o.(*swv1beta1.ArtifactGenerator)
		keys := make([]string, 0, len(g.Spec.Sources))
		for _, s := range g.Spec.Sources {
			keys = append(keys, sourceKey(s.Kind, namespaceOf(s, g), s.Name))
		}
		return keys
	}); err != nil {
		return fmt.Errorf("index generators by source: %w", err)
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("artifactgenerator").
		For(&swv1beta1.ArtifactGenerator{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicates.ReconcileRequestedPredicate{}))).
		Owns(&sourcev1.ExternalArtifact{}, builder.WithPredicates(deletedOnly{})).
		WithOptions(crcontroller.Options{MaxConcurrentReconciles: concurrency, NewQueue: r.NewQueue})
	for kind, newObj := range sourceKinds {
		b = b.Watches(newObj(), handler.EnqueueRequestsFromMapFunc(r.generatorsOf(kind)),
			builder.WithPredicates(sourcekind.ArtifactChanged{}))
	}
	return b.Complete(r)
}

// generatorsOf maps a source object of kind to the generators naming it.
func (r *Reconciler) generatorsOf(kind string) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		var list swv1beta1.ArtifactGeneratorList
		if err := r.Client.List(ctx, &list, client.MatchingFields{sourceIndex: sourceKey(kind, o.GetNamespace(), o.GetName())}); err != nil {
			logr.FromContextOrDiscard(ctx).Error(err, "listing the generators of a source", "kind", kind, "name", o.GetName())
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(list.Items))
		for _, g := range list.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: g.Namespace, Name: g.Name}})
		}
		return reqs
	}
}

// deletedOnly passes deletions: the watcher's own writes to the
// ExternalArtifacts it owns trigger nothing.
type deletedOnly struct{ predicate.Funcs }

func (deletedOnly) Create(event.CreateEvent) bool   { return false }
func (deletedOnly) Update(event.UpdateEvent) bool   { return false }
func (deletedOnly) Generic(event.GenericEvent) bool { return false }

func sourceKey(kind, namespace, name string) string { return kind + "/" + namespace + "/" + name }

func namespaceOf(s swv1beta1.SourceReference, g *swv1beta1.ArtifactGenerator) string {
	if s.Namespace != "" {
		return s.Namespace
	}
	return g.Namespace
}
