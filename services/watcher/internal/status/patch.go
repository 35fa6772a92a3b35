package status

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/services/watcher/internal/patch"
	"github.com/headwater-gitops/headwater/services/watcher/internal/sourcekind"
)

// FieldOwner is the field manager of every write the watcher makes
// (patch.FieldOwner).
const FieldOwner = patch.FieldOwner

// Patch changes obj's status with mutate, derives Ready from the result
// (Summarize) and writes it in one request through the watcher's writer
// (package patch): a merge patch guarded by the object's resourceVersion.
// obj usually comes from the informer cache; when it was stale, or another
// write came first, the API server answers Conflict and Patch reads the
// object live and applies mutate again. mutate reports whether it changed
// anything worth writing; Patch writes nothing when it did not. obj holds
// the written object afterwards.
//
// One request per status change, where Flux's patch helper makes two (one
// for conditions, one for the rest): at thousands of sources, API writes
// are what the control plane spends its CPU on.
func Patch(ctx context.Context, c client.Client, live client.Reader, kind sourcekind.Kind, obj sourcekind.Object,
	mutate func(sourcekind.Object) bool) error {
	w := patch.Writer{Client: c, Live: live}
	return w.Status(ctx, obj, patch.Options{OnConflict: patch.Retry}, func() bool {
		if !mutate(obj) {
			return false
		}
		Summarize(kind, obj)
		return true
	})
}
