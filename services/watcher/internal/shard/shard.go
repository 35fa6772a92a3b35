// Package shard is the watcher's share of the sources when watchers are
// sharded the way Flux's source-controller is (Flux's sharding docs): a
// label selector (-watch-label-selector) and the namespaces watched
// (-watch-all-namespaces) choose the source objects a watcher's cache
// holds, and the shard's identity names its leader election lease and its
// consumer of the public events, so that two shards never share either.
package shard

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	fluxcontroller "github.com/fluxcd/pkg/runtime/controller"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Flag names, as Flux's (fluxcd/pkg/runtime/controller.WatchOptions), but
// for -watch-namespace, which Flux reads from RUNTIME_NAMESPACE alone.
// BindFlags spells them out, for the tools that read flags from the source
// (hack/deployvalidate).
const (
	LabelSelectorFlag = "watch-label-selector"
	AllNamespacesFlag = "watch-all-namespaces"
	NamespaceFlag     = "watch-namespace"
	FleetFlag         = "fleet-selectors"
)

// RuntimeNamespaceEnv is where Flux's controllers read the namespace they
// watch with -watch-all-namespaces=false.
const RuntimeNamespaceEnv = "RUNTIME_NAMESPACE"

// Options are the flags of a shard.
type Options struct {
	// Selector is -watch-label-selector, parsed when the flag is set: a
	// selector that does not parse is a bad flag (the command exits 2).
	Selector Selector
	// OneNamespace is -watch-all-namespaces=false: watch Namespace alone.
	// (Inverted, so that the zero Options watch every namespace, as the
	// flag's default.)
	OneNamespace bool
	// Namespace is -watch-namespace; empty means $RUNTIME_NAMESPACE.
	Namespace string
	// Fleet is -fleet-selectors: the selectors of every shard of the
	// fleet. When set, this watcher reports the sources that match none
	// (Reporter).
	Fleet Fleet
}

// BindFlags binds the options to fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.Var(&o.Selector, "watch-label-selector",
		"Reconcile only the sources whose labels match this selector, e.g. 'sharding.fluxcd.io/key in (shard1)' or '!sharding.fluxcd.io/key' "+
			"(as Flux's flag; docs/sharding.md). Each selector is a shard with its own leader election and its own consumer of the results.")
	fs.Var(allNamespaces{&o.OneNamespace}, "watch-all-namespaces",
		"Watch sources in all namespaces; false watches -watch-namespace (default $RUNTIME_NAMESPACE) alone, as Flux's flag.")
	fs.StringVar(&o.Namespace, "watch-namespace", "",
		"The one namespace watched with -watch-all-namespaces=false; default: $RUNTIME_NAMESPACE, as Flux.")
	fs.Var(&o.Fleet, "fleet-selectors",
		"The label selectors of every watcher shard of the fleet, separated by ';' (e.g. '!sharding.fluxcd.io/key;sharding.fluxcd.io/key in (shard1,shard2)'): "+
			"when set, this watcher reports the sources that match none of them (headwater_watcher_unowned_sources and a log line naming each). "+
			"Set it on one shard, usually the main one.")
}

// allNamespaces is -watch-all-namespaces, a bool flag (default true)
// stored inverted in Options.OneNamespace.
type allNamespaces struct{ one *bool }

// Set parses v as a bool (flag.Value).
func (a allNamespaces) Set(v string) error {
	all, err := strconv.ParseBool(v)
	if err != nil {
		return err
	}
	*a.one = !all
	return nil
}

// String is the flag's value (flag.Value).
func (a allNamespaces) String() string {
	if a.one == nil {
		return "true"
	}
	return strconv.FormatBool(!*a.one)
}

// IsBoolFlag lets -watch-all-namespaces stand alone.
func (allNamespaces) IsBoolFlag() bool { return true }

// Selector is a label selector flag, parsed as Flux parses
// -watch-label-selector.
type Selector struct {
	raw string
	sel labels.Selector
}

// ParseSelector parses s as Flux's -watch-label-selector; the empty
// selector matches everything.
func ParseSelector(s string) (Selector, error) {
	sel, err := fluxcontroller.GetWatchSelector(fluxcontroller.WatchOptions{LabelSelector: s})
	if err != nil {
		return Selector{}, fmt.Errorf("label selector %q does not parse: %w", s, err)
	}
	return Selector{raw: s, sel: sel}, nil
}

// Set parses s (flag.Value).
func (s *Selector) Set(v string) error {
	p, err := ParseSelector(strings.TrimSpace(v))
	if err != nil {
		return err
	}
	*s = p
	return nil
}

// String is the selector as given (flag.Value).
func (s *Selector) String() string { return s.raw }

// Empty reports whether the selector selects everything (no shard).
func (s Selector) Empty() bool { return s.sel == nil || s.sel.Empty() }

// Labels is the parsed selector; everything when none was given.
func (s Selector) Labels() labels.Selector {
	if s.sel == nil {
		return labels.Everything()
	}
	return s.sel
}

// Fleet is a list of selectors separated by ';' (flag.Value).
type Fleet []Selector

// Set parses v, a ';'-separated list of selectors; empty items are skipped.
func (f *Fleet) Set(v string) error {
	var out Fleet
	for _, s := range strings.Split(v, ";") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := ParseSelector(s)
		if err != nil {
			return err
		}
		out = append(out, p)
	}
	*f = out
	return nil
}

// String lists the selectors as given (flag.Value).
func (f *Fleet) String() string {
	if f == nil {
		return ""
	}
	raw := make([]string, len(*f))
	for i, s := range *f {
		raw[i] = s.raw
	}
	return strings.Join(raw, ";")
}

// Owns reports whether a source with these labels belongs to one of the
// fleet's shards.
func (f Fleet) Owns(l map[string]string) bool {
	for _, s := range f {
		if s.Labels().Matches(labels.Set(l)) {
			return true
		}
	}
	return false
}

// Shard is the watcher's share of the sources.
type Shard struct {
	// Selector chooses the source objects of the shard.
	Selector Selector
	// Namespace is the one namespace watched; empty for all.
	Namespace string
	// ID names the shard: empty for the unsharded watcher (every source
	// of every namespace), else the first 8 hex digits of a SHA-256 of
	// its selector and namespace.
	ID string
}

// New returns the shard o configures, or an error naming the flag when
// -watch-all-namespaces=false names no namespace.
func New(o Options) (*Shard, error) {
	s := &Shard{Selector: o.Selector}
	if o.OneNamespace {
		s.Namespace = o.Namespace
		if s.Namespace == "" {
			s.Namespace = os.Getenv(RuntimeNamespaceEnv)
		}
		if s.Namespace == "" {
			return nil, fmt.Errorf("-%s=false needs the namespace to watch: set -%s or $%s", AllNamespacesFlag, NamespaceFlag, RuntimeNamespaceEnv)
		}
	}
	if !s.Selector.Empty() || s.Namespace != "" {
		// The canonical form of the selector, so that spacing does not
		// make another shard of the same sources.
		h := sha256.Sum256([]byte(s.Selector.Labels().String() + "\n" + s.Namespace))
		s.ID = fmt.Sprintf("%x", h[:4])
	}
	return s, nil
}

// LeaseName is the leader election lease of the shard: base for the
// unsharded watcher, base-<ID> for a shard (as Flux's
// leaderelection.GenerateID suffixes its lease with a hash of the
// selector), so two shards never share a lease.
func (s *Shard) LeaseName(base string) string {
	if s.ID == "" {
		return base
	}
	return base + "-" + s.ID
}

// Owns reports whether obj belongs to the shard: in its namespace, if it
// watches one, and matching its selector. The cache holds such objects
// alone; Owns checks an object read live (from the API server) or one the
// cache has not dropped yet.
func (s *Shard) Owns(obj client.Object) bool {
	if s.Namespace != "" && obj.GetNamespace() != s.Namespace {
		return false
	}
	return s.Selector.Labels().Matches(labels.Set(obj.GetLabels()))
}

// CacheOptions adds the shard to o: the selector applies to objs (the
// source kinds, as Flux applies it to its five), the namespace, if any,
// to every object cached (as Flux's DefaultNamespaces).
func (s *Shard) CacheOptions(o cache.Options, objs []client.Object) cache.Options {
	if !s.Selector.Empty() {
		if o.ByObject == nil {
			o.ByObject = map[client.Object]cache.ByObject{}
		}
		for _, obj := range objs {
			by := o.ByObject[obj]
			by.Label = s.Selector.Labels()
			o.ByObject[obj] = by
		}
	}
	if s.Namespace != "" {
		o.DefaultNamespaces = map[string]cache.Config{s.Namespace: {}}
	}
	return o
}

// Describe is the shard in a log line or an error.
func (s *Shard) Describe() string {
	if s.ID == "" {
		return "unsharded"
	}
	d := "selector " + fmt.Sprintf("%q", s.Selector.String())
	if s.Namespace != "" {
		d += " in namespace " + s.Namespace
	}
	return d
}
