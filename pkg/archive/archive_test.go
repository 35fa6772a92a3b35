package archive_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/headwater-gitops/headwater/pkg/archive"
)

// entry is one tar entry read back, with its content.
type entry struct {
	hdr     *tar.Header
	content string
}

// readTar reads every entry of an uncompressed tar stream.
func readTar(t testing.TB, r io.Reader) []entry {
	t.Helper()
	tr := tar.NewReader(r)
	var out []entry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("read tar: %v", err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read %s: %v", h.Name, err)
		}
		out = append(out, entry{hdr: h, content: string(b)})
	}
}

// readTarGz reads every entry of a gzip-compressed tar stream.
func readTarGz(t testing.TB, b []byte) []entry {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("gzip: %v", err)
	}
	defer zr.Close()
	return readTar(t, zr)
}

func names(es []entry) []string {
	var ns []string
	for _, e := range es {
		ns = append(ns, e.hdr.Name)
	}
	return ns
}

// checkNormalised asserts every header is normalised as the package promises.
func checkNormalised(t *testing.T, es []entry) {
	t.Helper()
	for _, e := range es {
		h := e.hdr
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: owner uid=%d gid=%d uname=%q gname=%q, want all zero", h.Name, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		if !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: mtime %v, want the epoch", h.Name, h.ModTime)
		}
		if !h.AccessTime.IsZero() || !h.ChangeTime.IsZero() {
			t.Errorf("%s: atime %v ctime %v, want none", h.Name, h.AccessTime, h.ChangeTime)
		}
		if len(h.PAXRecords) != 0 {
			t.Errorf("%s: extended records %v, want none", h.Name, h.PAXRecords)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if h.Mode != 0o755 || !strings.HasSuffix(h.Name, "/") || h.Size != 0 {
				t.Errorf("%s: dir mode %o size %d, want 0755, a trailing slash and size 0", h.Name, h.Mode, h.Size)
			}
		case tar.TypeReg:
			if h.Mode != 0o644 && h.Mode != 0o755 {
				t.Errorf("%s: file mode %o, want 0644 or 0755", h.Name, h.Mode)
			}
		default:
			t.Errorf("%s: type %q, want only regular files and directories", h.Name, h.Typeflag)
		}
	}
}

// tree describes a source tree: files (relative slash path -> content),
// executable files and empty directories.
type tree struct {
	files map[string]string
	exec  []string
	dirs  []string
}

// sampleTree covers the cases canonical order and normalisation care about:
// a directory "a" beside files "a-b" and "a.txt" (byte-wise, '-' < '.' < '/',
// so a sort of full paths would put "a/" last; WalkDir puts it first), nested
// directories, an executable, an empty directory and a second-level tree.
func sampleTree() tree {
	return tree{
		files: map[string]string{
			"a/x.txt":          "x in a\n",
			"a/sub/deep.txt":   "deep\n",
			"a-b":              "dash\n",
			"a.txt":            "beside the directory a\n",
			"bin/run.sh":       "#!/bin/sh\necho hi\n",
			"z/keep.txt":       "keep\n",
			"z/inner/more.txt": "more\n",
			"zero-length":      "",
		},
		exec: []string{"bin/run.sh"},
		dirs: []string{"empty"},
	}
}

// sampleOrder is the canonical order of sampleTree's entries.
var sampleOrder = []string{
	"a/", "a/sub/", "a/sub/deep.txt", "a/x.txt",
	"a-b", "a.txt",
	"bin/", "bin/run.sh",
	"empty/",
	"z/", "z/inner/", "z/inner/more.txt", "z/keep.txt",
	"zero-length",
}

// write creates tr under a new temporary directory, with symbolic links to a
// file inside the tree, to a directory inside, and to a file outside; it
// returns the root.
func (tr tree) write(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range tr.files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := fs.FileMode(0o644)
		if slices.Contains(tr.exec, p) {
			mode = 0o755
		}
		if err := os.WriteFile(full, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		// WriteFile's mode is subject to the umask; set it exactly.
		if err := os.Chmod(full, mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range tr.dirs {
		if err := os.MkdirAll(filepath.Join(root, filepath.FromSlash(d)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("outside the tree"), 0o644); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		"link-in":     "a.txt",
		"link-dir":    "a",
		"link-out":    outside,
		"a/link-up":   "../../",
		"a/link-abs":  "/etc",
		"link-broken": "does-not-exist",
	}
	for name, target := range links {
		link := filepath.Join(root, filepath.FromSlash(name))
		if _, err := os.Stat(filepath.Dir(link)); err != nil {
			continue // a tree without that directory
		}
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func writeTar(t testing.TB, root string, o archive.TarOptions) ([]byte, archive.Stats) {
	t.Helper()
	var buf bytes.Buffer
	st, err := archive.WriteTar(context.Background(), &buf, root, o)
	if err != nil {
		t.Fatalf("WriteTar: %v", err)
	}
	return buf.Bytes(), st
}

// walkOrder lists what filepath.WalkDir visits under root, as the tar names
// of regular files and directories.
func walkOrder(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			out = append(out, rel+"/")
		case d.Type().IsRegular():
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestWriteTarCanonicalOrderAndHeaders(t *testing.T) {
	tr := sampleTree()
	root := tr.write(t)
	b, st := writeTar(t, root, archive.TarOptions{})
	es := readTar(t, bytes.NewReader(b))

	got := names(es)
	if !slices.Equal(got, sampleOrder) {
		t.Errorf("entries:\n got %q\nwant %q", got, sampleOrder)
	}
	if want := walkOrder(t, root); !slices.Equal(got, want) {
		t.Errorf("entries are not in filepath.WalkDir order:\n got %q\nwant %q", got, want)
	}
	checkNormalised(t, es)

	var files int
	var bytesTotal int64
	for _, e := range es {
		name := e.hdr.Name
		if strings.HasPrefix(name, "link") || strings.Contains(name, "/link") {
			t.Errorf("symbolic link %s was archived", name)
		}
		if e.hdr.Typeflag != tar.TypeReg {
			continue
		}
		files++
		bytesTotal += int64(len(e.content))
		if want := tr.files[name]; e.content != want {
			t.Errorf("%s: content %q, want %q", name, e.content, want)
		}
		if e.hdr.Size != int64(len(tr.files[name])) {
			t.Errorf("%s: size %d, want %d", name, e.hdr.Size, len(tr.files[name]))
		}
		wantMode := int64(0o644)
		if slices.Contains(tr.exec, name) {
			wantMode = 0o755
		}
		if e.hdr.Mode != wantMode {
			t.Errorf("%s: mode %o, want %o", name, e.hdr.Mode, wantMode)
		}
	}
	if st.Files != len(tr.files) || files != len(tr.files) {
		t.Errorf("Stats.Files = %d, archived %d files, want %d", st.Files, files, len(tr.files))
	}
	if st.Bytes != bytesTotal {
		t.Errorf("Stats.Bytes = %d, want %d", st.Bytes, bytesTotal)
	}
}

func TestWriteTarDeterministic(t *testing.T) {
	tr := sampleTree()
	root := tr.write(t)
	first, _ := writeTar(t, root, archive.TarOptions{})
	second, _ := writeTar(t, root, archive.TarOptions{})
	if !bytes.Equal(first, second) {
		t.Fatal("the same tree written twice gave different bytes")
	}

	// The same content with other times, owners and non-exec permission
	// bits gives the same bytes.
	other := tr.write(t)
	perturb(t, other, tr)
	third, _ := writeTar(t, other, archive.TarOptions{})
	if !bytes.Equal(first, third) {
		t.Fatal("the same content with other mtimes, permissions or owners gave different bytes")
	}
}

// perturb changes everything about root that must not matter: modification
// times, permission bits other than "executable", and owners (when root).
func perturb(t *testing.T, root string, tr tree) {
	t.Helper()
	when := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			if err := os.Chmod(p, 0o700); err != nil {
				return err
			}
		case slices.Contains(tr.exec, rel):
			if err := os.Chmod(p, 0o700); err != nil {
				return err
			}
		default:
			if err := os.Chmod(p, 0o600); err != nil {
				return err
			}
		}
		if os.Geteuid() == 0 {
			if err := os.Lchown(p, 1234, 5678); err != nil {
				return err
			}
		}
		return os.Chtimes(p, when, when)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestWriteTarExclude(t *testing.T) {
	root := sampleTree().write(t)
	var asked []string
	o := archive.TarOptions{Exclude: func(rel string, isDir bool) bool {
		asked = append(asked, rel)
		switch rel {
		case "z":
			if !isDir {
				t.Errorf("Exclude(%q) called with isDir false", rel)
			}
			return true
		case "a/x.txt", "a.txt":
			if isDir {
				t.Errorf("Exclude(%q) called with isDir true", rel)
			}
			return true
		}
		return false
	}}
	b, st := writeTar(t, root, o)
	got := names(readTar(t, bytes.NewReader(b)))
	want := []string{"a/", "a/sub/", "a/sub/deep.txt", "a-b", "bin/", "bin/run.sh", "empty/", "zero-length"}
	if !slices.Equal(got, want) {
		t.Errorf("entries:\n got %q\nwant %q", got, want)
	}
	if st.Files != 4 {
		t.Errorf("Stats.Files = %d, want 4", st.Files)
	}
	for _, rel := range asked {
		if strings.HasPrefix(rel, "z/") {
			t.Errorf("Exclude asked about %q below the excluded directory z", rel)
		}
		if strings.Contains(rel, "\\") || strings.HasPrefix(rel, "/") {
			t.Errorf("Exclude got %q, want a slash-separated relative path", rel)
		}
	}
	if !slices.Contains(asked, "a/sub/deep.txt") {
		t.Errorf("Exclude was not asked about a/sub/deep.txt; asked %q", asked)
	}
}

func TestWriteTarMaxFileSize(t *testing.T) {
	tr := tree{files: map[string]string{"small": "12345", "big/file": strings.Repeat("x", 100)}}
	root := tr.write(t)
	tests := []struct {
		max     int64
		wantErr bool
	}{
		{max: 0},
		{max: 100},
		{max: 99, wantErr: true},
		{max: 1, wantErr: true},
	}
	for _, tc := range tests {
		var buf bytes.Buffer
		_, err := archive.WriteTar(context.Background(), &buf, root, archive.TarOptions{MaxFileSize: tc.max})
		if tc.wantErr {
			if !errors.Is(err, archive.ErrTooLarge) {
				t.Errorf("MaxFileSize %d: error %v, want ErrTooLarge", tc.max, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("MaxFileSize %d: %v", tc.max, err)
		}
	}
}

func TestWriteTarErrors(t *testing.T) {
	root := sampleTree().write(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := archive.WriteTar(ctx, io.Discard, root, archive.TarOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: error %v, want context.Canceled", err)
	}
	if _, err := archive.WriteTar(context.Background(), io.Discard, filepath.Join(root, "missing"), archive.TarOptions{}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing root: error %v, want fs.ErrNotExist", err)
	}
	if _, err := archive.WriteTar(context.Background(), failingWriter{}, root, archive.TarOptions{}); !errors.Is(err, errWrite) {
		t.Errorf("failing writer: error %v, want the writer's error", err)
	}
}

var errWrite = errors.New("disk full")

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errWrite }

func canonicalize(t testing.TB, src []byte, o archive.CanonicalOptions) ([]byte, archive.Result) {
	t.Helper()
	var out bytes.Buffer
	res, err := archive.Canonicalize(&out, bytes.NewReader(src), o)
	if err != nil {
		t.Fatalf("Canonicalize: %v", err)
	}
	return out.Bytes(), res
}

func TestCanonicalizeStagingTar(t *testing.T) {
	tr := sampleTree()
	staged, st := writeTar(t, tr.write(t), archive.TarOptions{})
	out, res := canonicalize(t, staged, archive.CanonicalOptions{})

	sum := sha256.Sum256(out)
	if want := digest.Digest("sha256:" + hex.EncodeToString(sum[:])); res.Digest != want {
		t.Errorf("Digest = %s, want sha256 of the written bytes %s", res.Digest, want)
	}
	if res.Size != int64(len(out)) {
		t.Errorf("Size = %d, want %d", res.Size, len(out))
	}
	if res.Files != st.Files || res.Files != len(tr.files) {
		t.Errorf("Files = %d, want %d", res.Files, len(tr.files))
	}
	es := readTarGz(t, out)
	if got := names(es); !slices.Equal(got, sampleOrder) {
		t.Errorf("entries:\n got %q\nwant %q", got, sampleOrder)
	}
	checkNormalised(t, es)
	for _, e := range es {
		if e.hdr.Typeflag == tar.TypeReg && e.content != tr.files[e.hdr.Name] {
			t.Errorf("%s: content %q, want %q", e.hdr.Name, e.content, tr.files[e.hdr.Name])
		}
	}
	if m := modeOf(es, "bin/run.sh"); m != 0o755 {
		t.Errorf("bin/run.sh mode %o, want 0755", m)
	}
	if m := modeOf(es, "a.txt"); m != 0o644 {
		t.Errorf("a.txt mode %o, want 0644", m)
	}
}

func modeOf(es []entry, name string) int64 {
	for _, e := range es {
		if e.hdr.Name == name {
			return e.hdr.Mode
		}
	}
	return -1
}

func TestCanonicalizeDeterministic(t *testing.T) {
	tr := sampleTree()
	root := tr.write(t)
	staged, _ := writeTar(t, root, archive.TarOptions{})
	out1, res1 := canonicalize(t, staged, archive.CanonicalOptions{})
	out2, res2 := canonicalize(t, staged, archive.CanonicalOptions{})
	if res1 != res2 || !bytes.Equal(out1, out2) {
		t.Fatalf("the same input gave %v then %v", res1, res2)
	}

	other := tr.write(t)
	perturb(t, other, tr)
	staged2, _ := writeTar(t, other, archive.TarOptions{})
	if _, res := canonicalize(t, staged2, archive.CanonicalOptions{}); res.Digest != res1.Digest {
		t.Errorf("other mtimes, permissions and owners: digest %s, want %s", res.Digest, res1.Digest)
	}

	// Headers from another tool, with everything canonicalisation drops set
	// to something else, give the same artifact.
	noisy := []tarEntry{}
	for _, name := range sampleOrder {
		e := tarEntry{name: name, typ: tar.TypeDir, mode: 0o775}
		if !strings.HasSuffix(name, "/") {
			e = tarEntry{name: name, typ: tar.TypeReg, mode: 0o664, body: tr.files[name]}
			if slices.Contains(tr.exec, name) {
				e.mode = 0o744
			}
		}
		e.noisy = true
		noisy = append(noisy, e)
	}
	for _, format := range []tar.Format{tar.FormatPAX, tar.FormatGNU} {
		_, res := canonicalize(t, makeTar(t, format, noisy...), archive.CanonicalOptions{})
		if res.Digest != res1.Digest {
			t.Errorf("noisy %v headers: digest %s, want %s", format, res.Digest, res1.Digest)
		}
	}

	// A different content, or a different exec bit, changes the digest.
	changed := slices.Clone(noisy)
	for i := range changed {
		if changed[i].name == "a.txt" {
			changed[i].body = "changed"
		}
	}
	if _, res := canonicalize(t, makeTar(t, tar.FormatPAX, changed...), archive.CanonicalOptions{}); res.Digest == res1.Digest {
		t.Error("changed content gave the same digest")
	}
	changed = slices.Clone(noisy)
	for i := range changed {
		if changed[i].name == "bin/run.sh" {
			changed[i].mode = 0o644
		}
	}
	if _, res := canonicalize(t, makeTar(t, tar.FormatPAX, changed...), archive.CanonicalOptions{}); res.Digest == res1.Digest {
		t.Error("a dropped exec bit gave the same digest")
	}
}

func TestCanonicalizeAlgorithms(t *testing.T) {
	staged := makeTar(t, tar.FormatPAX, tarEntry{name: "f", typ: tar.TypeReg, mode: 0o644, body: "content"})
	for _, alg := range []digest.Algorithm{"", digest.SHA256, digest.SHA384, digest.SHA512} {
		t.Run(string(alg), func(t *testing.T) {
			out, res := canonicalize(t, staged, archive.CanonicalOptions{Algorithm: alg})
			want := alg
			if want == "" {
				want = digest.SHA256
			}
			if res.Digest.Algorithm() != want {
				t.Errorf("digest %s, want algorithm %s", res.Digest, want)
			}
			if err := res.Digest.Validate(); err != nil {
				t.Errorf("digest %s: %v", res.Digest, err)
			}
			if exp := want.FromBytes(out); res.Digest != exp {
				t.Errorf("digest %s, want %s", res.Digest, exp)
			}
		})
	}
	for _, alg := range []digest.Algorithm{"md5", "sha3-256", "SHA256"} {
		var out bytes.Buffer
		_, err := archive.Canonicalize(&out, bytes.NewReader(staged), archive.CanonicalOptions{Algorithm: alg})
		if err == nil {
			t.Errorf("algorithm %q: no error", alg)
		}
		if out.Len() != 0 {
			t.Errorf("algorithm %q: wrote %d bytes before failing", alg, out.Len())
		}
	}
}

func TestCanonicalizeLevel(t *testing.T) {
	body := strings.Repeat("compressible ", 4096)
	staged := makeTar(t, tar.FormatPAX, tarEntry{name: "f", typ: tar.TypeReg, mode: 0o644, body: body})
	for _, level := range []int{gzip.NoCompression, gzip.BestSpeed, gzip.BestCompression} {
		out, res := canonicalize(t, staged, archive.CanonicalOptions{Level: level})
		es := readTarGz(t, out)
		if len(es) != 1 || es[0].content != body || res.Files != 1 {
			t.Errorf("level %d: entries %q, files %d", level, names(es), res.Files)
		}
	}
	if _, err := archive.Canonicalize(io.Discard, bytes.NewReader(staged), archive.CanonicalOptions{Level: 42}); err == nil {
		t.Error("level 42: no error")
	}
}

// tarEntry is one entry of a handcrafted tar.
type tarEntry struct {
	name     string
	typ      byte
	mode     int64
	body     string
	linkname string
	// size, when set, overrides len(body) in the header.
	size int64
	// noisy fills in everything canonicalisation must drop.
	noisy bool
}

// makeTar writes a tar of entries exactly as given, however hostile.
func makeTar(t testing.TB, format tar.Format, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Typeflag: e.typ, Name: e.name, Mode: e.mode, Linkname: e.linkname, Format: format}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
			if e.size != 0 {
				h.Size = e.size
			}
		}
		if e.typ == tar.TypeChar || e.typ == tar.TypeBlock {
			h.Devmajor, h.Devminor = 1, 3
		}
		if e.noisy {
			h.Uid, h.Gid, h.Uname, h.Gname = 1000, 100, "alice", "users"
			h.ModTime = time.Date(2020, 5, 6, 7, 8, 9, 0, time.UTC)
			if format == tar.FormatPAX {
				h.PAXRecords = map[string]string{"SCHILY.xattr.user.note": "x", "comment": "noise"}
			}
			if format == tar.FormatGNU {
				h.AccessTime = h.ModTime
				h.ChangeTime = h.ModTime
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("write header %q: %v", e.name, err)
		}
		if e.typ == tar.TypeReg {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatalf("write %q: %v", e.name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestCanonicalizeRejectsUnsafePaths(t *testing.T) {
	file := func(name string) tarEntry { return tarEntry{name: name, typ: tar.TypeReg, mode: 0o644, body: "x"} }
	dir := func(name string) tarEntry { return tarEntry{name: name, typ: tar.TypeDir, mode: 0o755} }
	tests := []struct {
		name    string
		entries []tarEntry
	}{
		{"parent", []tarEntry{file("../evil")}},
		{"parent dir", []tarEntry{dir("../evil/")}},
		{"dot dot alone", []tarEntry{dir("../")}},
		{"absolute", []tarEntry{file("/abs")}},
		{"absolute dir", []tarEntry{dir("/etc/")}},
		{"climb through", []tarEntry{file("a/../../b")}},
		{"climb inside", []tarEntry{file("a/../b")}},
		{"trailing dot dot", []tarEntry{dir("a/..")}},
		{"backslash", []tarEntry{file("a\\b")}},
		{"backslash climb", []tarEntry{file("..\\evil")}},
		{"empty name", []tarEntry{file("")}},
		{"dot", []tarEntry{dir("./")}},
		{"after good entries", []tarEntry{dir("ok/"), file("ok/f"), file("ok/../../evil")}},
		{"duplicate file", []tarEntry{file("a"), file("a")}},
		{"duplicate dir", []tarEntry{dir("d/"), dir("d/")}},
		{"duplicate after cleaning", []tarEntry{file("a"), file("./a")}},
		{"duplicate double slash", []tarEntry{file("d/f"), file("d//f")}},
		{"file then dir", []tarEntry{file("a"), dir("a/")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := makeTar(t, tar.FormatPAX, tc.entries...)
			res, err := archive.Canonicalize(io.Discard, bytes.NewReader(src), archive.CanonicalOptions{})
			if !errors.Is(err, archive.ErrUnsafePath) {
				t.Fatalf("error %v, want ErrUnsafePath", err)
			}
			if res != (archive.Result{}) {
				t.Errorf("result %+v on failure, want zero", res)
			}
		})
	}
}

func TestCanonicalizeDropsLinksAndDevices(t *testing.T) {
	src := makeTar(t, tar.FormatPAX,
		tarEntry{name: "dir/", typ: tar.TypeDir, mode: 0o755},
		tarEntry{name: "dir/keep", typ: tar.TypeReg, mode: 0o644, body: "kept"},
		tarEntry{name: "sym", typ: tar.TypeSymlink, linkname: "/etc/passwd"},
		tarEntry{name: "dir/up", typ: tar.TypeSymlink, linkname: "../../.."},
		tarEntry{name: "hard", typ: tar.TypeLink, linkname: "dir/keep"},
		tarEntry{name: "hard-out", typ: tar.TypeLink, linkname: "/etc/shadow"},
		tarEntry{name: "null", typ: tar.TypeChar, mode: 0o666},
		tarEntry{name: "disk", typ: tar.TypeBlock, mode: 0o660},
		tarEntry{name: "pipe", typ: tar.TypeFifo, mode: 0o644},
		// A dropped entry type is dropped before its name is judged.
		tarEntry{name: "../escape", typ: tar.TypeSymlink, linkname: "/"},
		tarEntry{name: "last", typ: tar.TypeReg, mode: 0o755, body: "last"},
	)
	out, res := canonicalize(t, src, archive.CanonicalOptions{})
	es := readTarGz(t, out)
	want := []string{"dir/", "dir/keep", "last"}
	if got := names(es); !slices.Equal(got, want) {
		t.Errorf("entries %q, want %q", got, want)
	}
	checkNormalised(t, es)
	for _, e := range es {
		if e.hdr.Linkname != "" {
			t.Errorf("%s: link name %q", e.hdr.Name, e.hdr.Linkname)
		}
	}
	if res.Files != 2 {
		t.Errorf("Files = %d, want 2", res.Files)
	}
}

func TestCanonicalizeTruncated(t *testing.T) {
	full := makeTar(t, tar.FormatPAX,
		tarEntry{name: "first", typ: tar.TypeReg, mode: 0o644, body: strings.Repeat("a", 2000)},
		tarEntry{name: "second", typ: tar.TypeReg, mode: 0o644, body: strings.Repeat("b", 2000)},
	)
	// first: header at 0, content 512..2512 (padded to 2560); second:
	// header at 2560, content 3072..5072.
	for _, cut := range []int{100, 511, 600, 2511, 2600, 3000, 4000, 5071} {
		_, err := archive.Canonicalize(io.Discard, bytes.NewReader(full[:cut]), archive.CanonicalOptions{})
		if err == nil {
			t.Errorf("cut at %d of %d: no error", cut, len(full))
			continue
		}
		if errors.Is(err, archive.ErrUnsafePath) || errors.Is(err, archive.ErrTooLarge) {
			t.Errorf("cut at %d: error %v, want a read error", cut, err)
		}
	}
	// A header claiming more content than the stream has.
	lying := makeTarRaw(t, tarEntry{name: "f", typ: tar.TypeReg, mode: 0o644, body: "short", size: 1 << 20})
	if _, err := archive.Canonicalize(io.Discard, bytes.NewReader(lying), archive.CanonicalOptions{}); err == nil {
		t.Error("content shorter than its header: no error")
	}
	// Not a tar at all.
	if _, err := archive.Canonicalize(io.Discard, strings.NewReader(strings.Repeat("not a tar ", 100)), archive.CanonicalOptions{}); err == nil {
		t.Error("garbage: no error")
	}
}

// makeTarRaw writes entries whose body may be shorter than the header's
// size, by writing the header block through a tar.Writer and the body raw.
func makeTarRaw(t testing.TB, e tarEntry) []byte {
	t.Helper()
	var hdr bytes.Buffer
	tw := tar.NewWriter(&hdr)
	if err := tw.WriteHeader(&tar.Header{Typeflag: e.typ, Name: e.name, Mode: e.mode, Size: e.size, Format: tar.FormatUSTAR}); err != nil {
		t.Fatal(err)
	}
	// WriteHeader has written the header block; the content is never
	// written through tw, so it is not padded or checked.
	b := hdr.Bytes()[:512]
	return append(slices.Clone(b), e.body...)
}

func TestCanonicalizeMaxFileSize(t *testing.T) {
	src := makeTar(t, tar.FormatPAX,
		tarEntry{name: "small", typ: tar.TypeReg, mode: 0o644, body: "12345"},
		tarEntry{name: "big", typ: tar.TypeReg, mode: 0o644, body: strings.Repeat("x", 100)},
	)
	tests := []struct {
		max     int64
		wantErr bool
	}{
		{max: 0},
		{max: 100},
		{max: 99, wantErr: true},
		{max: 5, wantErr: true},
	}
	for _, tc := range tests {
		res, err := archive.Canonicalize(io.Discard, bytes.NewReader(src), archive.CanonicalOptions{MaxFileSize: tc.max})
		switch {
		case tc.wantErr && !errors.Is(err, archive.ErrTooLarge):
			t.Errorf("MaxFileSize %d: error %v, want ErrTooLarge", tc.max, err)
		case !tc.wantErr && err != nil:
			t.Errorf("MaxFileSize %d: %v", tc.max, err)
		case !tc.wantErr && res.Files != 2:
			t.Errorf("MaxFileSize %d: Files = %d, want 2", tc.max, res.Files)
		}
	}
}

func TestCanonicalizeWriteError(t *testing.T) {
	src := makeTar(t, tar.FormatPAX, tarEntry{name: "f", typ: tar.TypeReg, mode: 0o644, body: "x"})
	if _, err := archive.Canonicalize(failingWriter{}, bytes.NewReader(src), archive.CanonicalOptions{}); !errors.Is(err, errWrite) {
		t.Errorf("failing writer: error %v, want the writer's error", err)
	}
}

func TestCanonicalizeEmpty(t *testing.T) {
	for name, src := range map[string][]byte{
		"empty stream": nil,
		"empty tar":    makeTar(t, tar.FormatPAX),
	} {
		out, res := canonicalize(t, src, archive.CanonicalOptions{})
		if res.Files != 0 || len(readTarGz(t, out)) != 0 {
			t.Errorf("%s: %d files", name, res.Files)
		}
		if res.Digest != digest.SHA256.FromBytes(out) {
			t.Errorf("%s: digest %s does not match the output", name, res.Digest)
		}
	}
}
