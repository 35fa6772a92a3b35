// Package filter decides which public events a Subscription selects: the
// NATS subjects its consumer is filtered by (kinds, namespaces and names
// map to subject tokens), and the exact match of each event (types and
// label selectors, which subjects cannot express).
package filter

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// maxSubjects bounds the filter subjects of one consumer: a selection that
// would need more (kinds x namespaces x names) is filtered by Match alone.
const maxSubjects = 64

// DefaultTypes are the event types of a Subscription that names none: the
// public types.
var DefaultTypes = []string{events.TypeArtifactStored, events.TypeArtifactUnchanged, events.TypeArtifactFailed, events.TypeArtifactDeleted}

// Filter is a Subscription's selection, ready to match events.
type Filter struct {
	kinds, namespaces, names, types []string
	selector                        labels.Selector
}

// New compiles a Subscription's selection; an error (a malformed label
// selector, an unknown type) makes the Subscription unservable.
func New(spec v1alpha1.SubscriptionSpec) (*Filter, error) {
	f := &Filter{
		namespaces: spec.Sources.Namespaces,
		names:      spec.Sources.Names,
		types:      spec.Types,
	}
	for _, k := range spec.Sources.Kinds {
		f.kinds = append(f.kinds, strings.ToLower(k))
	}
	if len(f.types) == 0 {
		f.types = DefaultTypes
	}
	for _, t := range f.types {
		if !slices.Contains(DefaultTypes, t) {
			return nil, fmt.Errorf("type %q is not a public event type (%s)", t, strings.Join(DefaultTypes, ", "))
		}
	}
	if spec.Sources.LabelSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(spec.Sources.LabelSelector)
		if err != nil {
			return nil, fmt.Errorf("label selector: %w", err)
		}
		f.selector = s
	}
	return f, nil
}

// Confine restricts the selection to the events of namespace, the
// Subscription's own, under -no-cross-namespace-refs: a Subscription that
// names no namespace sees its own namespace's events only; one that names
// another namespace is refused (the error, in notification-controller's
// words, is its AccessDenied message).
func (f *Filter) Confine(subscription types.NamespacedName) error {
	for _, ns := range f.namespaces {
		if ns != subscription.Namespace {
			return fmt.Errorf("subscription '%s' can't select events from namespace '%s', cross-namespace references have been blocked",
				subscription, ns)
		}
	}
	f.namespaces = []string{subscription.Namespace}
	return nil
}

// Subjects returns the subjects of the event stream the Subscription's
// consumer reads: one per combination of kind, namespace and name, "*"
// where the Subscription does not restrict, or every public subject when
// there would be more than maxSubjects.
func (f *Filter) Subjects() []string {
	or := func(v []string) []string {
		if len(v) == 0 {
			return []string{""}
		}
		return v
	}
	kinds, namespaces, names := or(f.kinds), or(f.namespaces), or(f.names)
	if len(kinds)*len(namespaces)*len(names) > maxSubjects {
		return []string{events.EventSubjectPrefix + ".>"}
	}
	var subjects []string
	for _, k := range kinds {
		for _, ns := range namespaces {
			for _, n := range names {
				subjects = append(subjects, events.SourceFilterSubject(k, ns, n))
			}
		}
	}
	slices.Sort(subjects)
	return slices.Compact(subjects)
}

// Match reports whether the Subscription selects an event of eventType
// about the object o.
func (f *Filter) Match(eventType string, o events.ObjectRef) bool {
	in := func(list []string, v string) bool { return len(list) == 0 || slices.Contains(list, v) }
	return in(f.types, eventType) &&
		in(f.kinds, strings.ToLower(o.Kind)) &&
		in(f.namespaces, o.Namespace) &&
		in(f.names, o.Name) &&
		(f.selector == nil || f.selector.Matches(labels.Set(o.Labels)))
}
