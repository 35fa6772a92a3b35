package main

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"text/template"
)

// evalCond evaluates a condition of Grid.Cond as a chart template would,
// for combination c: .Values.<key>.enabled from the toggles, .Values.shards
// a list of one shard or none, the variables ($storage, $nats) from the
// dimensions of more values.
func evalCond(t *testing.T, g Grid, cond string, c Combo) bool {
	t.Helper()
	if cond == "" {
		return true
	}
	values := map[string]any{}
	vars := map[string]any{}
	prelude := ""
	for k, d := range g.Dims {
		v := d.Values[c[k]]
		if d.Var != "" {
			name := strings.TrimPrefix(d.Var, "$")
			vars[name] = v
			prelude += "{{ " + d.Var + " := .Vars." + name + " }}"
			continue
		}
		if d.Name == "shards" {
			// A list, not a toggle: any shard renders the component.
			if v == "true" {
				values["shards"] = []any{"shard1"}
			} else {
				values["shards"] = []any{}
			}
			continue
		}
		m := values
		parts := strings.Split(d.Name, ".")
		for _, p := range parts[:len(parts)-1] {
			if _, ok := m[p]; !ok {
				m[p] = map[string]any{}
			}
			m = m[p].(map[string]any)
		}
		m[parts[len(parts)-1]] = map[string]any{"enabled": v == "true"}
	}
	tmpl, err := template.New("cond").Parse(prelude + `{{ if ` + cond + ` }}yes{{ end }}`)
	if err != nil {
		t.Fatalf("condition %q: %v", cond, err)
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, map[string]any{"Values": values, "Vars": vars}); err != nil {
		t.Fatalf("condition %q: %v", cond, err)
	}
	return b.String() == "yes"
}

// TestCond checks, over random sets of combinations, that the condition
// Grid.Cond writes holds exactly for the set's combinations wherever it
// is asked to be right (the care set), and that a set that is a whole
// dimension's value gets the plain condition of that value.
func TestCond(t *testing.T) {
	g := Grid{Dims: Dimensions}
	rng := rand.New(rand.NewPCG(1, 2))
	all := make(Set, g.Size())
	for i := range all {
		all[i] = true
	}
	sets := []Set{}
	// Random sets, and sets built from a few dimensions (as lines are).
	for range 20 {
		s := make(Set, g.Size())
		for i := range s {
			s[i] = rng.IntN(2) == 0
		}
		sets = append(sets, s)
	}
	for range 40 {
		k1, k2 := rng.IntN(len(g.Dims)), rng.IntN(len(g.Dims))
		v1, v2 := rng.IntN(len(g.Dims[k1].Values)), rng.IntN(len(g.Dims[k2].Values))
		s := make(Set, g.Size())
		for i := range s {
			c := g.Combo(i)
			if len(sets)%2 == 0 {
				s[i] = c[k1] == v1 && c[k2] == v2
			} else {
				s[i] = c[k1] == v1 || c[k2] == v2
			}
		}
		if !s.Empty() {
			sets = append(sets, s)
		}
	}
	for n, s := range sets {
		care := all
		if n%2 == 1 {
			care = make(Set, g.Size())
			for i := range care {
				care[i] = rng.IntN(3) > 0
			}
		}
		cond := g.Cond(s, care)
		for i := range g.Size() {
			if !care[i] {
				continue
			}
			if got := evalCond(t, g, cond, g.Combo(i)); got != s[i] {
				t.Fatalf("set %d: condition %q is %v for %s, want %v", n, cond, got, g.Describe(g.Combo(i)), s[i])
			}
		}
	}

	tls := slices.IndexFunc(g.Dims, func(d Dimension) bool { return d.Name == "nats.tls" })
	s := make(Set, g.Size())
	for i := range s {
		s[i] = g.Combo(i)[tls] == 1
	}
	if got, want := g.Cond(s, all), ".Values.nats.tls.enabled"; got != want {
		t.Errorf("the combinations with TLS: condition %q, want %q", got, want)
	}
	if got := g.Cond(all, all); got != "" {
		t.Errorf("every combination: condition %q, want none", got)
	}
}

// TestMerge checks that selecting a combination's lines from a merge gives
// back its variant exactly, for variants that share, drop, add and
// reorder lines.
func TestMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	words := []string{"a", "b", "c", "d", "", "  e", "f"}
	for round := range 200 {
		n := 1 + rng.IntN(5)
		variants := make([]Variant, n)
		for v := range variants {
			lines := make([]string, rng.IntN(12))
			for i := range lines {
				lines[i] = words[rng.IntN(len(words))]
			}
			in := make(Set, n)
			in[v] = true
			variants[v] = Variant{Lines: lines, In: in}
		}
		merged := Merge(variants)
		for v, want := range variants {
			if got := Select(merged, v); !slices.Equal(got, want.Lines) && !(len(got) == 0 && len(want.Lines) == 0) {
				t.Fatalf("round %d: variant %d is %q, selected %q", round, v, want.Lines, got)
			}
		}
	}
}
