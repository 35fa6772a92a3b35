// Package externalartifact writes Flux's ExternalArtifact objects
// (source.toolkit.fluxcd.io/v1) for artifacts Headwater produces from
// objects other than the Flux source kinds: an ArtifactGenerator's outputs,
// a plug-in source's artifact. Flux's consumers (kustomize-controller,
// helm-controller with --feature-gates=ExternalArtifact=true) read an
// ExternalArtifact as they read a GitRepository: its status.artifact and
// Ready condition.
//
// The watcher is the only writer of the objects it produces: Write creates
// or updates one, with spec.sourceRef and an owner reference naming the
// producer (so Kubernetes collects it with its producer), and its status
// through the status subresource; Delete removes one its producer no
// longer wants. An ExternalArtifact of the same name that names another
// producer is never taken over (ErrForeign).
package externalartifact

import (
	"context"
	"errors"
	"fmt"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/watcher/internal/patch"
)

// The watcher's permissions on ExternalArtifacts, generated into
// deploy/base/rbac/watcher by `make manifests`.

// +kubebuilder:rbac:groups=source.toolkit.fluxcd.io,resources=externalartifacts,verbs=get;list;watch;create;patch;update;delete
// +kubebuilder:rbac:groups=source.toolkit.fluxcd.io,resources=externalartifacts/status,verbs=get;patch;update

// ErrForeign is wrapped by the error of Write and Delete for an
// ExternalArtifact whose spec.sourceRef names another producer: it is left
// alone.
var ErrForeign = errors.New("ExternalArtifact belongs to another producer")

// Condition is the Ready condition an ExternalArtifact is given, in Flux's
// terms: True with reason Succeeded and "stored artifact for revision
// '<revision>'" for a stored artifact (see Stored), False with the
// producer's failure reason otherwise (see Failed).
type Condition struct {
	// Status is True or False.
	Status metav1.ConditionStatus
	// Reason is Flux's reason, e.g. meta.SucceededReason or
	// "ValidationFailed".
	Reason string
	// Message is safe to show: it never contains credentials.
	Message string
}

// Stored is the Ready condition of an ExternalArtifact holding artifact,
// in Flux's words.
func Stored(artifact *meta.Artifact) Condition {
	return Condition{Status: metav1.ConditionTrue, Reason: meta.SucceededReason,
		Message: fmt.Sprintf("stored artifact for revision '%s'", artifact.Revision)}
}

// Failed is the Ready condition of an ExternalArtifact whose producer
// failed to produce a new artifact; the last one stays in status.
func Failed(reason, message string) Condition {
	return Condition{Status: metav1.ConditionFalse, Reason: reason, Message: message}
}

// Output is what a producer wants one ExternalArtifact to say.
type Output struct {
	// Name of the ExternalArtifact, in the producer's namespace.
	Name string
	// Artifact is the artifact to publish; nil keeps the one in status
	// (a failure leaves the last good artifact served).
	Artifact *meta.Artifact
	// Ready is the object's Ready condition.
	Ready Condition
	// Labels and Annotations are added to the object's metadata (e.g.
	// the ArtifactGenerator's label and commonMetadata); existing keys
	// are overwritten, others kept.
	Labels      map[string]string
	Annotations map[string]string
}

// Change says what Write did.
type Change string

const (
	// Created means the object did not exist.
	Created Change = "created"
	// Updated means its spec, metadata or status changed.
	Updated Change = "updated"
	// Unchanged means it already said what it should: nothing was written.
	Unchanged Change = "unchanged"
)

// Writer writes the ExternalArtifacts of producers.
type Writer struct {
	// Client reads and writes the objects; its scheme must know the
	// producers' kinds and sourcev1.
	Client client.Client
	// Metrics, when set, counts the writes.
	Metrics *Metrics
}

// SourceRef is the spec.sourceRef of the ExternalArtifacts producer makes.
// The producer's kind is the one its object names (a plug-in kind's,
// which no scheme knows), else the one the client's scheme gives its type.
func (w *Writer) SourceRef(producer client.Object) (*meta.NamespacedObjectKindReference, error) {
	gvk := producer.GetObjectKind().GroupVersionKind()
	if gvk.Kind == "" || gvk.Version == "" {
		var err error
		if gvk, err = apiutil.GVKForObject(producer, w.Client.Scheme()); err != nil {
			return nil, fmt.Errorf("producer kind: %w", err)
		}
	}
	return &meta.NamespacedObjectKindReference{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind,
		Name: producer.GetName(), Namespace: producer.GetNamespace()}, nil
}

// Write makes the ExternalArtifact out.Name in producer's namespace say
// what out says: spec.sourceRef naming producer, a controller owner
// reference to it, out's labels and annotations, status.artifact (unless
// out.Artifact is nil) and the Ready condition. It writes nothing when the
// object says so already. An object of that name produced by another
// object is left alone: the error wraps ErrForeign.
func (w *Writer) Write(ctx context.Context, producer client.Object, out Output) (*sourcev1.ExternalArtifact, Change, error) {
	ref, err := w.SourceRef(producer)
	if err != nil {
		return nil, "", err
	}
	owner := metav1.OwnerReference{APIVersion: ref.APIVersion, Kind: ref.Kind, Name: producer.GetName(),
		UID: producer.GetUID(), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
	key := types.NamespacedName{Namespace: producer.GetNamespace(), Name: out.Name}

	writer := patch.Writer{Client: w.Client}
	ea := &sourcev1.ExternalArtifact{}
	change := Unchanged
	err = w.Client.Get(ctx, key, ea)
	switch {
	case apierrors.IsNotFound(err):
		ea = &sourcev1.ExternalArtifact{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: out.Labels,
				Annotations: out.Annotations, OwnerReferences: []metav1.OwnerReference{owner}},
			Spec: sourcev1.ExternalArtifactSpec{SourceRef: ref},
		}
		if err := writer.Create(ctx, ea); err != nil {
			w.Metrics.count(ref.Kind, "error")
			return nil, "", fmt.Errorf("create ExternalArtifact %s: %w", key, err)
		}
		change = Created
	case err != nil:
		return nil, "", fmt.Errorf("get ExternalArtifact %s: %w", key, err)
	default:
		if !sameProducer(ea.Spec.SourceRef, ref) {
			return nil, "", fmt.Errorf("%w: %s is produced by %s", ErrForeign, key, describe(ea.Spec.SourceRef))
		}
		// Guarded, a conflict returned: the outcome is applied again on a
		// fresh read.
		rv := ea.ResourceVersion
		err := writer.Object(ctx, ea, patch.Options{OnConflict: patch.ReturnConflict}, func() bool {
			ea.Spec.SourceRef = ref
			ea.OwnerReferences = withOwner(ea.OwnerReferences, owner)
			ea.Labels = merged(ea.Labels, out.Labels)
			ea.Annotations = merged(ea.Annotations, out.Annotations)
			return true
		})
		if err != nil {
			w.Metrics.count(ref.Kind, "error")
			return nil, "", fmt.Errorf("update ExternalArtifact %s: %w", key, err)
		}
		if ea.ResourceVersion != rv {
			change = Updated
		}
	}

	// Unguarded: only the producer's outcome writes an ExternalArtifact's
	// status, and what it writes depends on the outcome alone.
	rv := ea.ResourceVersion
	err = writer.Status(ctx, ea, patch.Options{OnConflict: patch.Overwrite}, func() bool {
		if out.Artifact != nil {
			ea.Status.Artifact = out.Artifact.DeepCopy()
		}
		apimeta.SetStatusCondition(&ea.Status.Conditions, metav1.Condition{Type: meta.ReadyCondition, Status: out.Ready.Status,
			Reason: out.Ready.Reason, Message: out.Ready.Message, ObservedGeneration: ea.Generation})
		return true
	})
	if err != nil {
		w.Metrics.count(ref.Kind, "error")
		return nil, "", fmt.Errorf("ExternalArtifact %s: %w", key, err)
	}
	if ea.ResourceVersion != rv && change == Unchanged {
		change = Updated
	}
	w.Metrics.count(ref.Kind, string(change))
	return ea, change, nil
}

// Delete removes the ExternalArtifact name of producer's namespace if
// producer produced it; a missing object is not an error, one produced by
// another object is left alone (the error wraps ErrForeign).
func (w *Writer) Delete(ctx context.Context, producer client.Object, name string) error {
	ref, err := w.SourceRef(producer)
	if err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: producer.GetNamespace(), Name: name}
	ea := &sourcev1.ExternalArtifact{}
	if err := w.Client.Get(ctx, key, ea); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("get ExternalArtifact %s: %w", key, err)
	}
	if !sameProducer(ea.Spec.SourceRef, ref) {
		return fmt.Errorf("%w: %s is produced by %s", ErrForeign, key, describe(ea.Spec.SourceRef))
	}
	// Preconditioned on the UID read, so a re-created object of the same
	// name is not deleted in passing.
	if err := w.Client.Delete(ctx, ea, client.Preconditions{UID: &ea.UID}); err != nil && !apierrors.IsNotFound(err) {
		w.Metrics.count(ref.Kind, "error")
		return fmt.Errorf("delete ExternalArtifact %s: %w", key, err)
	}
	w.Metrics.count(ref.Kind, "deleted")
	return nil
}

// sameProducer tells whether an object's sourceRef names the producer ref
// describes (the API version may differ: a producer's API moves on).
func sameProducer(have, want *meta.NamespacedObjectKindReference) bool {
	if have == nil {
		return false
	}
	ns := have.Namespace
	if ns == "" {
		ns = want.Namespace
	}
	return have.Kind == want.Kind && have.Name == want.Name && ns == want.Namespace && group(have.APIVersion) == group(want.APIVersion)
}

// group is the API group of an apiVersion ("" for the core group).
func group(apiVersion string) string {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return apiVersion
	}
	return gv.Group
}

func describe(ref *meta.NamespacedObjectKindReference) string {
	if ref == nil {
		return "no producer (spec.sourceRef is empty)"
	}
	return fmt.Sprintf("%s %s/%s", ref.Kind, ref.Namespace, ref.Name)
}

// withOwner returns refs with owner as the controller reference: an
// existing reference to the same object is replaced, others kept.
func withOwner(refs []metav1.OwnerReference, owner metav1.OwnerReference) []metav1.OwnerReference {
	out := make([]metav1.OwnerReference, 0, len(refs)+1)
	for _, r := range refs {
		if r.UID == owner.UID || (r.Kind == owner.Kind && r.Name == owner.Name) {
			continue
		}
		out = append(out, r)
	}
	return append(out, owner)
}

// merged returns have with want's keys set; have is not modified.
func merged(have, want map[string]string) map[string]string {
	if len(want) == 0 {
		return have
	}
	out := make(map[string]string, len(have)+len(want))
	for k, v := range have {
		out[k] = v
	}
	for k, v := range want {
		out[k] = v
	}
	return out
}

// Metrics count the writes of ExternalArtifacts.
type Metrics struct {
	writes *prometheus.CounterVec
}

// NewMetrics registers headwater_externalartifact_writes_total on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{writes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Name: "externalartifact_writes_total",
		Help: "ExternalArtifacts written by the watcher, by producer kind and result (created, updated, unchanged, deleted, error).",
	}, []string{"producer", "result"})}
	reg.MustRegister(m.writes)
	return m
}

func (m *Metrics) count(producer, result string) {
	if m == nil {
		return
	}
	m.writes.WithLabelValues(producer, result).Inc()
}
