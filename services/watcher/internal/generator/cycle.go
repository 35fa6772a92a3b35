package generator

import (
	"context"
	"fmt"
	"slices"
	"strings"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
)

const (
	// reasonCycle is the message prefix of a dependency cycle.
	reasonCycle = "circular dependency"
	// cycleDepth bounds the generators followed looking for a cycle.
	cycleDepth = 32
)

// checkCycle follows the generator's ExternalArtifact sources to the
// generators that produce them, and theirs, and fails when it comes back
// to gen: a generator whose output feeds itself would rebuild forever.
func (r *Reconciler) checkCycle(ctx context.Context, gen *swv1beta1.ArtifactGenerator) error {
	self := types.NamespacedName{Namespace: gen.Namespace, Name: gen.Name}
	seen := map[types.NamespacedName]bool{}
	var walk func(g *swv1beta1.ArtifactGenerator, path []string, depth int) error
	walk = func(g *swv1beta1.ArtifactGenerator, path []string, depth int) error {
		if depth > cycleDepth {
			return nil
		}
		for _, s := range g.Spec.Sources {
			if s.Kind != sourcev1.ExternalArtifactKind {
				continue
			}
			key := types.NamespacedName{Namespace: namespaceOf(s, g), Name: s.Name}
			via := append(slices.Clone(path), fmt.Sprintf("ExternalArtifact %s", key))
			// An output of the generator itself, published or not yet.
			if key.Namespace == gen.Namespace && slices.ContainsFunc(gen.Spec.OutputArtifacts,
				func(a swv1beta1.OutputArtifact) bool { return a.Name == key.Name }) {
				return &problem{reason: swv1beta1.ValidationFailedReason, stalled: true,
					message: fmt.Sprintf("%s: %s -> ArtifactGenerator %s", reasonCycle, strings.Join(via, " -> "), self)}
			}
			ea := &sourcev1.ExternalArtifact{}
			if err := r.Client.Get(ctx, key, ea); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return fmt.Errorf("get ExternalArtifact %s: %w", key, err)
			}
			ref := ea.Spec.SourceRef
			if ref == nil || ref.Kind != swv1beta1.ArtifactGeneratorKind {
				continue
			}
			producer := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
			if producer.Namespace == "" {
				producer.Namespace = ea.Namespace
			}
			via = append(via, fmt.Sprintf("ArtifactGenerator %s", producer))
			if producer == self {
				return &problem{reason: swv1beta1.ValidationFailedReason, stalled: true,
					message: fmt.Sprintf("%s: %s", reasonCycle, strings.Join(via, " -> "))}
			}
			if seen[producer] {
				continue
			}
			seen[producer] = true
			next := &swv1beta1.ArtifactGenerator{}
			if err := r.Client.Get(ctx, producer, next); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return fmt.Errorf("get ArtifactGenerator %s: %w", producer, err)
			}
			if err := walk(next, via, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(gen, []string{fmt.Sprintf("ArtifactGenerator %s", self)}, 0)
}
