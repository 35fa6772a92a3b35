package main

import (
	"fmt"
	"slices"
	"strings"
)

// A Dimension is one choice of the chart's values that selects a
// different kustomization over deploy/: an overlay, or a component added.
type Dimension struct {
	// Name names the choice in messages.
	Name string
	// Values are the choice's values, the chart's default first.
	Values []string
	// Resource is the kustomization (under deploy/) a value builds on, or
	// "" where the value does not decide it.
	Resource func(v string) string
	// Component is the component (under deploy/components) a value adds,
	// or "".
	Component func(v string) string
	// Cond is the template condition that holds when the choice has
	// value v.
	Cond func(v string) string
	// Var and Helper, for a choice of more than two values: the template
	// variable Cond tests, set at the top of the templates that test it
	// from the helper (templates/_helpers.tpl) that derives the choice
	// from the values.
	Var, Helper string
}

// componentOrder is the order components are added in, whatever the
// order of the dimensions: the overlays' (production: nats-cluster, then
// nats-tls), then the optional ones, then those that remove or patch
// what the others add; shards first, so that every other component's
// patches of the watcher (TLS, tracing, an external NATS, the drop-in)
// reach the shards' copies too.
var componentOrder = []string{"shards", "nats-cluster", "nats-tls", "receivers", "dispatcher", "monitoring", "tracing", "workload-identity", "nats-external", "flux-dropin"}

// storageOverlays are the kustomizations the storage choices build on:
// deploy/ (MinIO) and the overlays.
var storageOverlays = map[string]string{
	"minio":   "deploy",
	"s3":      "deploy/overlays/s3",
	"dir-rwo": "deploy/overlays/single-node",
	"dir-rwx": "deploy/overlays/rwx",
}

// Dimensions are the chart's choices, in the order combinations are
// counted. Storage decides the kustomization to start from; each of the
// others adds a component when enabled.
var Dimensions = []Dimension{
	{
		Name:      "storage",
		Values:    []string{"minio", "s3", "dir-rwo", "dir-rwx"},
		Resource:  func(v string) string { return storageOverlays[v] },
		Component: func(string) string { return "" },
		Cond:      func(v string) string { return fmt.Sprintf("eq $storage %q", v) },
		Var:       "$storage",
		Helper:    "headwater.storage",
	},
	{
		Name:     "nats",
		Values:   []string{"bundled", "cluster", "external"},
		Resource: func(string) string { return "" },
		Component: func(v string) string {
			return map[string]string{"cluster": "nats-cluster", "external": "nats-external"}[v]
		},
		Cond:   func(v string) string { return fmt.Sprintf("eq $nats %q", v) },
		Var:    "$nats",
		Helper: "headwater.nats",
	},
	toggle("nats.tls", "nats-tls"),
	toggle("receivers", "receivers"),
	toggle("dispatcher", "dispatcher"),
	toggle("monitoring", "monitoring"),
	toggle("tracing", "tracing"),
	toggle("workloadIdentity", "workload-identity"),
	toggle("fluxDropIn", "flux-dropin"),
	{
		// Watcher shards (components/shards): any non-empty list of
		// shards renders the component, whose shard1 objects become the
		// template of every shard (ShardTemplate).
		Name:     "shards",
		Values:   []string{"false", "true"},
		Resource: func(string) string { return "" },
		Component: func(v string) string {
			if v == "true" {
				return "shards"
			}
			return ""
		},
		Cond: func(v string) string {
			if v == "true" {
				return ".Values.shards"
			}
			return "not .Values.shards"
		},
	},
}

// toggle is a choice between leaving a component out and adding it, by
// the value <key>.enabled.
func toggle(key, component string) Dimension {
	return Dimension{
		Name:     key,
		Values:   []string{"false", "true"},
		Resource: func(string) string { return "" },
		Component: func(v string) string {
			if v == "true" {
				return component
			}
			return ""
		},
		Cond: func(v string) string {
			if v == "true" {
				return ".Values." + key + ".enabled"
			}
			return "not .Values." + key + ".enabled"
		},
	}
}

// A Combo is one value of every dimension, as indices into their Values.
type Combo []int

// Grid enumerates the combinations of a list of dimensions.
type Grid struct {
	Dims []Dimension
}

// Size is the number of combinations.
func (g Grid) Size() int {
	n := 1
	for _, d := range g.Dims {
		n *= len(d.Values)
	}
	return n
}

// Combo returns combination i (0 <= i < Size): the first dimension varies
// slowest.
func (g Grid) Combo(i int) Combo {
	c := make(Combo, len(g.Dims))
	for k := len(g.Dims) - 1; k >= 0; k-- {
		n := len(g.Dims[k].Values)
		c[k] = i % n
		i /= n
	}
	return c
}

// Index is the inverse of Combo.
func (g Grid) Index(c Combo) int {
	i := 0
	for k, d := range g.Dims {
		i = i*len(d.Values) + c[k]
	}
	return i
}

// Kustomization is the kustomization.yaml that renders combination c, for
// a directory beside deploy/.
func (g Grid) Kustomization(c Combo) (string, error) {
	var resource string
	var components []string
	for k, d := range g.Dims {
		v := d.Values[c[k]]
		if r := d.Resource(v); r != "" {
			if resource != "" {
				return "", fmt.Errorf("two choices pick the kustomization: %s and %s", resource, r)
			}
			resource = r
		}
		if comp := d.Component(v); comp != "" {
			if !slices.Contains(componentOrder, comp) {
				return "", fmt.Errorf("component %s has no place in componentOrder", comp)
			}
			components = append(components, comp)
		}
	}
	slices.SortStableFunc(components, func(a, b string) int {
		return slices.Index(componentOrder, a) - slices.Index(componentOrder, b)
	})
	if resource == "" {
		return "", fmt.Errorf("no choice picks the kustomization of %v", g.Describe(c))
	}
	var b strings.Builder
	b.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n")
	fmt.Fprintf(&b, "  - ../%s\n", resource)
	if len(components) > 0 {
		b.WriteString("components:\n")
		for _, comp := range components {
			fmt.Fprintf(&b, "  - ../deploy/components/%s\n", comp)
		}
	}
	return b.String(), nil
}

// Describe names combination c, as name=value pairs.
func (g Grid) Describe(c Combo) string {
	parts := make([]string, len(g.Dims))
	for k, d := range g.Dims {
		parts[k] = d.Name + "=" + d.Values[c[k]]
	}
	return strings.Join(parts, " ")
}
