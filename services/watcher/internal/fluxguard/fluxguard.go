// Package fluxguard keeps the watcher from reconciling while Flux's own
// source-controller runs beside it: both would reconcile, and write the
// status and artifacts of, the same sources, each undoing the other. A
// drop-in applied before Flux's controller is scaled to 0 waits instead,
// saying on /readyz and in its log what to do; and the leader stops (the
// watcher exits, and waits again once restarted) if Flux's controller
// comes back.
package fluxguard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The watcher reads Flux's source-controller Deployment, and no other.
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get,resourceNames=source-controller

// Name is the name of Flux's source-controller Deployment, as `flux
// install` and `flux bootstrap` make it.
const Name = "source-controller"

// RunningError says that Flux's source-controller runs, where, and what
// to do about it.
type RunningError struct {
	// Namespace is the namespace of the Deployment.
	Namespace string
	// Replicas is the number of replicas it asks for or still has.
	Replicas int32
}

func (e *RunningError) Error() string {
	return fmt.Sprintf("Flux's source-controller Deployment is running in %s (%d replicas); scale it to 0: "+
		"it and Headwater would reconcile the same sources (docs/migrate-from-flux.md)", e.Namespace, e.Replicas)
}

// Guard looks for Flux's source-controller Deployment in Namespaces.
type Guard struct {
	// Reader reads Deployments; uncached (the manager's API reader), so
	// the guard works before the manager starts.
	Reader client.Reader
	// Namespaces are where Flux's source-controller may run; none turns
	// the guard off.
	Namespaces []string
	// Interval is how often Wait and Start look.
	Interval time.Duration
	// Log says what the guard finds.
	Log logr.Logger

	mu   sync.Mutex
	last error
}

// Check looks once: nil when no Deployment source-controller in
// Namespaces asks for or has a replica, a *RunningError when one does,
// and another error when it cannot tell.
func (g *Guard) Check(ctx context.Context) error {
	err := g.check(ctx)
	g.mu.Lock()
	g.last = err
	g.mu.Unlock()
	return err
}

func (g *Guard) check(ctx context.Context) error {
	for _, ns := range g.Namespaces {
		var d appsv1.Deployment
		err := g.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: Name}, &d)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("look for Flux's source-controller in %s: %w", ns, err)
		}
		// An unset spec.replicas is one.
		replicas := int32(1)
		if d.Spec.Replicas != nil {
			replicas = *d.Spec.Replicas
		}
		// Scaled to 0, its pods may still be stopping.
		replicas = max(replicas, d.Status.Replicas)
		if replicas > 0 {
			return &RunningError{Namespace: ns, Replicas: replicas}
		}
	}
	return nil
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
