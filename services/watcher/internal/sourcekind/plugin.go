package sourcekind

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// DefaultPluginInterval is the interval of a plug-in kind's object whose
// interval field is missing or not a duration.
const DefaultPluginInterval = 10 * time.Minute

// Registration is a plug-in source kind as the watcher is configured with
// it (-plugin-kinds): its group, version and kind, and the spec field that
// holds its interval. Everything else follows Headwater's conventions for
// a source kind: spec.suspend (a boolean), and status.conditions,
// status.artifact (Flux's meta.Artifact), status.observedGeneration and
// status.lastHandledReconcileAt as Flux's kinds have them. The whole spec
// travels in the fetch job (events.FetchRequested.Plugin).
type Registration struct {
	// GVK is the kind's group, version and kind.
	GVK schema.GroupVersionKind
	// IntervalField is the name of the spec field holding the interval
	// (a Go duration, as Flux's spec.interval); "interval" by default.
	IntervalField string
}

// String is the registration in the form ParseRegistrations reads.
func (r Registration) String() string {
	s := r.GVK.GroupVersion().String() + "/" + r.GVK.Kind
	if r.IntervalField != "" && r.IntervalField != "interval" {
		s += ":" + r.IntervalField
	}
	return s
}

// ParseRegistrations reads a comma-separated list of plug-in kinds, each
// "<group>/<version>/<Kind>" with an optional ":<interval field>" (e.g.
// "source.headwater.dev/v1alpha1/HTTPSource"). A kind named twice, or the
// name of a built-in kind, is refused: kinds are told apart by name on the
// bus.
func ParseRegistrations(list string) ([]Registration, error) {
	var regs []Registration
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		spec, field, _ := strings.Cut(item, ":")
		parts := strings.Split(spec, "/")
		if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
			return nil, fmt.Errorf("plug-in kind %q: want <group>/<version>/<Kind>[:<interval field>]", item)
		}
		if field == "" {
			field = "interval"
		}
		r := Registration{GVK: schema.GroupVersionKind{Group: parts[0], Version: parts[1], Kind: parts[2]}, IntervalField: field}
		if _, builtin := ByName(r.GVK.Kind); builtin {
			return nil, fmt.Errorf("plug-in kind %q: %s is a built-in kind", item, r.GVK.Kind)
		}
		if slices.ContainsFunc(regs, func(o Registration) bool { return strings.EqualFold(o.GVK.Kind, r.GVK.Kind) }) {
			return nil, fmt.Errorf("plug-in kind %q: kind %s registered twice", item, r.GVK.Kind)
		}
		regs = append(regs, r)
	}
	return regs, nil
}

// Plugin adapts a registered plug-in kind: the watcher reconciles its
// objects as PluginObjects, with Flux's generic messages and conditions,
// and fetches them through a plug-in fetcher (events.PluginIdentity).
func Plugin(reg Registration) Kind {
	gvk := reg.GVK
	return Kind{
		Name:           gvk.Kind,
		Plugin:         &reg,
		ReadyFormat:    "stored artifact for revision '%s'",
		UpToDateReason: sourcev1.ArtifactUpToDateReason,
		Conditions: []string{
			sourcev1.StorageOperationFailedCondition,
			sourcev1.FetchFailedCondition,
			sourcev1.ArtifactOutdatedCondition,
		},
		Adapter: Adapt(Funcs[*PluginObject]{
			New: func() *PluginObject { return NewPluginObject(reg) },
			Status: func(p *PluginObject) Status {
				return Status{&p.Status.ObservedGeneration, &p.Status.Artifact, &p.Status.LastHandledReconcileAt}
			},
			Suspended: func(p *PluginObject) bool {
				var s struct {
					Suspend bool `json:"suspend"`
				}
				_ = json.Unmarshal(p.Spec, &s)
				return s.Suspend
			},
			Request: func(_ context.Context, _ client.Reader, p *PluginObject, req *events.FetchRequested) (bool, error) {
				spec := bytes.Clone(p.Spec)
				if len(spec) == 0 {
					spec = json.RawMessage("{}")
				}
				req.Plugin = &events.PluginSpec{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind, Spec: spec}
				// The spec is opaque to the watcher: any change of it may
				// change the content, so the first job of a new generation
				// rebuilds the artifact even if the revision is the same.
				return p.Status.Artifact != nil && p.Generation != p.Status.ObservedGeneration, nil
			},
		}),
	}
}

// PluginObject is an object of a plug-in kind as the watcher sees it: its
// metadata, its spec as JSON, and the status fields every source has. It
// is read and written through a PluginClient, which converts it from and
// to the unstructured object the API server and the informer cache hold;
// status fields of the kind's own are left as they are (status is written
// with merge patches of what changed).
type PluginObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// Spec is the object's spec, as JSON.
	Spec json.RawMessage `json:"spec,omitempty"`
	// Status holds the status fields the watcher writes.
	Status PluginStatus `json:"status,omitempty"`

	// IntervalField names the spec field holding the interval (the
	// kind's Registration.IntervalField); not part of the object.
	IntervalField string `json:"-"`
}

// PluginStatus is the part of a plug-in kind's status the watcher writes,
// the same fields as a Flux source's.
type PluginStatus struct {
	// ObservedGeneration is the last generation reconciled.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions are Flux's source conditions (Ready, Reconciling,
	// Stalled, ArtifactInStorage, FetchFailed, ...).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Artifact is the last artifact stored.
	Artifact *meta.Artifact `json:"artifact,omitempty"`
	// LastHandledReconcileAt is the last reconcile request handled.
	LastHandledReconcileAt string `json:"lastHandledReconcileAt,omitempty"`
}

var _ Object = (*PluginObject)(nil)

// NewPluginObject returns an empty object of reg's kind.
func NewPluginObject(reg Registration) *PluginObject {
	p := &PluginObject{IntervalField: reg.IntervalField}
	p.SetGroupVersionKind(reg.GVK)
	return p
}

// GetConditions returns status.conditions.
func (p *PluginObject) GetConditions() []metav1.Condition { return p.Status.Conditions }

// SetConditions sets status.conditions.
func (p *PluginObject) SetConditions(c []metav1.Condition) { p.Status.Conditions = c }

// GetArtifact returns status.artifact.
func (p *PluginObject) GetArtifact() *meta.Artifact { return p.Status.Artifact }

// GetRequeueAfter returns the spec's interval, DefaultPluginInterval when
// it has none or it is not a positive duration.
func (p *PluginObject) GetRequeueAfter() time.Duration {
	var spec map[string]json.RawMessage
	if json.Unmarshal(p.Spec, &spec) != nil {
		return DefaultPluginInterval
	}
	field := p.IntervalField
	if field == "" {
		field = "interval"
	}
	var s string
	if json.Unmarshal(spec[field], &s) != nil {
		return DefaultPluginInterval
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return DefaultPluginInterval
	}
	return d
}

// DeepCopyObject returns a deep copy, as runtime.Object asks.
func (p *PluginObject) DeepCopyObject() runtime.Object {
	out := &PluginObject{TypeMeta: p.TypeMeta, Spec: bytes.Clone(p.Spec), IntervalField: p.IntervalField}
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Status = PluginStatus{ObservedGeneration: p.Status.ObservedGeneration, LastHandledReconcileAt: p.Status.LastHandledReconcileAt}
	if p.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(p.Status.Conditions))
		for i := range p.Status.Conditions {
			p.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
	if p.Status.Artifact != nil {
		out.Status.Artifact = p.Status.Artifact.DeepCopy()
	}
	return out
}
