package archive_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/headwater-gitops/headwater/pkg/archive"
)

// ftree is a source tree for merge tests: slash path -> content for files,
// and "<dir>/" -> "" for directories that must exist even when empty.
// Content starting with "#!" makes an executable file.
type ftree map[string]string

// writeFTree writes tr under a new directory and returns it.
func writeFTree(t testing.TB, tr ftree) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range tr {
		full := filepath.Join(root, filepath.FromSlash(strings.TrimSuffix(p, "/")))
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(content, "#!") {
			mode = 0o755
		}
		if err := os.WriteFile(full, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(full, mode); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// tarOf is the staging tar of tr, as the fetcher writes it.
func tarOf(t testing.TB, tr ftree) []byte {
	t.Helper()
	b, _ := writeTar(t, writeFTree(t, tr), archive.TarOptions{})
	return b
}

// include is a layer of a test case: a tree and where it goes.
type include struct {
	tree     ftree
	from, to string
}

// merge merges base with the includes laid over it.
func merge(t testing.TB, base ftree, incs ...include) ([]byte, archive.Stats, error) {
	t.Helper()
	layers := []archive.Layer{{Tar: bytes.NewReader(tarOf(t, base))}}
	for _, in := range incs {
		layers = append(layers, archive.Layer{Tar: bytes.NewReader(tarOf(t, in.tree)), From: in.from, To: in.to})
	}
	var out bytes.Buffer
	st, err := archive.Merge(&out, layers)
	return out.Bytes(), st, err
}

var (
	parentTree = ftree{
		"README.md":            "# parent\n",
		"a/x.txt":              "x\n",
		"a.txt":                "a file beside a\n",
		"d-x":                  "dash\n",
		"d.txt":                "dot\n",
		"deploy/app.yaml":      "kind: Deployment\n",
		"deploy/old/gone.yaml": "old\n",
		"z/keep":               "keep\n",
	}
	includedTree = ftree{
		"kustomization.yaml": "resources: []\n",
		"base/svc.yaml":      "kind: Service\n",
		"base/deep/d.yaml":   "deep\n",
		"bin/run.sh":         "#!/bin/sh\n",
		"empty/":             "",
	}
	otherTree = ftree{
		"svc.yaml": "kind: Service # other\n",
		"o.txt":    "other\n",
	}
)

// with returns a copy of base with the changes applied: a key with value
// "-" is removed along with everything below it.
func with(base ftree, changes ftree) ftree {
	out := ftree{}
	for k, v := range base {
		out[k] = v
	}
	// Removals first, then additions.
	for k, v := range changes {
		if v != "-" {
			continue
		}
		for kk := range out {
			if kk == k || strings.HasPrefix(kk, strings.TrimSuffix(k, "/")+"/") {
				delete(out, kk)
			}
		}
	}
	for k, v := range changes {
		if v != "-" {
			out[k] = v
		}
	}
	return out
}

func TestMerge(t *testing.T) {
	tests := []struct {
		name string
		incs []include
		want ftree
	}{{
		name: "no includes",
		want: parentTree,
	}, {
		name: "whole artifact at a new directory",
		incs: []include{{tree: includedTree, to: "inc"}},
		want: with(parentTree, ftree{
			"inc/kustomization.yaml": "resources: []\n",
			"inc/base/svc.yaml":      "kind: Service\n",
			"inc/base/deep/d.yaml":   "deep\n",
			"inc/bin/run.sh":         "#!/bin/sh\n",
			"inc/empty/":             "",
		}),
	}, {
		name: "a subdirectory",
		incs: []include{{tree: includedTree, from: "base", to: "lib"}},
		want: with(parentTree, ftree{"lib/svc.yaml": "kind: Service\n", "lib/deep/d.yaml": "deep\n"}),
	}, {
		name: "nested toPath makes its parents",
		incs: []include{{tree: includedTree, from: "base/deep", to: "x/y/z"}},
		want: with(parentTree, ftree{"x/y/z/d.yaml": "deep\n"}),
	}, {
		name: "nested toPath in an existing directory",
		incs: []include{{tree: includedTree, from: "base", to: "a/lib"}},
		want: with(parentTree, ftree{"a/lib/svc.yaml": "kind: Service\n", "a/lib/deep/d.yaml": "deep\n"}),
	}, {
		name: "replaces a directory of the parent",
		incs: []include{{tree: includedTree, from: "base", to: "deploy"}},
		want: with(parentTree, ftree{"deploy/": "-", "deploy/svc.yaml": "kind: Service\n", "deploy/deep/d.yaml": "deep\n"}),
	}, {
		name: "replaces a file of the parent with a directory",
		incs: []include{{tree: otherTree, to: "a.txt"}},
		want: with(parentTree, ftree{"a.txt": "-", "a.txt/svc.yaml": "kind: Service # other\n", "a.txt/o.txt": "other\n"}),
	}, {
		name: "a single file",
		incs: []include{{tree: includedTree, from: "kustomization.yaml", to: "deploy/kustomization.yaml"}},
		want: with(parentTree, ftree{"deploy/kustomization.yaml": "resources: []\n"}),
	}, {
		name: "names that sort around the directory",
		incs: []include{{tree: otherTree, to: "d"}},
		want: with(parentTree, ftree{"d/svc.yaml": "kind: Service # other\n", "d/o.txt": "other\n"}),
	}, {
		name: "a later include replaces part of an earlier one",
		incs: []include{
			{tree: includedTree, to: "vendor"},
			{tree: otherTree, to: "vendor/base"},
		},
		want: with(parentTree, ftree{
			"vendor/kustomization.yaml": "resources: []\n",
			"vendor/base/svc.yaml":      "kind: Service # other\n",
			"vendor/base/o.txt":         "other\n",
			"vendor/bin/run.sh":         "#!/bin/sh\n",
			"vendor/empty/":             "",
		}),
	}, {
		name: "two includes side by side share their parents",
		incs: []include{
			{tree: otherTree, to: "apps/one"},
			{tree: otherTree, from: "o.txt", to: "apps/two/o.txt"},
		},
		want: with(parentTree, ftree{
			"apps/one/svc.yaml": "kind: Service # other\n",
			"apps/one/o.txt":    "other\n",
			"apps/two/o.txt":    "other\n",
		}),
	}, {
		name: "the same path twice: the last wins",
		incs: []include{
			{tree: includedTree, from: "base", to: "same"},
			{tree: otherTree, to: "same"},
		},
		want: with(parentTree, ftree{"same/svc.yaml": "kind: Service # other\n", "same/o.txt": "other\n"}),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, st, err := merge(t, parentTree, tc.incs...)
			if err != nil {
				t.Fatalf("Merge: %v", err)
			}
			// The merge is byte for byte the staging tar of the tree it
			// makes: same entries, same canonical order, same headers.
			want := tarOf(t, tc.want)
			if !bytes.Equal(got, want) {
				t.Errorf("merged entries %q\nwant the tar of the expected tree %q",
					names(readTar(t, bytes.NewReader(got))), names(readTar(t, bytes.NewReader(want))))
			}
			files := 0
			for p := range tc.want {
				if !strings.HasSuffix(p, "/") {
					files++
				}
			}
			if st.Files != files {
				t.Errorf("stats count %d files, want %d", st.Files, files)
			}
			checkNormalised(t, readTar(t, bytes.NewReader(got)))
		})
	}
}

func TestMergeIsDeterministic(t *testing.T) {
	inc := []include{{tree: includedTree, from: "base", to: "deploy"}, {tree: otherTree, to: "x/y"}}
	first, _, err := merge(t, parentTree, inc...)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		again, _, err := merge(t, parentTree, inc...)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, again) {
			t.Fatal("two merges of the same layers differ")
		}
	}
	// Through Canonicalize, the same digest as the expected tree's.
	_, got := canonicalize(t, first, archive.CanonicalOptions{})
	want := with(parentTree, ftree{"deploy/": "-", "deploy/svc.yaml": "kind: Service\n", "deploy/deep/d.yaml": "deep\n",
		"x/y/svc.yaml": "kind: Service # other\n", "x/y/o.txt": "other\n"})
	_, exp := canonicalize(t, tarOf(t, want), archive.CanonicalOptions{})
	if got.Digest != exp.Digest {
		t.Errorf("digest %s, want %s (the expected tree's)", got.Digest, exp.Digest)
	}
}

func TestMergeErrors(t *testing.T) {
	file := func(name, body string) tarEntry {
		return tarEntry{name: name, typ: tar.TypeReg, mode: 0o644, body: body}
	}
	dir := func(name string) tarEntry { return tarEntry{name: name, typ: tar.TypeDir, mode: 0o755} }
	raw := func(es ...tarEntry) []byte { return makeTar(t, tar.FormatPAX, es...) }
	good := tarOf(t, otherTree)
	tests := []struct {
		name   string
		layers []archive.Layer
		layer  int
		want   error
	}{
		{"unsorted included artifact", []archive.Layer{
			{Tar: bytes.NewReader(good)},
			{Tar: bytes.NewReader(raw(file("b", "b"), file("a", "a"))), To: "inc"},
		}, 1, archive.ErrNotCanonical},
		{"sorted as strings, not as a walk", []archive.Layer{
			{Tar: bytes.NewReader(raw(file("a.txt", "x"), dir("a/"), file("a/b", "y")))},
		}, 0, archive.ErrNotCanonical},
		{"a name twice", []archive.Layer{
			{Tar: bytes.NewReader(raw(dir("a/"), dir("a")))},
		}, 0, archive.ErrNotCanonical},
		{"unsafe entry", []archive.Layer{
			{Tar: bytes.NewReader(good)},
			{Tar: bytes.NewReader(raw(file("../evil", "x"))), To: "inc"},
		}, 1, archive.ErrUnsafePath},
		{"absolute entry", []archive.Layer{
			{Tar: bytes.NewReader(raw(file("/etc/passwd", "x")))},
		}, 0, archive.ErrUnsafePath},
		{"toPath climbing out", []archive.Layer{
			{Tar: bytes.NewReader(good)},
			{Tar: bytes.NewReader(good), To: "../out"},
		}, 1, archive.ErrUnsafePath},
		{"absolute toPath", []archive.Layer{
			{Tar: bytes.NewReader(good)},
			{Tar: bytes.NewReader(good), To: "/etc"},
		}, 1, archive.ErrUnsafePath},
		{"unclean toPath", []archive.Layer{
			{Tar: bytes.NewReader(good)},
			{Tar: bytes.NewReader(good), To: "a/./b"},
		}, 1, archive.ErrUnsafePath},
		{"fromPath climbing out", []archive.Layer{
			{Tar: bytes.NewReader(good)},
			{Tar: bytes.NewReader(good), From: "x/../../y", To: "inc"},
		}, 1, archive.ErrUnsafePath},
		{"fromPath not in the artifact", []archive.Layer{
			{Tar: bytes.NewReader(good)},
			{Tar: bytes.NewReader(good), From: "nope", To: "inc"},
		}, 1, archive.ErrPathNotFound},
		{"a file where the include needs a directory", []archive.Layer{
			{Tar: bytes.NewReader(good)},
			{Tar: bytes.NewReader(good), To: "o.txt/inside"},
		}, 1, archive.ErrPathConflict},
		{"a file as the root", []archive.Layer{
			{Tar: bytes.NewReader(good)},
			{Tar: bytes.NewReader(good), From: "o.txt"},
		}, 1, archive.ErrPathConflict},
		{"truncated included artifact", []archive.Layer{
			{Tar: bytes.NewReader(good)},
			{Tar: bytes.NewReader(raw(file("big", strings.Repeat("x", 4096)))[:1024]), To: "inc"},
		}, 1, io.ErrUnexpectedEOF},
		{"a reader failing at its end", []archive.Layer{
			{Tar: bytes.NewReader(good)},
			{Tar: io.MultiReader(bytes.NewReader(good), errReader{errAtEnd}), To: "inc"},
		}, 1, errAtEnd},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := archive.Merge(io.Discard, tc.layers)
			var le *archive.LayerError
			if !errors.As(err, &le) || le.Layer != tc.layer || !errors.Is(err, tc.want) {
				t.Fatalf("Merge error = %v, want a LayerError of layer %d wrapping %v", err, tc.layer, tc.want)
			}
		})
	}
}

var errAtEnd = errors.New("digest mismatch")

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestMergeWriteErrorIsNotALayerError(t *testing.T) {
	_, err := archive.Merge(failingWriter{}, []archive.Layer{{Tar: bytes.NewReader(tarOf(t, parentTree))}})
	var le *archive.LayerError
	if err == nil || errors.As(err, &le) {
		t.Fatalf("Merge error = %v, want the writer's error, not a LayerError", err)
	}
}

// TestMergeRandom checks Merge against a model on random trees and layers:
// the merged tar must be the staging tar of the tree the model expects, or
// Merge must fail with ErrPathConflict exactly when the model finds one.
func TestMergeRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	segs := []string{"a", "a-b", "a.b", "b", "B", "a b"}
	randPath := func(depth int) string {
		n := 1 + rng.IntN(depth)
		p := make([]string, n)
		for i := range p {
			p[i] = segs[rng.IntN(len(segs))]
		}
		return strings.Join(p, "/")
	}
	randTree := func() ftree {
		tr := ftree{}
		for range 1 + rng.IntN(8) {
			p := randPath(3)
			// Skip a path that is a file's descendant or a directory.
			clash := false
			for q := range tr {
				q = strings.TrimSuffix(q, "/")
				if strings.HasPrefix(p, q+"/") || strings.HasPrefix(q, p+"/") || q == p {
					clash = true
				}
			}
			if clash {
				continue
			}
			if rng.IntN(6) == 0 {
				tr[p+"/"] = ""
			} else {
				tr[p] = fmt.Sprintf("content of %s %d", p, rng.IntN(3))
			}
		}
		return tr
	}
	conflicts := 0
	for iter := range 120 {
		base := randTree()
		var incs []include
		for range rng.IntN(3) + 1 {
			tr := randTree()
			var from string
			if rng.IntN(2) == 0 {
				entries := entriesOf(tr)
				from = entries[rng.IntN(len(entries))].name
			}
			incs = append(incs, include{tree: tr, from: from, to: randPath(3)})
		}
		want, conflict := mergeModel(base, incs)
		if conflict {
			conflicts++
		}
		got, _, err := merge(t, base, incs...)
		switch {
		case conflict:
			if !errors.Is(err, archive.ErrPathConflict) {
				t.Fatalf("iteration %d: base %v includes %+v: error %v, want a path conflict", iter, base, incs, err)
			}
		case err != nil:
			t.Fatalf("iteration %d: base %v includes %+v: %v", iter, base, incs, err)
		case !bytes.Equal(got, tarOf(t, want)):
			t.Fatalf("iteration %d: base %v includes %+v:\nmerged %q\nwant   %q", iter, base, incs,
				names(readTar(t, bytes.NewReader(got))), names(readTar(t, bytes.NewReader(tarOf(t, want)))))
		}
	}
	t.Logf("%d of 120 merges had a path conflict", conflicts)
}

type modelEntry struct {
	name    string
	dir     bool
	content string
}

// entriesOf lists a tree's entries, directories included, as WriteTar would.
func entriesOf(tr ftree) []modelEntry {
	seen := map[string]modelEntry{}
	for p, c := range tr {
		isDir := strings.HasSuffix(p, "/")
		p = strings.TrimSuffix(p, "/")
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			seen[d] = modelEntry{name: d, dir: true}
		}
		seen[p] = modelEntry{name: p, dir: isDir, content: c}
	}
	out := make([]modelEntry, 0, len(seen))
	for _, e := range seen {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// mergeModel is what Merge promises, computed the slow way: every layer's
// entries renamed, those a later layer replaces dropped, the rest must not
// be a file in one layer and a directory in another.
func mergeModel(base ftree, incs []include) (ftree, bool) {
	type layer struct {
		entries  []modelEntry
		from, to string
	}
	layers := []layer{{entries: entriesOf(base)}}
	for _, in := range incs {
		layers = append(layers, layer{entries: entriesOf(in.tree), from: in.from, to: in.to})
	}
	under := func(name, dir string) (string, bool) {
		switch {
		case dir == "":
			return name, true
		case name == dir:
			return "", true
		case strings.HasPrefix(name, dir+"/"):
			return strings.TrimPrefix(name, dir+"/"), true
		}
		return "", false
	}
	final := map[string]modelEntry{}
	conflict := false
	for i, l := range layers {
		var out []modelEntry
		if l.to != "" {
			segs := strings.Split(l.to, "/")
			for n := 1; n < len(segs); n++ {
				out = append(out, modelEntry{name: strings.Join(segs[:n], "/"), dir: true})
			}
			if l.from == "" {
				out = append(out, modelEntry{name: l.to, dir: true})
			}
		}
		for _, e := range l.entries {
			rel, ok := under(e.name, l.from)
			if !ok {
				continue
			}
			e.name = path.Join(l.to, rel)
			if e.name == "" {
				continue
			}
			out = append(out, e)
		}
	next:
		for _, e := range out {
			for _, later := range layers[i+1:] {
				if _, ok := under(e.name, later.to); ok {
					continue next
				}
			}
			if prev, ok := final[e.name]; ok && (!prev.dir || !e.dir) {
				conflict = true
			}
			final[e.name] = e
		}
	}
	tr := ftree{}
	for _, e := range final {
		if e.dir {
			tr[e.name+"/"] = ""
		} else {
			tr[e.name] = e.content
		}
	}
	return tr, conflict
}

// TestCanonicalOrderMatchesWalk checks Merge's idea of canonical order
// against WriteTar's on names that sort differently as plain strings.
func TestCanonicalOrderMatchesWalk(t *testing.T) {
	tr := ftree{"a/b": "1", "a-b": "2", "a.b": "3", "a b/c": "4", "ab/c": "5", "a/b c": "6", "A": "7"}
	staged := tarOf(t, tr)
	var out bytes.Buffer
	if _, err := archive.Merge(&out, []archive.Layer{{Tar: bytes.NewReader(staged)}}); err != nil {
		t.Fatalf("Merge rejects WriteTar's order: %v", err)
	}
	got := names(readTar(t, bytes.NewReader(out.Bytes())))
	want := names(readTar(t, bytes.NewReader(staged)))
	if !slices.Equal(got, want) {
		t.Errorf("order %q, want %q", got, want)
	}
}

func TestOnReadError(t *testing.T) {
	broken := errors.New("connection reset")
	var got []error
	r := archive.OnReadError(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(broken)), func(err error) { got = append(got, err) })
	b, err := io.ReadAll(r)
	if string(b) != "abc" || !errors.Is(err, broken) {
		t.Fatalf("ReadAll = %q, %v; want abc and the reader's error", b, err)
	}
	if len(got) != 1 || got[0] != broken {
		t.Errorf("handed %v, want the reader's error once", got)
	}

	got = nil
	if _, err := io.ReadAll(archive.OnReadError(strings.NewReader("abc"), func(err error) { got = append(got, err) })); err != nil || got != nil {
		t.Errorf("a reader that ends with EOF handed %v (ReadAll: %v)", got, err)
	}
}
