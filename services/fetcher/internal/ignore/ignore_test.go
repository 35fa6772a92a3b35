package ignore

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"

	"github.com/headwater-gitops/headwater/pkg/archive"
)

func TestFilter(t *testing.T) {
	tree := map[string]string{
		"README.md":                   "",
		"deploy/app.yaml":             "",
		"deploy/logo.png":             "",
		".gitignore":                  "",
		".github/workflows/ci.yaml":   "",
		".sops.yaml":                  "",
		"sub/.sops.yaml":              "",
		"docs/guide.md":               "",
		"docs/keep.md":                "",
		"secrets/token.txt":           "",
		"apps/a/values.yaml":          "",
		"apps/a/values.local.yaml":    "",
		"apps/b/values.local.yaml":    "",
		"apps/a/.sourceignore.sample": "",
	}
	ptr := func(s string) *string { return &s }
	cases := []struct {
		name        string
		sourceignor map[string]string // extra files, e.g. .sourceignore
		spec        *string
		want        []string
	}{
		{
			name: "defaults without any pattern",
			want: []string{"README.md", "apps/a/.sourceignore.sample", "apps/a/values.local.yaml", "apps/a/values.yaml",
				"apps/b/values.local.yaml", "deploy/app.yaml", "docs/guide.md", "docs/keep.md", "secrets/token.txt"},
		},
		{
			name: "spec.ignore replaces the defaults but not the VCS patterns",
			spec: ptr("/secrets/\n# a comment\n*.md\n"),
			want: []string{".github/workflows/ci.yaml", ".sops.yaml", "apps/a/.sourceignore.sample", "apps/a/values.local.yaml",
				"apps/a/values.yaml", "apps/b/values.local.yaml", "deploy/app.yaml", "deploy/logo.png", "sub/.sops.yaml"},
		},
		{
			name:        "root .sourceignore, negation inside an ignored directory",
			sourceignor: map[string]string{".sourceignore": "docs/\n!docs/keep.md\n"},
			want: []string{".github/workflows/ci.yaml", ".sops.yaml", ".sourceignore", "README.md", "apps/a/.sourceignore.sample",
				"apps/a/values.local.yaml", "apps/a/values.yaml", "apps/b/values.local.yaml", "deploy/app.yaml", "deploy/logo.png",
				"docs/keep.md", "secrets/token.txt", "sub/.sops.yaml"},
		},
		{
			name:        ".sourceignore in a subdirectory is scoped to it, spec.ignore adds",
			sourceignor: map[string]string{"apps/a/.sourceignore": "*.local.yaml\n"},
			spec:        ptr(".github/\n.sops.yaml\n*.png\n"),
			want: []string{"README.md", "apps/a/.sourceignore", "apps/a/.sourceignore.sample", "apps/a/values.yaml",
				"apps/b/values.local.yaml", "deploy/app.yaml", "docs/guide.md", "docs/keep.md", "secrets/token.txt"},
		},
		{
			name: "empty spec.ignore keeps the defaults",
			spec: ptr(""),
			want: []string{"README.md", "apps/a/.sourceignore.sample", "apps/a/values.local.yaml", "apps/a/values.yaml",
				"apps/b/values.local.yaml", "deploy/app.yaml", "docs/guide.md", "docs/keep.md", "secrets/token.txt"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, tree)
			write(t, root, tc.sourceignor)
			// A .git directory, as a plain clone would have.
			write(t, root, map[string]string{".git/HEAD": "ref: refs/heads/main\n", ".git/objects/pack/x.pack": ""})
			f, err := Load(root, tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if got := archived(t, root, f); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("archived files:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestPrunesIgnoredDirectories(t *testing.T) {
	root := t.TempDir()
	write(t, root, map[string]string{"vendor/a/b.go": "", "docs/x.md": "", "docs/keep.md": "", "main.go": ""})
	write(t, root, map[string]string{".sourceignore": "vendor/\ndocs/\n!docs/keep.md\n"})
	f, err := Load(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Exclude("vendor", true) {
		t.Errorf("vendor/ is walked although nothing below it is kept")
	}
	if f.Exclude("docs", true) {
		t.Errorf("docs/ is pruned although docs/keep.md is kept")
	}
}

func write(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// archived writes the staging tar of root with f and lists its files.
func archived(t *testing.T, root string, f *Filter) []string {
	t.Helper()
	var buf bytes.Buffer
	if _, err := archive.WriteTar(context.Background(), &buf, root, archive.TarOptions{Exclude: f.Exclude}); err != nil {
		t.Fatal(err)
	}
	var files []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			files = append(files, h.Name)
		}
	}
	sort.Strings(files)
	return files
}
