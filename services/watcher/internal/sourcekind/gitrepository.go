package sourcekind

import (
	"context"
	"fmt"
	"path"
	"reflect"
	"strings"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// includeIndex indexes GitRepositories by the names of those they include.
const includeIndex = ".spec.include.repository.name"

// GitRepository adapts sourcev1.GitRepository.
func GitRepository() Kind {
	return Kind{
		Name:               sourcev1.GitRepositoryKind,
		ReadyFormat:        "stored artifact for revision '%s'",
		UpToDateReason:     sourcev1.GitOperationSucceedReason,
		TracesVerification: true,
		// Flux's order (gitRepositoryReadyCondition), but a failed
		// verification is named before the outdated artifact it causes.
		Conditions: []string{
			sourcev1.StorageOperationFailedCondition,
			sourcev1.FetchFailedCondition,
			sourcev1.IncludeUnavailableCondition,
			sourcev1.SourceVerifiedCondition,
			sourcev1.ArtifactOutdatedCondition,
		},
		Adapter: Adapt(Funcs[*sourcev1.GitRepository]{
			New: func() *sourcev1.GitRepository { return &sourcev1.GitRepository{} },
			Status: func(g *sourcev1.GitRepository) Status {
				return Status{&g.Status.ObservedGeneration, &g.Status.Artifact, &g.Status.LastHandledReconcileAt}
			},
			Suspended: func(g *sourcev1.GitRepository) bool { return g.Spec.Suspend },
			Remote: func(g *sourcev1.GitRepository) string {
				s := g.Spec
				return RemoteKey(g, s.URL, localRef(s.SecretRef), localRef(s.ProxySecretRef), s.Provider, s.ServiceAccountName)
			},
			Request: gitRequest,
			Setup:   gitSetup,
			Observe: func(g *sourcev1.GitRepository) {
				g.Status.ObservedIgnore = g.Spec.Ignore
				g.Status.ObservedRecurseSubmodules = g.Spec.RecurseSubmodules
				g.Status.ObservedInclude = g.Spec.Include
				g.Status.ObservedSparseCheckout = g.Spec.SparseCheckout
			},
			Record: gitRecord,
			// Flux names the commit by its reference when it did not clone.
			Recovered: func(_ *sourcev1.GitRepository, art *meta.Artifact) string {
				return fmt.Sprintf("stored artifact for commit '%s'", art.Revision)
			},
		}),
	}
}

// gitRequest copies the spec, resolves spec.include to the included
// sources' artifacts, and forces a rebuild when what the artifact is built
// from changed although the commit may not have: the observed spec fields,
// the included artifacts, or the verification mode.
func gitRequest(ctx context.Context, r client.Reader, g *sourcev1.GitRepository, req *events.FetchRequested) (bool, error) {
	if err := refuseCredentials("spec.url", g.Spec.URL); err != nil {
		return false, err
	}
	req.GitRepository = g.Spec.DeepCopy()
	includes, err := resolveIncludes(ctx, r, g)
	if err != nil {
		return false, err
	}
	req.Includes = includes
	if g.Status.Artifact == nil {
		return false, nil
	}
	return !gitContentObserved(g) || includesChanged(includes, g.Status.IncludedArtifacts) || verifyModeChanged(g), nil
}

// resolveIncludes returns the artifacts spec.include names, in order, or a
// waiting failure with Flux's reasons: NotFound and NoArtifact (wait for the
// included source), IllegalPath and IncludeCycle (stalled until the spec
// changes).
func resolveIncludes(ctx context.Context, r client.Reader, g *sourcev1.GitRepository) ([]events.Include, error) {
	if len(g.Spec.Include) == 0 {
		return nil, nil
	}
	if cycle := includeCycle(ctx, r, g); cycle != nil {
		return nil, waiting(sourcev1.IncludeUnavailableCondition, "IncludeCycle", true,
			"include cycle detected: %s", strings.Join(cycle, " -> "))
	}
	out := make([]events.Include, 0, len(g.Spec.Include))
	for _, incl := range g.Spec.Include {
		name := incl.GitRepositoryRef.Name
		to, from := incl.GetToPath(), incl.GetFromPath()
		if !safeIncludePath(to) || !safeIncludePath(from) {
			return nil, waiting(sourcev1.IncludeUnavailableCondition, "IllegalPath", true,
				"path calculation for include '%s' failed: paths must be relative and stay inside the artifact (fromPath %q, toPath %q)",
				name, from, to)
		}
		var dep sourcev1.GitRepository
		if err := r.Get(ctx, types.NamespacedName{Namespace: g.Namespace, Name: name}, &dep); err != nil {
			if !apierrors.IsNotFound(err) {
				return nil, err
			}
			return nil, waiting(sourcev1.IncludeUnavailableCondition, "NotFound", false,
				"could not get resource for include '%s': %s", name, err.Error())
		}
		if dep.Status.Artifact == nil {
			return nil, waiting(sourcev1.IncludeUnavailableCondition, "NoArtifact", false,
				"no artifact available for include '%s'", name)
		}
		out = append(out, events.Include{Name: name, Artifact: *dep.Status.Artifact.DeepCopy(),
			FromPath: strings.Trim(path.Clean("/"+from), "/"), ToPath: strings.Trim(path.Clean("/"+to), "/")})
	}
	return out, nil
}

// includeCycle follows spec.include from g and returns the first cycle back
// to g as a list of names, or nil. Sources that do not exist yet end a path.
func includeCycle(ctx context.Context, r client.Reader, g *sourcev1.GitRepository) []string {
	visited := map[string]bool{}
	var walk func(name string, trail []string) []string
	walk = func(name string, trail []string) []string {
		var cur sourcev1.GitRepository
		if err := r.Get(ctx, types.NamespacedName{Namespace: g.Namespace, Name: name}, &cur); err != nil {
			return nil
		}
		for _, incl := range cur.Spec.Include {
			next := incl.GitRepositoryRef.Name
			if next == g.Name {
				return append(trail, next)
			}
			if visited[next] {
				continue
			}
			visited[next] = true
			if c := walk(next, append(trail, next)); c != nil {
				return c
			}
		}
		return nil
	}
	return walk(g.Name, []string{g.Name})
}

// safeIncludePath accepts relative paths that do not climb out.
func safeIncludePath(p string) bool {
	if strings.HasPrefix(p, "/") || strings.Contains(p, "\\") {
		return false
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return false
		}
	}
	return true
}

func includesChanged(now []events.Include, built []*meta.Artifact) bool {
	if len(now) != len(built) {
		return true
	}
	for i := range now {
		if built[i] == nil || built[i].Digest != now[i].Artifact.Digest {
			return true
		}
	}
	return false
}

// verifyModeChanged reports whether spec.verify asks for more than the
// stored artifact was verified with: TagAndHEAD covers HEAD and Tag.
func verifyModeChanged(g *sourcev1.GitRepository) bool {
	if g.Spec.Verification == nil {
		return false
	}
	done := g.Status.SourceVerificationMode
	if done == nil {
		return true
	}
	return *done != g.Spec.Verification.GetMode() && *done != sourcev1.ModeGitTagAndHEAD
}

// gitRecord writes status.includedArtifacts, SourceVerified and
// status.sourceVerificationMode from an outcome.
//
// SourceVerified (normal polarity) is True with Flux's message once the
// signatures required by spec.verify checked out, False with reason
// VerificationError when they did not, and absent when spec.verify is unset.
func gitRecord(g *sourcev1.GitRepository, eventType string, out *events.Outcome) {
	if eventType == events.TypeArtifactStored && out.Job.Object.Generation == g.Generation {
		g.Status.IncludedArtifacts = out.IncludedArtifacts
	}
	if g.Spec.Verification == nil {
		conditions.Delete(g, sourcev1.SourceVerifiedCondition)
		g.Status.SourceVerificationMode = nil
		return
	}
	v := out.Verification
	if v == nil {
		return
	}
	if v.Verified {
		conditions.MarkTrue(g, sourcev1.SourceVerifiedCondition, v.Reason, "%s", v.Message)
		mode := sourcev1.GitVerificationMode(v.Mode)
		g.Status.SourceVerificationMode = &mode
	} else {
		conditions.MarkFalse(g, sourcev1.SourceVerifiedCondition, v.Reason, "%s", v.Message)
	}
}

// gitSetup indexes GitRepositories by what they include, and reconciles the
// includers of a GitRepository whose artifact changed, so they are rebuilt
// with the new content (or stop waiting for it).
func gitSetup(ctx context.Context, mgr ctrl.Manager, b *builder.Builder) error {
	err := mgr.GetFieldIndexer().IndexField(ctx, &sourcev1.GitRepository{}, includeIndex, func(o client.Object) []string {
		g := o.(*sourcev1.GitRepository)
		names := make([]string, 0, len(g.Spec.Include))
		for _, incl := range g.Spec.Include {
			names = append(names, incl.GitRepositoryRef.Name)
		}
		return names
	})
	if err != nil {
		return fmt.Errorf("index %s: %w", includeIndex, err)
	}
	c := mgr.GetClient()
	includers := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var list sourcev1.GitRepositoryList
		if err := c.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{includeIndex: o.GetName()}); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing includers", "name", o.GetName())
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(list.Items))
		for i := range list.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
		return reqs
	})
	b.Watches(&sourcev1.GitRepository{}, includers, builder.WithPredicates(ArtifactChanged{}))
	return nil
}

// ArtifactChanged passes updates that change an object's artifact digest,
// and creations and deletions (a source appearing or going): a status
// write that leaves the artifact alone (a condition,
// lastHandledReconcileAt, the artifact's URL) triggers nothing. It serves
// every object with an artifact in its status, ExternalArtifacts included.
type ArtifactChanged struct{ predicate.Funcs }

// Update implements predicate.Predicate.
func (ArtifactChanged) Update(e event.UpdateEvent) bool {
	type artifactObject interface{ GetArtifact() *meta.Artifact }
	oldObj, ok1 := e.ObjectOld.(artifactObject)
	newObj, ok2 := e.ObjectNew.(artifactObject)
	if !ok1 || !ok2 {
		return false
	}
	oa, na := oldObj.GetArtifact(), newObj.GetArtifact()
	if oa == nil || na == nil {
		return oa != na
	}
	return oa.Digest != na.Digest
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
