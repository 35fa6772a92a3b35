package ignore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzFilter loads arbitrary spec.ignore rules against a small tree and asks
// about arbitrary paths: it must never panic, and a rule set that excludes
// everything ("/*" then nothing brought back) must exclude every file.
func FuzzFilter(f *testing.F) {
	for _, seed := range [][2]string{
		{"*.md\n", "README.md"},
		{"/*\n!/deploy\n", "deploy/app.yaml"},
		{"**/secret*\n!keep/**\n", "keep/secret.txt"},
		{"[a-\n\\\n!\n/\n", "a/b/c"},
		{"", ".git/config"},
	} {
		f.Add(seed[0], seed[1])
	}
	root := f.TempDir()
	for _, p := range []string{"README.md", "deploy/app.yaml", "keep/secret.txt", "a/b/c"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			f.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte("x"), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, rules, path string) {
		filter, err := Load(root, &rules)
		if err != nil {
			return
		}
		rel := strings.Trim(filepath.ToSlash(filepath.Clean("/"+path)), "/")
		if rel == "" {
			return
		}
		_ = filter.Exclude(rel, false)
		_ = filter.Exclude(rel, true)
		everything, err := Load(root, ptr("/*\n"))
		if err != nil {
			t.Fatal(err)
		}
		if !everything.Exclude(rel, false) {
			t.Errorf("/* keeps %q", rel)
		}
	})
}

func ptr(s string) *string { return &s }
