package source

import (
	"fmt"
	"reflect"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// GitRepository adapts sourcev1.GitRepository.
func GitRepository() Kind {
	return Kind{
		Name:      sourcev1.GitRepositoryKind,
		New:       func() Object { return &sourcev1.GitRepository{} },
		Suspended: func(o Object) bool { return o.(*sourcev1.GitRepository).Spec.Suspend },
		Request: func(o Object, req *events.FetchRequested) bool {
			g := o.(*sourcev1.GitRepository)
			req.GitRepository = g.Spec.DeepCopy()
			return g.Status.Artifact != nil && !gitContentObserved(g)
		},
		Observe: func(o Object) {
			g := o.(*sourcev1.GitRepository)
			g.Status.ObservedIgnore = g.Spec.Ignore
			g.Status.ObservedRecurseSubmodules = g.Spec.RecurseSubmodules
			g.Status.ObservedInclude = g.Spec.Include
			g.Status.ObservedSparseCheckout = g.Spec.SparseCheckout
		},
		ReadyMessage: func(revision string) string {
			return fmt.Sprintf("stored artifact for revision '%s'", revision)
		},
		UpToDateReason: sourcev1.GitOperationSucceedReason,
		Status: func(o Object) Status {
			g := o.(*sourcev1.GitRepository)
			return Status{
				ObservedGeneration:     &g.Status.ObservedGeneration,
				Artifact:               &g.Status.Artifact,
				LastHandledReconcileAt: &g.Status.LastHandledReconcileAt,
			}
		},
		FailureConditions: []string{
			sourcev1.FetchFailedCondition,
			sourcev1.StorageOperationFailedCondition,
			sourcev1.ArtifactOutdatedCondition,
			sourcev1.IncludeUnavailableCondition,
		},
	}
}

// gitContentObserved reports whether the stored artifact was built with the
// spec's current content-affecting fields, as Flux's observed* status fields
// record them.
func gitContentObserved(g *sourcev1.GitRepository) bool {
	s, st := g.Spec, g.Status
	return reflect.DeepEqual(s.Ignore, st.ObservedIgnore) &&
		s.RecurseSubmodules == st.ObservedRecurseSubmodules &&
		equalOrEmpty(s.Include, st.ObservedInclude) &&
		equalOrEmpty(s.SparseCheckout, st.ObservedSparseCheckout)
}

func equalOrEmpty[T any](a, b []T) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return reflect.DeepEqual(a, b)
}
