package archive_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"path"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/headwater-gitops/headwater/pkg/archive"
)

// FuzzCanonicalize feeds arbitrary bytes to Canonicalize: it must never
// panic, and whatever it accepts must be an archive that is safe to unpack
// anywhere, describe itself truthfully, and be a fixed point (canonicalising
// the canonical tar again gives the same bytes).
func FuzzCanonicalize(f *testing.F) {
	staged, _ := writeTar(f, sampleTree().write(f), archive.TarOptions{})
	f.Add(staged)
	f.Add(makeTar(f, tar.FormatGNU,
		tarEntry{name: "d/", typ: tar.TypeDir, mode: 0o700},
		tarEntry{name: "d/f", typ: tar.TypeReg, mode: 0o755, body: "x", noisy: true},
		tarEntry{name: "l", typ: tar.TypeSymlink, linkname: "../../etc"},
		tarEntry{name: strings.Repeat("long/", 40) + "name", typ: tar.TypeReg, mode: 0o644, body: "long"},
	))
	f.Add(makeTar(f, tar.FormatPAX, tarEntry{name: "a/../../b", typ: tar.TypeReg, mode: 0o644, body: "evil"}))
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, data []byte) {
		var out bytes.Buffer
		res, err := archive.Canonicalize(&out, bytes.NewReader(data), archive.CanonicalOptions{MaxFileSize: 1 << 20})
		if err != nil {
			return
		}
		if res.Digest != digest.SHA256.FromBytes(out.Bytes()) || res.Size != int64(out.Len()) {
			t.Fatalf("result %+v does not describe the %d bytes written", res, out.Len())
		}
		es := readTarGz(t, out.Bytes())
		seen := map[string]bool{}
		files := 0
		for _, e := range es {
			name := e.hdr.Name
			n := checkSafeName(t, name)
			if seen[n] {
				t.Fatalf("name %q appears twice", name)
			}
			seen[n] = true
			switch e.hdr.Typeflag {
			case tar.TypeReg:
				files++
			case tar.TypeDir:
			default:
				t.Fatalf("%q: entry type %q accepted", name, e.hdr.Typeflag)
			}
			if e.hdr.Uid != 0 || e.hdr.Gid != 0 || e.hdr.Uname != "" || e.hdr.Gname != "" || e.hdr.ModTime.Unix() != 0 {
				t.Fatalf("%q: header not normalised: %+v", name, e.hdr)
			}
		}
		if files != res.Files {
			t.Fatalf("Files = %d, archive has %d", res.Files, files)
		}

		// The canonical tar is a fixed point.
		zr := mustGunzip(t, out.Bytes())
		var again bytes.Buffer
		res2, err := archive.Canonicalize(&again, zr, archive.CanonicalOptions{MaxFileSize: 1 << 20})
		if err != nil {
			t.Fatalf("canonical output rejected: %v", err)
		}
		if res2 != res || !bytes.Equal(again.Bytes(), out.Bytes()) {
			t.Fatalf("canonicalising the output again gave %+v, want %+v", res2, res)
		}
	})
}

func mustGunzip(t testing.TB, b []byte) io.Reader {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(raw)
}

// FuzzMerge feeds Merge two arbitrary tar streams, the second laid from an
// arbitrary From to an arbitrary To: it must never panic, and whatever it
// accepts must be a tar that is safe to unpack anywhere (clean relative
// names, each once, nothing under a file, only files and directories,
// normalised headers), that its Stats describe, and that is
// canonical: merging it again, alone, gives the same bytes.
func FuzzMerge(f *testing.F) {
	parent, included := tarOf(f, parentTree), tarOf(f, includedTree)
	f.Add(parent, included, "", "deps/included")
	f.Add(parent, included, "base", "deploy")
	f.Add(parent, included, "bin/run.sh", "a/x.txt/run.sh")
	f.Add(parent, makeTar(f, tar.FormatPAX, tarEntry{name: "a/../../b", typ: tar.TypeReg, mode: 0o644, body: "evil"}), "", "x")
	f.Add(parent, makeTar(f, tar.FormatGNU,
		tarEntry{name: "l", typ: tar.TypeSymlink, linkname: "../../etc"},
		tarEntry{name: "z", typ: tar.TypeReg, mode: 0o755, body: "z", noisy: true},
	), "", "")
	f.Add([]byte{}, []byte{}, "../x", "/abs")

	f.Fuzz(func(t *testing.T, base, layer []byte, from, to string) {
		var out bytes.Buffer
		st, err := archive.Merge(&out, []archive.Layer{
			{Tar: bytes.NewReader(base)},
			{Tar: bytes.NewReader(layer), From: from, To: to},
		})
		if err != nil {
			return
		}
		es := readTar(t, bytes.NewReader(out.Bytes()))
		kinds := map[string]byte{}
		files, size := 0, int64(0)
		for _, e := range es {
			name := e.hdr.Name
			n := checkSafeName(t, name)
			if _, dup := kinds[n]; dup {
				t.Fatalf("name %q appears twice", name)
			}
			// A layer's tar may lack a directory's own entry (unpacking
			// makes it); no entry may be under a file.
			for d := path.Dir(n); d != "."; d = path.Dir(d) {
				if k, ok := kinds[d]; ok && k != tar.TypeDir {
					t.Fatalf("%q is under the file %q", name, d)
				}
			}
			kinds[n] = e.hdr.Typeflag
			switch e.hdr.Typeflag {
			case tar.TypeReg:
				files++
				size += int64(len(e.content))
			case tar.TypeDir:
			default:
				t.Fatalf("%q: entry type %q accepted", name, e.hdr.Typeflag)
			}
			if e.hdr.Uid != 0 || e.hdr.Gid != 0 || e.hdr.Uname != "" || e.hdr.Gname != "" || e.hdr.ModTime.Unix() != 0 {
				t.Fatalf("%q: header not normalised: %+v", name, e.hdr)
			}
		}
		if st.Files != files || st.Bytes != size {
			t.Fatalf("Stats %+v, the tar has %d files of %d bytes", st, files, size)
		}

		// The merged tar is canonical: alone, it merges to itself.
		var again bytes.Buffer
		if _, err := archive.Merge(&again, []archive.Layer{{Tar: bytes.NewReader(out.Bytes())}}); err != nil {
			t.Fatalf("the merged tar is not canonical: %v", err)
		}
		if !bytes.Equal(again.Bytes(), out.Bytes()) {
			t.Fatalf("merging the merged tar again changed it")
		}
	})
}

// checkSafeName fails the fuzz run if an archive holds name, which is not
// a clean relative path, and returns it without a directory's slash.
func checkSafeName(t *testing.T, name string) string {
	t.Helper()
	n := strings.TrimSuffix(name, "/")
	if n == "" || strings.HasPrefix(name, "/") || strings.Contains(name, "\\") {
		t.Fatalf("unsafe name %q accepted", name)
	}
	for _, seg := range strings.Split(n, "/") {
		if seg == ".." || seg == "." || seg == "" {
			t.Fatalf("unsafe or unclean name %q accepted", name)
		}
	}
	return n
}
