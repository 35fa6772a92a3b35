package main

import (
	"slices"
	"strings"
)

// A Set is a set of combinations of a Grid, indexed by Grid.Index.
type Set []bool

// All reports whether s holds every combination.
func (s Set) All() bool { return !slices.Contains(s, false) }

// Empty reports whether s holds no combination.
func (s Set) Empty() bool { return !slices.Contains(s, true) }

// Count is the number of combinations in s.
func (s Set) Count() int {
	n := 0
	for _, in := range s {
		if in {
			n++
		}
	}
	return n
}

// Union returns s ∪ o.
func (s Set) Union(o Set) Set {
	u := make(Set, len(s))
	for i := range s {
		u[i] = s[i] || o[i]
	}
	return u
}

// Not returns the complement of s.
func (s Set) Not() Set {
	n := make(Set, len(s))
	for i := range s {
		n[i] = !s[i]
	}
	return n
}

// SubsetOf reports whether s ⊆ o.
func (s Set) SubsetOf(o Set) bool {
	for i := range s {
		if s[i] && !o[i] {
			return false
		}
	}
	return true
}

// Cond returns a template condition that holds exactly for the
// combinations of s among those of care (the others do not matter: an
// object's lines need only be right where the object is rendered), and
// "" when it holds for all of care. It picks the shorter of the two
// exact answers: s alone, and s with every combination outside care.
func (g Grid) Cond(s, care Set) string {
	if care.SubsetOf(s) {
		return ""
	}
	best := g.exact(s)
	if wide := g.exact(s.Union(care.Not())); wide != "" && len(wide) < len(best) {
		best = wide
	}
	return best
}

// exact returns a condition that holds exactly for the combinations of s
// ("" for all of them).
func (g Grid) exact(s Set) string {
	if s.All() {
		return ""
	}
	// The dimensions s depends on: those where changing the value alone
	// changes membership.
	var relevant []int
	for k, d := range g.Dims {
		depends := false
		for i := 0; i < len(s) && !depends; i++ {
			c := g.Combo(i)
			for v := range d.Values {
				alt := slices.Clone(c)
				alt[k] = v
				if s[g.Index(alt)] != s[i] {
					depends = true
					break
				}
			}
		}
		if depends {
			relevant = append(relevant, k)
		}
	}
	// s, as the tuples of values of the relevant dimensions it holds
	// (every other dimension at its first value: s does not depend on it).
	var tuples [][]int
	g.eachTuple(relevant, func(t []int) {
		c := make(Combo, len(g.Dims))
		for j, k := range relevant {
			c[k] = t[j]
		}
		if s[g.Index(c)] {
			tuples = append(tuples, slices.Clone(t))
		}
	})
	return g.cover(relevant, tuples)
}

// eachTuple calls f with every tuple of values of the dimensions dims.
func (g Grid) eachTuple(dims []int, f func([]int)) {
	t := make([]int, len(dims))
	var walk func(j int)
	walk = func(j int) {
		if j == len(dims) {
			f(t)
			return
		}
		for v := range g.Dims[dims[j]].Values {
			t[j] = v
			walk(j + 1)
		}
	}
	walk(0)
}

// cover returns a condition that holds for exactly the tuples (of values
// of dims): their product form where they are one, otherwise split on the
// dimension with the fewest values taken, grouping the values whose
// remaining tuples are the same.
func (g Grid) cover(dims []int, tuples [][]int) string {
	if len(dims) == 0 {
		return ""
	}
	proj := make([][]int, len(dims))
	for j := range dims {
		for _, t := range tuples {
			if !slices.Contains(proj[j], t[j]) {
				proj[j] = append(proj[j], t[j])
			}
		}
		slices.Sort(proj[j])
	}
	product := 1
	for _, p := range proj {
		product *= len(p)
	}
	if product == len(tuples) {
		var terms []string
		for j, k := range dims {
			if len(proj[j]) < len(g.Dims[k].Values) {
				terms = append(terms, g.in(k, proj[j]))
			}
		}
		return join("and", terms)
	}
	split := 0
	for j := range dims {
		if len(proj[j]) < len(proj[split]) {
			split = j
		}
	}
	rest := slices.Delete(slices.Clone(dims), split, split+1)
	// The tuples of the other dimensions, per value of the split one.
	sub := map[int][][]int{}
	for _, t := range tuples {
		sub[t[split]] = append(sub[t[split]], slices.Delete(slices.Clone(t), split, split+1))
	}
	var terms []string
	done := map[int]bool{}
	for _, v := range proj[split] {
		if done[v] {
			continue
		}
		same := []int{v}
		for _, w := range proj[split] {
			if w != v && !done[w] && slices.EqualFunc(sub[v], sub[w], slices.Equal) {
				same = append(same, w)
			}
		}
		for _, w := range same {
			done[w] = true
		}
		terms = append(terms, join("and", []string{g.in(dims[split], same), g.cover(rest, sub[v])}))
	}
	return join("or", terms)
}

// in returns the condition that dimension k has one of the values vs.
func (g Grid) in(k int, vs []int) string {
	d := g.Dims[k]
	if len(vs) == len(d.Values)-1 && len(d.Values) > 2 {
		// One value left out: say which.
		for v := range d.Values {
			if !slices.Contains(vs, v) {
				return "not (" + d.Cond(d.Values[v]) + ")"
			}
		}
	}
	terms := make([]string, len(vs))
	for i, v := range vs {
		terms[i] = d.Cond(d.Values[v])
	}
	return join("or", terms)
}

// join combines conditions with the template function and or or,
// dropping empty ones (true) and parenthesizing compound operands.
func join(op string, terms []string) string {
	var ts []string
	for _, t := range terms {
		if t == "" {
			if op == "or" {
				return ""
			}
			continue
		}
		ts = append(ts, t)
	}
	switch len(ts) {
	case 0:
		return ""
	case 1:
		return ts[0]
	}
	for i, t := range ts {
		if strings.Contains(t, " ") {
			ts[i] = "(" + t + ")"
		}
	}
	return op + " " + strings.Join(ts, " ")
}
