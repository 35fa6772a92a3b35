// Package crdwait holds the watcher back until the API server serves every
// kind it reconciles. Without it, a watcher started before its CRDs (an
// install that applied deploy/base before deploy/crds, or a cluster where
// Flux's CRDs were removed) fails its informers' sync after two minutes
// and exits, again and again: a CrashLoopBackOff whose reason is a line in
// a previous container's log. Waiting instead keeps the pod Running, not
// Ready, with /readyz and the log naming the missing kinds and the command
// that installs them, and starts on its own once they are served.
package crdwait

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Discovery is what Wait asks of the API server: the resources of one
// group and version (client-go's discovery.DiscoveryInterface has it).
type Discovery interface {
	ServerResourcesForGroupVersion(groupVersion string) (*metav1.APIResourceList, error)
}

// MinFluxVersion is the oldest Flux release whose CRDs serve every Flux
// kind the watcher reconciles (ExternalArtifact and ArtifactGenerator came
// with Flux 2.7); Headwater works with it and every later 2.x release.
const MinFluxVersion = "2.7"

// fluxReleases is the Flux release that first served each Flux kind at
// the version the watcher reconciles: a cluster on an older Flux lacks it.
var fluxReleases = map[schema.GroupVersionKind]string{
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "GitRepository"}:             "2.0",
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "HelmRepository"}:            "2.3",
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "HelmChart"}:                 "2.3",
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "Bucket"}:                    "2.5",
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "OCIRepository"}:             "2.6",
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "ExternalArtifact"}:          "2.7",
	{Group: "source.extensions.fluxcd.io", Version: "v1beta1", Kind: "ArtifactGenerator"}: "2.7",
	{Group: "notification.toolkit.fluxcd.io", Version: "v1", Kind: "Receiver"}:            "2.1",
}

// FluxRelease is the Flux release that first served kind, or "" for a
// kind that is not Flux's (a plug-in kind, Headwater's own).
func FluxRelease(kind schema.GroupVersionKind) string {
	return fluxReleases[kind]
}

// MissingError names the kinds the API server does not serve yet.
type MissingError struct {
	// Kinds are the missing group/version kinds, sorted.
	Kinds []schema.GroupVersionKind
	// Hint says how to install them.
	Hint string
}

// Error names each missing kind, with the Flux release that brought it
// for Flux's kinds, so that a cluster on an older Flux reads which
// version it needs.
func (e *MissingError) Error() string {
	names := make([]string, len(e.Kinds))
	flux := false
	for i, k := range e.Kinds {
		names[i] = k.Kind + " (" + k.GroupVersion().String()
		if r := FluxRelease(k); r != "" {
			names[i] += ", Flux " + r + " and later"
			flux = true
		}
		names[i] += ")"
	}
	msg := "the API server does not serve " + strings.Join(names, ", ")
	if flux {
		msg += "; Headwater works with the CRDs of Flux " + MinFluxVersion + " and later (an older Flux's CRDs lack these kinds)"
	}
	if e.Hint != "" {
		msg += ": " + e.Hint
	}
	return msg
}

// Waiter looks for Kinds until every one is served.
type Waiter struct {
	// Discovery reads what the API server serves.
	Discovery Discovery
	// Kinds are those the watcher reconciles.
	Kinds []schema.GroupVersionKind
	// Hint is appended to the error: how to install the CRDs.
	Hint string
	// Interval is how often Wait looks again.
	Interval time.Duration
	// Log says what is missing, once per change.
	Log logr.Logger
	// Report, if set, is told what is missing once per change too (the
	// watcher records it as a Warning Event on its Pod).
	Report func(missing *MissingError)

	mu   sync.Mutex
	last error
}

// Check looks once: nil when every kind is served, a *MissingError naming
// those that are not, another error when the API server cannot tell.
func (w *Waiter) Check() error {
	err := w.check()
	w.mu.Lock()
	w.last = err
	w.mu.Unlock()
	return err
}

func (w *Waiter) check() error {
	byGV := map[schema.GroupVersion][]string{}
	var missing []schema.GroupVersionKind
	for _, k := range w.Kinds {
		gv := k.GroupVersion()
		kinds, ok := byGV[gv]
		if !ok {
			list, err := w.Discovery.ServerResourcesForGroupVersion(gv.String())
			switch {
			case apierrors.IsNotFound(err):
				// The group/version is not served at all.
			case err != nil:
				return fmt.Errorf("discover %s: %w", gv, err)
			default:
				for _, r := range list.APIResources {
					if !strings.Contains(r.Name, "/") { // not a subresource
						kinds = append(kinds, r.Kind)
					}
				}
			}
			byGV[gv] = kinds
		}
		if !slices.Contains(kinds, k.Kind) {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.SortFunc(missing, func(a, b schema.GroupVersionKind) int { return strings.Compare(a.String(), b.String()) })
	return &MissingError{Kinds: missing, Hint: w.Hint}
}

// Ready is the readiness check while the watcher waits: the last error
// Check found, nil once every kind is served.
func (w *Waiter) Ready() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// Wait returns nil once every kind is served, looking every Interval, or
// ctx's error.
func (w *Waiter) Wait(ctx context.Context) error {
	said := ""
	for {
		err := w.Check()
		if err == nil {
			if said != "" {
				w.Log.Info("every kind is served: starting", "kinds", len(w.Kinds))
			}
			return nil
		}
		if msg := err.Error(); msg != said {
			w.Log.Info("waiting for the API server to serve the watcher's kinds", "reason", msg)
			said = msg
			var missing *MissingError
			if w.Report != nil && errors.As(err, &missing) {
				w.Report(missing)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(w.Interval):
		}
	}
}
