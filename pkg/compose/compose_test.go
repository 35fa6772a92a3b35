package compose

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/klauspost/compress/gzip"
)

// tree is a file tree: content by slash path.
type tree map[string]string

func writeTree(t *testing.T, tr tree) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range tr {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func readTree(t *testing.T, dir string) tree {
	t.Helper()
	out := tree{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func tarball(t *testing.T, tr tree) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, name := range slices.Sorted(maps.Keys(tr)) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(tr[name]))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(tr[name])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

func cp(from, to string, opts ...func(*swv1beta1.CopyOperation)) swv1beta1.CopyOperation {
	c := swv1beta1.CopyOperation{From: from, To: to}
	for _, o := range opts {
		o(&c)
	}
	return c
}

func strategy(s string) func(*swv1beta1.CopyOperation) {
	return func(c *swv1beta1.CopyOperation) { c.Strategy = s }
}

func exclude(e ...string) func(*swv1beta1.CopyOperation) {
	return func(c *swv1beta1.CopyOperation) { c.Exclude = e }
}

func TestBuild(t *testing.T) {
	repo := tree{
		"apps/a/deploy.yaml":    "a",
		"apps/a/README.md":      "readme a",
		"apps/a/sub/svc.yaml":   "svc a",
		"apps/b/deploy.yaml":    "b",
		"apps/b/values.yaml":    "replicas: 2\nimage:\n  tag: v2\n",
		"values.yaml":           "replicas: 1\nimage:\n  repo: r\n  tag: v1\n",
		"charts/c.tgz":          "", // replaced below
		"charts/notes.txt":      "not a tarball",
		"docs/guide/intro.md":   "intro",
		"docs/guide/setup.yaml": "setup",
	}
	repo["charts/c.tgz"] = tarball(t, tree{"c/Chart.yaml": "name: c", "c/templates/x.yaml": "x"})
	srcs := map[string]string{"repo": writeTree(t, repo), "other": writeTree(t, tree{"deploy.yaml": "other"})}

	tests := []struct {
		name string
		copy []swv1beta1.CopyOperation
		want tree
		err  error
	}{
		{"recursive glob keeps the path below its prefix",
			[]swv1beta1.CopyOperation{cp("@repo/apps/a/**", "@artifact/")},
			tree{"deploy.yaml": "a", "README.md": "readme a", "sub/svc.yaml": "svc a"}, nil},
		{"glob into a directory, excluding by name at any depth",
			[]swv1beta1.CopyOperation{cp("@repo/apps/**", "@artifact/out/", exclude("*.md", "sub"))},
			tree{"out/a/deploy.yaml": "a", "out/b/deploy.yaml": "b", "out/b/values.yaml": repo["apps/b/values.yaml"]}, nil},
		{"single-segment glob",
			[]swv1beta1.CopyOperation{cp("@repo/apps/*/deploy.yaml", "@artifact/")},
			tree{"a/deploy.yaml": "a", "b/deploy.yaml": "b"}, nil},
		{"file to a file", []swv1beta1.CopyOperation{cp("@repo/apps/a/deploy.yaml", "@artifact/x/y.yaml")}, tree{"x/y.yaml": "a"}, nil},
		{"file into a directory", []swv1beta1.CopyOperation{cp("@repo/apps/a/deploy.yaml", "@artifact/x/")}, tree{"x/deploy.yaml": "a"}, nil},
		{"directory into a directory keeps its name",
			[]swv1beta1.CopyOperation{cp("@repo/docs/guide", "@artifact/d/")},
			tree{"d/guide/intro.md": "intro", "d/guide/setup.yaml": "setup"}, nil},
		{"directory contents with a trailing slash",
			[]swv1beta1.CopyOperation{cp("@repo/docs/guide/", "@artifact/d/", exclude("*.md"))},
			tree{"d/setup.yaml": "setup"}, nil},
		{"later operations overwrite",
			[]swv1beta1.CopyOperation{cp("@repo/apps/a/deploy.yaml", "@artifact/deploy.yaml"), cp("@other/deploy.yaml", "@artifact/")},
			tree{"deploy.yaml": "other"}, nil},
		{"merge values as Helm does",
			[]swv1beta1.CopyOperation{cp("@repo/values.yaml", "@artifact/values.yaml"),
				cp("@repo/apps/b/values.yaml", "@artifact/values.yaml", strategy(swv1beta1.MergeStrategy))},
			tree{"values.yaml": "image:\n  repo: r\n  tag: v2\nreplicas: 2\n"}, nil},
		{"merge with nothing there copies",
			[]swv1beta1.CopyOperation{cp("@repo/apps/b/values.yaml", "@artifact/v.yaml", strategy(swv1beta1.MergeStrategy))},
			tree{"v.yaml": repo["apps/b/values.yaml"]}, nil},
		{"extract a tarball",
			[]swv1beta1.CopyOperation{cp("@repo/charts/c.tgz", "@artifact/charts/", strategy(swv1beta1.ExtractStrategy))},
			tree{"charts/c/Chart.yaml": "name: c", "charts/c/templates/x.yaml": "x"}, nil},
		{"extract by glob skips other files",
			[]swv1beta1.CopyOperation{cp("@repo/charts/*", "@artifact/", strategy(swv1beta1.ExtractStrategy))},
			tree{"c/Chart.yaml": "name: c", "c/templates/x.yaml": "x"}, nil},
		{"a glob matching nothing copies nothing", []swv1beta1.CopyOperation{cp("@repo/nope/**", "@artifact/")}, tree{}, nil},
		{"extract of a file that is no tarball",
			[]swv1beta1.CopyOperation{cp("@repo/charts/notes.txt", "@artifact/", strategy(swv1beta1.ExtractStrategy))}, nil, ErrBuild},
		{"merge of a file that is no YAML",
			[]swv1beta1.CopyOperation{cp("@repo/apps/a/README.md", "@artifact/r.md"), cp("@repo/apps/a/README.md", "@artifact/r.md", strategy(swv1beta1.MergeStrategy))},
			nil, ErrBuild},
		{"a literal path that is not there", []swv1beta1.CopyOperation{cp("@repo/apps/z/deploy.yaml", "@artifact/")}, nil, ErrBuild},
		{"a file where a directory is", []swv1beta1.CopyOperation{cp("@repo/apps/a/**", "@artifact/"), cp("@other/deploy.yaml", "@artifact/sub")}, nil, ErrBuild},
		{"escape in from", []swv1beta1.CopyOperation{cp("@repo/../etc/passwd", "@artifact/")}, nil, ErrInvalid},
		{"escape in a glob", []swv1beta1.CopyOperation{cp("@repo/apps/**/../../x", "@artifact/")}, nil, ErrInvalid},
		{"escape in to", []swv1beta1.CopyOperation{cp("@repo/apps/a/deploy.yaml", "@artifact/../x.yaml")}, nil, ErrInvalid},
		{"absolute from", []swv1beta1.CopyOperation{cp("@repo//etc/passwd", "@artifact/")}, nil, ErrInvalid},
		{"unknown alias", []swv1beta1.CopyOperation{cp("@nope/x", "@artifact/")}, nil, ErrInvalid},
		{"to another alias", []swv1beta1.CopyOperation{cp("@repo/values.yaml", "@repo/x")}, nil, ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			err := Build(context.Background(), out, srcs, swv1beta1.OutputArtifact{Name: "x", Copy: tc.copy}, Options{})
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := readTree(t, out); !maps.Equal(got, tc.want) {
				t.Errorf("tree = %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestBuildMaxFileSize(t *testing.T) {
	srcs := map[string]string{"repo": writeTree(t, tree{"big": "0123456789"})}
	err := Build(context.Background(), t.TempDir(), srcs,
		swv1beta1.OutputArtifact{Name: "x", Copy: []swv1beta1.CopyOperation{cp("@repo/big", "@artifact/")}}, Options{MaxFileSize: 5})
	if !errors.Is(err, ErrBuild) {
		t.Fatalf("err = %v, want ErrBuild", err)
	}
}

func TestValidate(t *testing.T) {
	ok := func() *swv1beta1.ArtifactGeneratorSpec {
		return &swv1beta1.ArtifactGeneratorSpec{
			Sources: []swv1beta1.SourceReference{{Alias: "repo", Kind: "GitRepository", Name: "r"}},
			OutputArtifacts: []swv1beta1.OutputArtifact{
				{Name: "a", Revision: "@repo", OriginRevision: "@repo", Copy: []swv1beta1.CopyOperation{cp("@repo/apps/a/**", "@artifact/")}},
				{Name: "b", Copy: []swv1beta1.CopyOperation{cp("@repo/apps/b/**", "@artifact/")}},
			},
		}
	}
	if err := Validate(ok()); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	tests := map[string]func(*swv1beta1.ArtifactGeneratorSpec){
		"two outputs of one name": func(s *swv1beta1.ArtifactGeneratorSpec) { s.OutputArtifacts[1].Name = "a" },
		"two sources of one alias": func(s *swv1beta1.ArtifactGeneratorSpec) {
			s.Sources = append(s.Sources, s.Sources[0])
		},
		"escaping glob":        func(s *swv1beta1.ArtifactGeneratorSpec) { s.OutputArtifacts[0].Copy[0].From = "@repo/../x/**" },
		"escaping destination": func(s *swv1beta1.ArtifactGeneratorSpec) { s.OutputArtifacts[0].Copy[0].To = "@artifact/a/../../x" },
		"escaping exclude":     func(s *swv1beta1.ArtifactGeneratorSpec) { s.OutputArtifacts[0].Copy[0].Exclude = []string{"../x"} },
		"unknown revision":     func(s *swv1beta1.ArtifactGeneratorSpec) { s.OutputArtifacts[0].Revision = "@nope" },
		"unknown strategy":     func(s *swv1beta1.ArtifactGeneratorSpec) { s.OutputArtifacts[0].Copy[0].Strategy = "Append" },
		"invalid name":         func(s *swv1beta1.ArtifactGeneratorSpec) { s.OutputArtifacts[0].Name = "A_b" },
		"bad glob":             func(s *swv1beta1.ArtifactGeneratorSpec) { s.OutputArtifacts[0].Copy[0].From = "@repo/apps/[a" },
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			s := ok()
			mutate(s)
			if err := Validate(s); !errors.Is(err, ErrInvalid) {
				t.Errorf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

// TestTreeDigestDeterministic: the same output built twice, from sources
// written in another order, hashes the same; a changed byte or executable
// bit changes the hash.
func TestTreeDigestDeterministic(t *testing.T) {
	art := swv1beta1.OutputArtifact{Name: "x", Copy: []swv1beta1.CopyOperation{cp("@repo/apps/**", "@artifact/")}}
	digest := func(tr tree, exec string) string {
		src := writeTree(t, tr)
		if exec != "" {
			if err := os.Chmod(filepath.Join(src, exec), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		out := t.TempDir()
		if err := Build(context.Background(), out, map[string]string{"repo": src}, art, Options{}); err != nil {
			t.Fatal(err)
		}
		d, err := TreeDigest(context.Background(), out)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	base := tree{"apps/a/x.yaml": "x", "apps/b/y.yaml": "y", "other/z": "z"}
	d1, d2 := digest(base, ""), digest(maps.Clone(base), "")
	if d1 != d2 || len(d1) != 64 {
		t.Fatalf("digests %q and %q differ", d1, d2)
	}
	if d := digest(tree{"apps/a/x.yaml": "x", "apps/b/y.yaml": "y", "other/z": "changed"}, ""); d != d1 {
		t.Errorf("a change outside the output changed its digest")
	}
	if d := digest(tree{"apps/a/x.yaml": "X", "apps/b/y.yaml": "y"}, ""); d == d1 {
		t.Errorf("a changed file kept the digest")
	}
	if d := digest(base, "apps/a/x.yaml"); d == d1 {
		t.Errorf("an executable bit kept the digest")
	}
}

func TestUnpackRefusesEscapes(t *testing.T) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	_ = tw.WriteHeader(&tar.Header{Name: "../evil", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	_ = zw.Close()
	dir := t.TempDir()
	if err := Unpack(&buf, filepath.Join(dir, "in"), 0, nil); !errors.Is(err, ErrBuild) {
		t.Fatalf("err = %v, want ErrBuild", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "evil")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("escaping entry written: %v", err)
	}
}

// TestUnpackNeeded: only the paths the copy operations read are unpacked,
// and the build from them is the build from the whole tree.
func TestUnpackNeeded(t *testing.T) {
	files := tree{"apps/a/x.yaml": "a", "apps/a/sub/y.yaml": "ay", "apps/b/x.yaml": "b", "values.yaml": "v: 1", "docs/r.md": "r"}
	art := swv1beta1.OutputArtifact{Name: "o", Copy: []swv1beta1.CopyOperation{
		cp("@repo/apps/a/**", "@artifact/"), cp("@repo/values.yaml", "@artifact/")}}
	needed := Needed([]swv1beta1.OutputArtifact{art}, nil)
	dir := t.TempDir()
	if err := Unpack(strings.NewReader(tarball(t, files)), dir, 0, needed["repo"].Keep); err != nil {
		t.Fatal(err)
	}
	want := tree{"apps/a/x.yaml": "a", "apps/a/sub/y.yaml": "ay", "values.yaml": "v: 1"}
	if got := readTree(t, dir); !maps.Equal(got, want) {
		t.Errorf("unpacked %v, want %v", got, want)
	}
	out := t.TempDir()
	if err := Build(context.Background(), out, map[string]string{"repo": dir}, art, Options{}); err != nil {
		t.Fatal(err)
	}
	if got := readTree(t, out); !maps.Equal(got, tree{"x.yaml": "a", "sub/y.yaml": "ay", "values.yaml": "v: 1"}) {
		t.Errorf("built %v", got)
	}
	if !(Paths{""}).Keep("anything/at/all", false) || (Paths{"apps/a"}).Keep("apps/ab/x", false) || !(Paths{"apps/a"}).Keep("apps", true) {
		t.Error("Keep")
	}
}
