package status

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/services/watcher/internal/source"
)

// FieldOwner is the field manager of every write the watcher makes.
const FieldOwner = "headwater-watcher"

// maxConflicts bounds the re-reads after conflicting writes.
const maxConflicts = 8

// Patch changes obj's status with mutate, derives Ready from the result
// (Summarize) and writes it in one request: a merge patch guarded by the
// object's resourceVersion. obj usually comes
// from the informer cache; when it was stale, or another write came first,
// the API server answers Conflict and Patch reads the object live and
// applies mutate again. mutate reports whether it changed anything worth
// writing; Patch writes nothing when it did not. obj holds the written
// object afterwards.
//
// One request per status change, where Flux's patch helper makes two (one
// for conditions, one for the rest): at thousands of sources, API writes
// are what the control plane spends its CPU on.
func Patch(ctx context.Context, c client.Client, live client.Reader, kind source.Kind, obj source.Object,
	mutate func(source.Object) bool) error {
	for attempt := 0; ; attempt++ {
		before := obj.DeepCopyObject().(source.Object)
		if !mutate(obj) {
			return nil
		}
		Summarize(kind, obj)
		if equality.Semantic.DeepEqual(before, obj) {
			return nil
		}
		err := c.Status().Patch(ctx, obj, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}),
			client.FieldOwner(FieldOwner))
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) || attempt == maxConflicts {
			return fmt.Errorf("patch status: %w", err)
		}
		if err := live.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return fmt.Errorf("patch status: re-read after conflict: %w", err)
		}
	}
}
