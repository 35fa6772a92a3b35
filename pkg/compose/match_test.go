package compose

import (
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"a/b", "a/b", true},
		{"a/b", "a/c", false},
		{"a/*.yaml", "a/x.yaml", true},
		{"a/*.yaml", "a/b/x.yaml", false},
		{"a/**", "a", true},
		{"a/**", "a/b/c/d", true},
		{"**", "", true},
		{"**", "x/y", true},
		{"**/*.yaml", "x.yaml", true},
		{"**/*.yaml", "x/y/z.yaml", true},
		{"**/*.yaml", "x/y/z.yml", false},
		{"a/**/b", "a/b", true},
		{"a/**/b", "a/x/y/b", true},
		{"a/**/b", "a/x/y/c", false},
		{"a/**/b/**/c", "a/b/c", true},
		{"a/**/b/**/c", "a/x/b/y/z/c", true},
		{"a/**/b/**/c", "a/x/c/y/b", false},
		{"**/**", "x", true},
		{"a/?/c", "a/b/c", true},
		{"a/[bc]/d", "a/c/d", true},
		{"a/[bc]/d", "a/e/d", false},
		{"a/b/c", "a/b", false},
		{"a/b", "a/b/c", false},
	} {
		if got := match(c.pattern, c.name); got != c.want {
			t.Errorf("match(%q, %q) = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
}

// pathological is a 20-fold "**" glob that a 24-deep path does not match
// (its last segment differs): a backtracking matcher tries every way of
// sharing the 24 segments among the 20 "**", a number in the billions.
func pathological() (pattern, name string) {
	pattern = strings.Repeat("**/", 20) + "x.yaml"
	name = strings.Repeat("d/", 24) + "y.yaml"
	return pattern, name
}

// TestMatchIsLinear bounds the segment comparisons of the pathological
// glob: at most one per (pattern segment, name segment) pair.
func TestMatchIsLinear(t *testing.T) {
	pattern, name := pathological()
	pat, segs := strings.Split(pattern, "/"), strings.Split(name, "/")
	ok, steps := matchSegs(pat, segs)
	if ok {
		t.Fatalf("match(%q, %q) = true", pattern, name)
	}
	if bound := len(pat) * len(segs); steps > bound {
		t.Errorf("%d segment comparisons, want at most %d", steps, bound)
	}
	// The same with a match at the end.
	ok, steps = matchSegs(pat, strings.Split(strings.Repeat("d/", 24)+"x.yaml", "/"))
	if !ok {
		t.Errorf("the pathological glob does not match a path it should")
	}
	if bound := len(pat) * len(segs); steps > bound {
		t.Errorf("%d segment comparisons, want at most %d", steps, bound)
	}
}

func BenchmarkMatchPathological(b *testing.B) {
	pattern, name := pathological()
	for b.Loop() {
		match(pattern, name)
	}
}
