package generator

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/compose"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// problem is why a generator cannot be built now: its Ready reason and
// message, and whether only a spec change helps (stalled).
type problem struct {
	reason, message string
	stalled         bool
}

func (p *problem) Error() string { return p.message }

// resolved are a generator's sources with their artifacts, and their
// digest (as source-watcher's observedSourcesDigest, with the generator's
// generation: a spec change is a new job).
type resolved struct {
	list   []events.GeneratorSource
	digest string
}

// resolve checks the spec, looks for a dependency cycle and reads every
// source's artifact. Its error is a *problem, or the API server's.
func (r *Reconciler) resolve(ctx context.Context, gen *swv1beta1.ArtifactGenerator) (*resolved, error) {
	if err := compose.Validate(&gen.Spec); err != nil {
		return nil, &problem{reason: swv1beta1.ValidationFailedReason, message: err.Error(), stalled: true}
	}
	// Before anything of another namespace is read (the cycle check
	// follows ExternalArtifacts), so a refused generator learns nothing.
	if err := r.checkNamespaces(gen); err != nil {
		return nil, err
	}
	if err := r.checkCycle(ctx, gen); err != nil {
		return nil, err
	}
	for _, a := range gen.Spec.OutputArtifacts {
		if gen.Spec.PathPattern != "" {
			// Names are templates: the packager checks the names they
			// make against the job's Foreign.
			break
		}
		ea := &sourcev1.ExternalArtifact{}
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: gen.Namespace, Name: a.Name}, ea)
		if err == nil && !r.producedBy(ea, gen) {
			return nil, &problem{reason: swv1beta1.ValidationFailedReason, stalled: true,
				message: fmt.Sprintf("artifact %q: ExternalArtifact %s/%s belongs to another producer", a.Name, gen.Namespace, a.Name)}
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	res := &resolved{}
	observed := map[string]swv1beta1.ObservedSource{}
	for _, s := range gen.Spec.Sources {
		newObj, ok := sourceKinds[s.Kind]
		if !ok {
			return nil, &problem{reason: swv1beta1.ValidationFailedReason, stalled: true,
				message: fmt.Sprintf("source %q: unsupported kind %q", s.Alias, s.Kind)}
		}
		obj := newObj()
		key := types.NamespacedName{Namespace: namespaceOf(s, gen), Name: s.Name}
		if err := r.Client.Get(ctx, key, obj); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, &problem{reason: swv1beta1.SourceFetchFailedReason,
					message: fmt.Sprintf("source %q: %s %s not found", s.Alias, s.Kind, key)}
			}
			return nil, fmt.Errorf("get source %s %s: %w", s.Kind, key, err)
		}
		a := obj.GetArtifact()
		if a == nil || a.Path == "" {
			return nil, &problem{reason: swv1beta1.SourceFetchFailedReason,
				message: fmt.Sprintf("source %q: %s %s has no artifact yet", s.Alias, s.Kind, key)}
		}
		res.list = append(res.list, events.GeneratorSource{Alias: s.Alias, Kind: s.Kind, Namespace: key.Namespace, Name: key.Name, Artifact: *a.DeepCopy()})
		observed[s.Alias] = swv1beta1.ObservedSource{Digest: a.Digest, Revision: a.Revision, URL: a.URL,
			OriginRevision: a.Metadata[swv1beta1.ArtifactOriginRevisionAnnotation]}
	}
	h := sha256.Sum256(fmt.Appendf(nil, "%s|generation=%d", swv1beta1.HashObservedSources(observed), gen.Generation))
	res.digest = fmt.Sprintf("sha256:%x", h)
	return res, nil
}

// checkNamespaces refuses, under NoCrossNamespaceRefs, a source in
// another namespace than the generator's, in source-watcher's words.
func (r *Reconciler) checkNamespaces(gen *swv1beta1.ArtifactGenerator) error {
	if !r.NoCrossNamespaceRefs {
		return nil
	}
	for _, s := range gen.Spec.Sources {
		if ns := namespaceOf(s, gen); ns != gen.Namespace {
			return &problem{reason: swv1beta1.AccessDeniedReason, stalled: true,
				message: fmt.Sprintf("cross-namespace reference to source %s/%s/%s is not allowed", s.Kind, ns, s.Name)}
		}
	}
	return nil
}

// producedBy tells whether ea's spec.sourceRef names gen.
func (r *Reconciler) producedBy(ea *sourcev1.ExternalArtifact, gen *swv1beta1.ArtifactGenerator) bool {
	ref := ea.Spec.SourceRef
	if ref == nil {
		return false
	}
	ns := ref.Namespace
	if ns == "" {
		ns = ea.Namespace
	}
	return ref.Kind == swv1beta1.ArtifactGeneratorKind && ref.Name == gen.Name && ns == gen.Namespace
}

// published returns the outputs the generator's ExternalArtifacts hold now
// (the job's previous outputs), and whether every output of the spec (with
// a pathPattern, of the inventory) is published by an ExternalArtifact of
// this generator.
func (r *Reconciler) published(ctx context.Context, gen *swv1beta1.ArtifactGenerator) ([]events.GeneratedOutput, bool) {
	complete := true
	want := map[string]bool{}
	for _, a := range gen.Spec.OutputArtifacts {
		want[a.Name] = true
	}
	if gen.Spec.PathPattern != "" {
		// The outputs are those the last outcome made from the templates.
		clear(want)
		for _, ref := range gen.Status.Inventory {
			want[ref.Name] = true
		}
	}
	var out []events.GeneratedOutput
	names := map[string]bool{}
	for _, ref := range gen.Status.Inventory {
		names[ref.Name] = true
	}
	for name := range want {
		names[name] = true
	}
	for _, name := range slices.Sorted(mapsKeys(names)) {
		ea := &sourcev1.ExternalArtifact{}
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: gen.Namespace, Name: name}, ea)
		if err != nil || !r.producedBy(ea, gen) || ea.Status.Artifact == nil {
			if want[name] {
				complete = false
			}
			if err == nil || !slices.ContainsFunc(gen.Status.Inventory, func(i swv1beta1.ExternalArtifactReference) bool { return i.Name == name }) {
				continue
			}
			// Its ExternalArtifact is gone but its files are stored: the
			// job removes them when the output is no longer wanted.
			out = append(out, events.GeneratedOutput{Name: name})
			continue
		}
		a := *ea.Status.Artifact.DeepCopy()
		a.URL = ""
		out = append(out, events.GeneratedOutput{Name: name, Artifact: a})
	}
	return out, complete
}

func mapsKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// foreign returns, for a generator with a pathPattern, the names of the
// ExternalArtifacts of its namespace that another producer owns: the
// packager refuses an output the pattern names so.
func (r *Reconciler) foreign(ctx context.Context, gen *swv1beta1.ArtifactGenerator) ([]string, error) {
	if gen.Spec.PathPattern == "" {
		return nil, nil
	}
	list := &sourcev1.ExternalArtifactList{}
	if err := r.Client.List(ctx, list, client.InNamespace(gen.Namespace)); err != nil {
		return nil, fmt.Errorf("list ExternalArtifacts: %w", err)
	}
	var names []string
	for i := range list.Items {
		if !r.producedBy(&list.Items[i], gen) {
			names = append(names, list.Items[i].Name)
		}
	}
	slices.Sort(names)
	return names, nil
}
