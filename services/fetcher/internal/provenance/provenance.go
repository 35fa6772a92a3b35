// Package provenance checks a fetch job against the object it names before
// the fetcher acts on it: the fetcher reads Secrets and connects where a
// job says, so a job is done only when it describes an object that exists
// now, with the job's UID, generation and spec. Only the watcher may
// publish jobs (the bus's permissions); this is the defence behind that: a
// job forged with the watcher's key still cannot make a fetcher read a
// Secret that no live source names, or send it where no live source
// points.
package provenance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// The fetcher may read the sources themselves (one GET per job, no list,
// no watch), generated into deploy/base/rbac/fetcher by `make manifests`.
// +kubebuilder:rbac:groups=source.toolkit.fluxcd.io,resources=gitrepositories;buckets;helmrepositories;helmcharts;ocirepositories,verbs=get

// ErrStale marks a job for an object that has moved on: deleted,
// re-created, or at a newer generation, whose own job supersedes it.
var ErrStale = errors.New("stale job")

// ErrForged marks a job that does not describe the live object: a spec,
// UID or generation the object never had.
var ErrForged = errors.New("job does not match the live object")

// Checker reads the live objects jobs name.
type Checker struct {
	c client.Reader
}

// New returns a Checker reading through c, which should not be cached.
func New(c client.Reader) *Checker { return &Checker{c: c} }

// Check reads the object req names and returns nil when it exists with the
// job's UID and generation and its spec is the job's; an error wrapping
// ErrStale when the object has moved on; one wrapping ErrForged when the
// job describes what the object never was; any other error is the API
// server's (retry).
func (c *Checker) Check(ctx context.Context, req *events.FetchRequested) error {
	ref := req.Job.Object
	spec := req.Spec()
	if spec == nil {
		return fmt.Errorf("%w: no spec for %s", ErrForged, ref.Kind)
	}
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(schema.GroupVersionKind{Group: sourcev1.GroupVersion.Group, Version: sourcev1.GroupVersion.Version, Kind: ref.Kind})
	err := c.c.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, live)
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %s %s/%s no longer exists", ErrStale, ref.Kind, ref.Namespace, ref.Name)
	case err != nil:
		return fmt.Errorf("read %s %s/%s: %w", ref.Kind, ref.Namespace, ref.Name, err)
	case string(live.GetUID()) != ref.UID:
		return fmt.Errorf("%w: %s %s/%s was re-created", ErrStale, ref.Kind, ref.Namespace, ref.Name)
	case live.GetGeneration() > ref.Generation:
		return fmt.Errorf("%w: %s %s/%s is at generation %d, the job at %d", ErrStale, ref.Kind, ref.Namespace, ref.Name,
			live.GetGeneration(), ref.Generation)
	case live.GetGeneration() < ref.Generation:
		return fmt.Errorf("%w: generation %d, the object is at %d", ErrForged, ref.Generation, live.GetGeneration())
	}
	if err := sameSpec(live, spec); err != nil {
		return fmt.Errorf("%w: the spec of %s %s/%s differs from the job's", err, ref.Kind, ref.Namespace, ref.Name)
	}
	return c.checkChartSource(ctx, req)
}

// sameSpec returns nil when the live object's spec, read into spec's
// type, encodes as spec does (the encoding makes an empty list and no
// list alike, as the bus did for the job); else an error wrapping
// ErrForged.
func sameSpec(live *unstructured.Unstructured, spec any) error {
	raw, err := json.Marshal(live.Object["spec"])
	if err != nil {
		return fmt.Errorf("%w: live spec: %w", ErrForged, err)
	}
	liveSpec := reflect.New(reflect.TypeOf(spec).Elem()).Interface()
	if err := json.Unmarshal(raw, liveSpec); err != nil {
		return fmt.Errorf("%w: live spec: %w", ErrForged, err)
	}
	want, err := json.Marshal(liveSpec)
	if err != nil {
		return fmt.Errorf("%w: live spec: %w", ErrForged, err)
	}
	got, err := json.Marshal(spec)
	if err != nil || !bytes.Equal(got, want) {
		return ErrForged
	}
	return nil
}

// checkChartSource checks what a HelmChart's job says of other objects:
// its source must be the one spec.sourceRef names, and every
// HelmRepository spec it carries (whose Secrets the fetcher reads) must be
// that of the live HelmRepository of that name in the chart's namespace:
// a source repository that differs makes the job stale; a dependency
// repository that differs is dropped from the job. The source's artifact
// is not checked: it is only read from storage.
func (c *Checker) checkChartSource(ctx context.Context, req *events.FetchRequested) error {
	cs := req.ChartSource
	if req.HelmChart == nil || cs == nil {
		return nil
	}
	ns := req.Job.Object.Namespace
	if cs.Kind != req.HelmChart.SourceRef.Kind || cs.Name != req.HelmChart.SourceRef.Name {
		return fmt.Errorf("%w: source %s/%s is not the chart's sourceRef", ErrForged, cs.Kind, cs.Name)
	}
	check := func(name string, spec *sourcev1.HelmRepositorySpec) error {
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(sourcev1.GroupVersion.WithKind(sourcev1.HelmRepositoryKind))
		err := c.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, live)
		switch {
		case apierrors.IsNotFound(err):
			return fmt.Errorf("%w: HelmRepository %s/%s no longer exists", ErrStale, ns, name)
		case err != nil:
			return fmt.Errorf("read HelmRepository %s/%s: %w", ns, name, err)
		}
		if err := sameSpec(live, spec); err != nil {
			// The repository may have changed since the job was made: its
			// own change reconciles the chart again.
			return fmt.Errorf("%w: the spec of HelmRepository %s/%s differs from the job's", ErrStale, ns, name)
		}
		return nil
	}
	if cs.HelmRepository != nil {
		if err := check(cs.Name, cs.HelmRepository); err != nil {
			return err
		}
	}
	// The namespace's repositories (for a chart's dependencies) that are
	// not as the job says are left out: a dependency on one fails and
	// says so, and the rest of the job goes on.
	kept := cs.Repositories[:0]
	for i := range cs.Repositories {
		err := check(cs.Repositories[i].Name, &cs.Repositories[i].Spec)
		switch {
		case err == nil:
			kept = append(kept, cs.Repositories[i])
		case !errors.Is(err, ErrStale):
			return err
		}
	}
	cs.Repositories = kept
	return nil
}
