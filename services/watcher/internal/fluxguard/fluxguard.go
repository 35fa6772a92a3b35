// Package fluxguard keeps the watcher from reconciling while Flux's own
// source-controller runs beside it: both would reconcile, and write the
// status and artifacts of, the same sources, each undoing the other. A
// drop-in applied before Flux's controller is scaled to 0 waits instead,
// saying on /readyz and in its log what to do; and the leader stops (the
// watcher exits, and waits again once restarted) if Flux's controller
// comes back.
//
// Flux users who shard run one source-controller Deployment per shard
// (source-controller, source-controller-shard1, ... as Flux's sharding
// docs name them), each with its --watch-label-selector: the guard looks
// at every Deployment in its namespaces that runs Flux's source-controller
// (by name, app label or image), and stands aside only for one whose
// selector (and namespace) can select none of this watcher's sources.
package fluxguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	fluxcontroller "github.com/fluxcd/pkg/runtime/controller"
	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The watcher lists the Deployments of the namespaces it guards, to find
// Flux's sharded source-controllers too, whose names it cannot know.
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list

// Name is the name of Flux's source-controller Deployment, as `flux
// install` and `flux bootstrap` make it; a shard's is Name-<shard>.
const Name = "source-controller"

// image is the repository of Flux's source-controller image, however
// mirrored (ghcr.io/fluxcd/source-controller, docker.io/fluxcd/...).
const image = "fluxcd/source-controller"

// RunningError says that Flux's source-controller runs, where, and what
// to do about it.
type RunningError struct {
	// Namespace is the namespace of the Deployment.
	Namespace string
	// Name is the Deployment's name.
	Name string
	// Selector is its --watch-label-selector; empty for none.
	Selector string
	// Replicas is the number of replicas it asks for or still has.
	Replicas int32
}

func (e *RunningError) Error() string {
	name := e.Name
	if name == "" {
		name = Name
	}
	what := "Flux's source-controller Deployment"
	if name != Name {
		what += " " + name
	}
	if e.Selector != "" {
		what += fmt.Sprintf(" (--watch-label-selector=%q)", e.Selector)
	}
	return fmt.Sprintf("%s is running in %s (%d replicas); scale it to 0: "+
		"it and Headwater would reconcile the same sources (docs/migrate-from-flux.md, docs/sharding.md)", what, e.Namespace, e.Replicas)
}

// Guard looks for Flux's source-controller Deployment in Namespaces.
type Guard struct {
	// Reader reads Deployments; uncached (the manager's API reader), so
	// the guard works before the manager starts.
	Reader client.Reader
	// Namespaces are where Flux's source-controller may run; none turns
	// the guard off.
	Namespaces []string
	// Selector is this watcher's -watch-label-selector; nil selects
	// every source.
	Selector labels.Selector
	// Namespace is the one namespace this watcher watches; empty for all.
	Namespace string
	// Interval is how often Wait and Start look.
	Interval time.Duration
	// Log says what the guard finds.
	Log logr.Logger

	mu   sync.Mutex
	last error
}

// Check looks once: nil when no Deployment of Flux's source-controller in
// Namespaces that could reconcile this watcher's sources asks for or has
// a replica, a *RunningError when one does, and another error when it
// cannot tell.
func (g *Guard) Check(ctx context.Context) error {
	err := g.check(ctx)
	g.mu.Lock()
	g.last = err
	g.mu.Unlock()
	return err
}

func (g *Guard) check(ctx context.Context) error {
	for _, ns := range g.Namespaces {
		var list appsv1.DeploymentList
		if err := g.Reader.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return fmt.Errorf("look for Flux's source-controller in %s: %w", ns, err)
		}
		for i := range list.Items {
			d := &list.Items[i]
			c := fluxContainer(d)
			if c == nil {
				continue
			}
			// An unset spec.replicas is one.
			replicas := int32(1)
			if d.Spec.Replicas != nil {
				replicas = *d.Spec.Replicas
			}
			// Scaled to 0, its pods may still be stopping.
			replicas = max(replicas, d.Status.Replicas)
			if replicas == 0 {
				continue
			}
			w := watches(d, c)
			if g.disjoint(w) {
				g.Log.V(1).Info("Flux's source-controller selects none of this watcher's sources", "deployment", d.Name,
					"namespace", ns, "selector", w.selector)
				continue
			}
			return &RunningError{Namespace: ns, Name: d.Name, Selector: w.selector, Replicas: replicas}
		}
	}
	return nil
}

// partOf is the label that marks Headwater's own Deployments (deploy/base).
const partOf = "app.kubernetes.io/part-of"

// fluxContainer returns the container of d that runs Flux's
// source-controller, or nil: d is one when it is named source-controller
// or source-controller-<shard>, or labelled app: source-controller (as
// Flux's manifests), or runs Flux's image, and is no Deployment of
// Headwater's.
func fluxContainer(d *appsv1.Deployment) *corev1.Container {
	if d.Labels[partOf] == "headwater" {
		// Headwater's own: the drop-in's artifact-servers carry app:
		// source-controller, the selector of Flux's Service.
		return nil
	}
	named := d.Name == Name || strings.HasPrefix(d.Name, Name+"-") ||
		d.Labels["app"] == Name || d.Spec.Template.Labels["app"] == Name ||
		d.Labels["app.kubernetes.io/name"] == Name
	cs := d.Spec.Template.Spec.Containers
	for i := range cs {
		if strings.Contains(cs[i].Image, image) {
			return &cs[i]
		}
	}
	if named && len(cs) > 0 {
		// A renamed image (a private mirror): the manager container, or
		// the first.
		for i := range cs {
			if cs[i].Name == "manager" {
				return &cs[i]
			}
		}
		return &cs[0]
	}
	return nil
}

// watch is what a Flux source-controller reconciles, from its flags.
type watch struct {
	// selector is --watch-label-selector as given.
	selector string
	// labels is the selector parsed; nil when it does not parse (Flux
	// would not start, but the guard cannot tell what it selects).
	labels labels.Selector
	// namespace is the one namespace it watches
	// (--watch-all-namespaces=false); empty for all, or unknown.
	namespace string
}

// watches reads c's flags (Flux's pflag forms: --flag=value, --flag
// value, -flag=value).
func watches(d *appsv1.Deployment, c *corev1.Container) watch {
	args := slices.Concat(c.Command, c.Args)
	flag := func(name string) (string, bool) {
		for i, a := range args {
			a = strings.TrimLeft(a, "-")
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v, true
			}
			if a == name && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				return args[i+1], true
			}
			if a == name {
				return "true", true
			}
		}
		return "", false
	}
	w := watch{labels: labels.Everything()}
	if v, ok := flag("watch-label-selector"); ok && strings.TrimSpace(v) != "" {
		w.selector = v
		sel, err := fluxcontroller.GetWatchSelector(fluxcontroller.WatchOptions{LabelSelector: v})
		if err != nil {
			sel = nil
		}
		w.labels = sel
	}
	if v, ok := flag("watch-all-namespaces"); ok && v == "false" {
		// Flux reads RUNTIME_NAMESPACE, set from the pod's namespace by
		// its manifests.
		w.namespace = d.Namespace
		for _, e := range c.Env {
			if e.Name == "RUNTIME_NAMESPACE" && e.Value != "" {
				w.namespace = e.Value
			}
		}
	}
	return w
}

// disjoint reports whether Flux's source-controller watching w can
// reconcile none of this watcher's sources: they watch different
// namespaces, or their selectors contradict each other on a label.
func (g *Guard) disjoint(w watch) bool {
	if w.namespace != "" && g.Namespace != "" && w.namespace != g.Namespace {
		return true
	}
	if w.labels == nil || g.Selector == nil {
		return false
	}
	return Disjoint(g.Selector, w.labels)
}

// Disjoint reports whether no set of labels can match both a and b, as
// far as their requirements can be compared one key at a time: `!key`
// against any requirement that the key exists, `key in (x)` against `key
// in (y)`, `key in (x)` against `key notin (x, ...)`. It answers false
// (they may overlap) when it cannot tell.
func Disjoint(a, b labels.Selector) bool {
	ra, _ := a.Requirements()
	rb, _ := b.Requirements()
	for _, x := range ra {
		for _, y := range rb {
			if x.Key() == y.Key() && (contradicts(x, y) || contradicts(y, x)) {
				return true
			}
		}
	}
	return false
}

// contradicts reports whether no label value satisfies both x and y, for
// the cases where x decides.
func contradicts(x, y labels.Requirement) bool {
	xv := x.ValuesUnsorted()
	switch x.Operator() {
	case selection.DoesNotExist:
		switch y.Operator() {
		case selection.In, selection.Equals, selection.DoubleEquals, selection.Exists, selection.GreaterThan, selection.LessThan:
			return true
		}
	case selection.In, selection.Equals, selection.DoubleEquals:
		switch y.Operator() {
		case selection.In, selection.Equals, selection.DoubleEquals:
			for _, v := range xv {
				if y.Values().Has(v) {
					return false
				}
			}
			return true
		case selection.NotIn, selection.NotEquals:
			for _, v := range xv {
				if !y.Values().Has(v) {
					return false
				}
			}
			return true
		}
	}
	return false
}

// Ready is the watcher's readiness check while it waits: the last
// *RunningError found, or nil.
func (g *Guard) Ready() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if running := (*RunningError)(nil); errors.As(g.last, &running) {
		return running
	}
	return nil
}

// Wait returns once Flux's source-controller runs in none of Namespaces,
// looking every Interval, or with ctx's error. It waits on an error that
// may pass, but not on Forbidden: without the right to look (an older
// ClusterRole) it logs that it cannot tell, and returns.
func (g *Guard) Wait(ctx context.Context) error {
	said := ""
	for {
		err := g.Check(ctx)
		if err == nil {
			if said != "" {
				g.Log.Info("Flux's source-controller is scaled to 0: starting")
			}
			return nil
		}
		if apierrors.IsForbidden(err) {
			g.Log.Error(err, "cannot tell whether Flux's source-controller runs; starting anyway")
			return nil
		}
		if msg := err.Error(); msg != said {
			g.Log.Info("waiting for Flux's source-controller to be scaled to 0", "reason", msg, "namespaces", g.Namespaces)
			said = msg
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(g.Interval):
		}
	}
}

// Start looks every Interval until ctx ends, and returns the
// *RunningError when Flux's source-controller runs again, which stops the
// manager: the watcher exits, and restarted it waits (Wait). It
// implements manager.Runnable.
func (g *Guard) Start(ctx context.Context) error {
	t := time.NewTicker(g.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		var running *RunningError
		if err := g.Check(ctx); errors.As(err, &running) {
			g.Log.Info("stopping: Flux's source-controller runs again", "reason", running.Error())
			return running
		}
	}
}

// NeedLeaderElection makes Start run on the leader alone: the standbys
// reconcile nothing.
func (g *Guard) NeedLeaderElection() bool { return true }
