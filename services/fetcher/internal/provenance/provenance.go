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
	"sync"
	"time"

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

// Checker reads the live objects jobs name. It may remember, for a while,
// that an object had a job's generation and spec (see NewCached), which
// saves the read for the jobs of an unchanged source.
type Checker struct {
	c   client.Reader
	ttl time.Duration
	max int
	now func() time.Time

	mu sync.Mutex
	// seen holds, by object, the generation and encoded spec the object
	// had when it was last read, and when.
	seen map[objectKey]seenSpec
}

// objectKey names one object, UID included: a re-created object is
// another one.
type objectKey struct {
	kind, namespace, name, uid string
}

// seenSpec is what a read found: the object at generation gen, whose spec
// encodes as spec.
type seenSpec struct {
	gen  int64
	spec []byte
	at   time.Time
}

// DefaultCacheEntries bounds the objects a cached Checker remembers.
const DefaultCacheEntries = 65536

// New returns a Checker reading through c, which should not be cached,
// for every job.
func New(c client.Reader) *Checker { return NewCached(c, 0) }

// NewCached returns a Checker that reads the object of a job through c
// unless it read the same object less than ttl ago at the job's generation
// with the job's spec; zero reads for every job. Within the TTL the
// defence against a forged job is whole, since an object's spec at a
// generation never changes: a job still has to carry a generation and
// spec the object really had. What the TTL gives up is noticing at once
// that the object was deleted since, or changed (a job for an older
// generation than the one remembered is still refused): such a job is
// done, and its result dropped by the watcher, as a job that raced the
// change would be.
func NewCached(c client.Reader, ttl time.Duration) *Checker {
	return &Checker{c: c, ttl: ttl, max: DefaultCacheEntries, now: time.Now, seen: map[objectKey]seenSpec{}}
}

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
	got, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("%w: job spec: %w", ErrForged, err)
	}
	key := objectKey{kind: ref.Kind, namespace: ref.Namespace, name: ref.Name, uid: ref.UID}
	switch seen, ok := c.recall(key); {
	case ok && ref.Generation < seen.gen:
		return fmt.Errorf("%w: %s %s/%s was at generation %d, the job at %d", ErrStale, ref.Kind, ref.Namespace, ref.Name,
			seen.gen, ref.Generation)
	case ok && ref.Generation == seen.gen && bytes.Equal(got, seen.spec):
		return c.checkChartSource(ctx, req)
	}
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(schema.GroupVersionKind{Group: sourcev1.GroupVersion.Group, Version: sourcev1.GroupVersion.Version, Kind: ref.Kind})
	err = c.c.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, live)
	switch {
	case apierrors.IsNotFound(err):
		c.forget(key)
		return fmt.Errorf("%w: %s %s/%s no longer exists", ErrStale, ref.Kind, ref.Namespace, ref.Name)
	case err != nil:
		return fmt.Errorf("read %s %s/%s: %w", ref.Kind, ref.Namespace, ref.Name, err)
	case string(live.GetUID()) != ref.UID:
		c.forget(key)
		return fmt.Errorf("%w: %s %s/%s was re-created", ErrStale, ref.Kind, ref.Namespace, ref.Name)
	case live.GetGeneration() > ref.Generation:
		return fmt.Errorf("%w: %s %s/%s is at generation %d, the job at %d", ErrStale, ref.Kind, ref.Namespace, ref.Name,
			live.GetGeneration(), ref.Generation)
	case live.GetGeneration() < ref.Generation:
		return fmt.Errorf("%w: generation %d, the object is at %d", ErrForged, ref.Generation, live.GetGeneration())
	}
	if err := sameSpec(live, spec, got); err != nil {
		return fmt.Errorf("%w: the spec of %s %s/%s differs from the job's", err, ref.Kind, ref.Namespace, ref.Name)
	}
	c.remember(key, seenSpec{gen: ref.Generation, spec: got})
	return c.checkChartSource(ctx, req)
}

// recall returns what the last read of key found, if it is younger than
// the TTL.
func (c *Checker) recall(key objectKey) (seenSpec, bool) {
	if c.ttl <= 0 {
		return seenSpec{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.seen[key]
	if !ok || c.now().Sub(s.at) >= c.ttl {
		return seenSpec{}, false
	}
	return s, true
}

// remember records what a read of key found. When the cache is full, the
// expired entries go, and then, if none had, the entry whose key the map
// yields first: the cache stays bounded and a dropped entry only costs a
// read.
func (c *Checker) remember(key objectKey, s seenSpec) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s.at = c.now()
	if _, ok := c.seen[key]; !ok && len(c.seen) >= c.max {
		for k, old := range c.seen {
			if s.at.Sub(old.at) >= c.ttl {
				delete(c.seen, k)
			}
		}
		for k := range c.seen {
			if len(c.seen) < c.max {
				break
			}
			delete(c.seen, k)
		}
	}
	c.seen[key] = s
}

// forget drops what was recorded of key.
func (c *Checker) forget(key objectKey) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.seen, key)
}

// sameSpec returns nil when the live object's spec, read into spec's
// type, encodes as spec does (got, the encoding of spec, when not nil; the
// encoding makes an empty list and no list alike, as the bus did for the
// job); else an error wrapping ErrForged.
func sameSpec(live *unstructured.Unstructured, spec any, got []byte) error {
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
	if got == nil {
		if got, err = json.Marshal(spec); err != nil {
			return ErrForged
		}
	}
	if !bytes.Equal(got, want) {
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
		if err := sameSpec(live, spec, nil); err != nil {
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
