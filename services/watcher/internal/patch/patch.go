// Package patch is the watcher's one way to write the objects it
// reconciles: their status (sources, ArtifactGenerators,
// ExternalArtifacts, Subscriptions, Receivers), their finalizers, and the
// metadata and spec of the ExternalArtifacts it owns. Every write is a
// JSON merge patch of what a change made to the object, made by the field
// owner FieldOwner; nothing is written when the change changed nothing.
// What differs between writes (what a conflict does, whether the write
// records the object's generation as observed) is said by Options, as
// data, as fluxcd/pkg runtime/patch says it with its options.
package patch

import (
	"context"
	"fmt"
	"reflect"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// FieldOwner is the field manager of every write the watcher makes.
const FieldOwner = "headwater-watcher"

// MaxConflicts bounds the live re-reads of one write that conflicts
// (OnConflict Retry).
const MaxConflicts = 8

// OnConflict says what a write does about an object changed since it was
// read.
type OnConflict int

const (
	// ReturnConflict guards the write with the resourceVersion read and
	// returns the API server's Conflict (apierrors.IsConflict) when the
	// object changed since: the caller looks again on a fresh read. For
	// writes whose change depends on more than the object (a finalizer
	// list another controller may have added to, a job about to be
	// published).
	ReturnConflict OnConflict = iota
	// Retry guards the write with the resourceVersion read and, on a
	// Conflict, reads the object live (Writer.Live), makes the change
	// again and writes again, up to MaxConflicts times.
	Retry
	// Overwrite writes without a guard: the change wins. For status only
	// the watcher writes, from a change that depends on nothing the
	// object held.
	Overwrite
)

// Options say how one write is made; the zero value is a guarded write
// that returns a conflict.
type Options struct {
	// OnConflict says what the write does about an object changed since
	// it was read.
	OnConflict OnConflict
	// ObservedGeneration, with a status write that changes something,
	// sets status.observedGeneration to metadata.generation (Flux's
	// patch.WithStatusObservedGeneration): the status says the object's
	// spec as it is now was reconciled. Outcomes that conclude an earlier
	// generation (a job's) set the field themselves.
	ObservedGeneration bool
}

// Writer writes objects through Client, reading them again through Live
// after a conflict.
type Writer struct {
	// Client writes the objects (for a plug-in kind, a
	// sourcekind.PluginClient).
	Client client.Client
	// Live reads objects from the API server after a conflicting write
	// (OnConflict Retry); nil returns the conflict.
	Live client.Reader
}

// Status writes what change does to obj's status. change reports whether
// it changed anything worth writing; Status writes nothing when it did not,
// or when the object is as it was. With OnConflict Retry, obj is read
// again and change called again on the fresh object, so change must read
// obj anew each time. obj holds the written object afterwards.
func (w Writer) Status(ctx context.Context, obj client.Object, opts Options, change func() bool) error {
	err := w.write(ctx, obj, opts, change, func(before client.Object, patch client.Patch) error {
		if opts.ObservedGeneration {
			setObservedGeneration(obj)
		}
		if equality.Semantic.DeepEqual(before, obj) {
			return nil
		}
		return w.Client.Status().Patch(ctx, obj, patch, client.FieldOwner(FieldOwner))
	})
	if err != nil {
		return fmt.Errorf("patch status: %w", err)
	}
	return nil
}

// Object writes what change does to obj's metadata and spec (never its
// status), as Status writes its status.
func (w Writer) Object(ctx context.Context, obj client.Object, opts Options, change func() bool) error {
	err := w.write(ctx, obj, opts, change, func(before client.Object, patch client.Patch) error {
		if equality.Semantic.DeepEqual(before, obj) {
			return nil
		}
		return w.Client.Patch(ctx, obj, patch, client.FieldOwner(FieldOwner))
	})
	if err != nil {
		return fmt.Errorf("patch %s: %w", obj.GetName(), err)
	}
	return nil
}

// AddFinalizer adds finalizer to obj. The write is guarded by the
// resourceVersion read and returns a conflict: a merge patch replaces the
// whole finalizers list, so a finalizer another controller added since obj
// was read must not be lost; the reconcile is retried on a fresh read.
func (w Writer) AddFinalizer(ctx context.Context, obj client.Object, finalizer string) error {
	return w.Object(ctx, obj, Options{OnConflict: ReturnConflict}, func() bool {
		return controllerutil.AddFinalizer(obj, finalizer)
	})
}

// RemoveFinalizer removes finalizer from obj, guarded as AddFinalizer is.
func (w Writer) RemoveFinalizer(ctx context.Context, obj client.Object, finalizer string) error {
	return w.Object(ctx, obj, Options{OnConflict: ReturnConflict}, func() bool {
		return controllerutil.RemoveFinalizer(obj, finalizer)
	})
}

// Create creates obj.
func (w Writer) Create(ctx context.Context, obj client.Object) error {
	return w.Client.Create(ctx, obj, client.FieldOwner(FieldOwner))
}

// ResetStatus empties obj's status (a merge patch of status: null): what
// Flux leaves of an object it does not reconcile. Unguarded: an empty
// status is the same whatever the object held.
func (w Writer) ResetStatus(ctx context.Context, obj client.Object) error {
	if err := w.Client.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(`{"status":null}`)),
		client.FieldOwner(FieldOwner)); err != nil {
		return fmt.Errorf("reset status: %w", err)
	}
	return nil
}

// write runs change on obj and sends the patch from the copy before it
// (send), as opts say, re-reading obj and running change again after a
// conflict when they say Retry.
func (w Writer) write(ctx context.Context, obj client.Object, opts Options, change func() bool,
	send func(before client.Object, patch client.Patch) error) error {
	for attempt := 0; ; attempt++ {
		before := obj.DeepCopyObject().(client.Object)
		if !change() {
			return nil
		}
		var patch client.Patch
		if opts.OnConflict == Overwrite {
			patch = client.MergeFrom(before)
		} else {
			patch = client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
		}
		err := send(before, patch)
		if err == nil || !apierrors.IsConflict(err) || opts.OnConflict != Retry || w.Live == nil || attempt == MaxConflicts {
			return err
		}
		if err := w.Live.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return fmt.Errorf("re-read after conflict: %w", err)
		}
	}
}

// setObservedGeneration sets obj's status.observedGeneration (a field
// ObservedGeneration int64 of its Status struct, as every kind the watcher
// writes has one) to its generation. An object without one is left alone.
func setObservedGeneration(obj client.Object) {
	v := reflect.ValueOf(obj)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return
	}
	st := v.Elem().FieldByName("Status")
	if !st.IsValid() || st.Kind() != reflect.Struct {
		return
	}
	f := st.FieldByName("ObservedGeneration")
	if f.IsValid() && f.CanSet() && f.Kind() == reflect.Int64 {
		f.SetInt(obj.GetGeneration())
	}
}
