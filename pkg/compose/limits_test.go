package compose

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/klauspost/compress/gzip"
)

// bomb is a gzip-compressed tarball of files files of zeros of size
// bytes each: a few KiB that unpack to files*size bytes.
func bomb(t *testing.T, files int, size int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(zw)
	for i := range files {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("zeros/%d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(tw, zeros{}, size); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// diskUsage is the bytes of the regular files below dir.
func diskUsage(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		n += fi.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestUnpackLimits(t *testing.T) {
	for _, c := range []struct {
		name        string
		files       int
		size        int64
		limits      Limits
		wantErr     string
		wantWritten int64
	}{
		{"under the limits", 4, 1 << 10, Limits{MaxSize: 4 << 10, MaxEntries: 5}, "", 4 << 10},
		{"over the size", 8, 1 << 20, Limits{MaxSize: 3 << 20}, "extracted size exceeds the limit of 3 MiB", 3 << 20},
		{"one file over the size", 1, 2 << 20, Limits{MaxSize: 1 << 20}, "extracted size exceeds the limit of 1 MiB", 0},
		{"over the entries", 10, 1, Limits{MaxEntries: 3}, "extracted entries exceed the limit of 3", 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			err := UnpackWith(context.Background(), bytes.NewReader(bomb(t, c.files, c.size)), dir, Options{Limits: c.limits}, nil)
			if c.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
			} else {
				if !errors.Is(err, ErrLimit) || !errors.Is(err, ErrBuild) || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want ErrLimit and ErrBuild saying %q", err, c.wantErr)
				}
			}
			if got := diskUsage(t, dir); got != c.wantWritten {
				t.Errorf("%d bytes written, want %d", got, c.wantWritten)
			}
		})
	}
}

// TestUnpackDefaultLimits: Unpack without limits of its own has Flux's
// 100 MiB.
func TestUnpackDefaultLimits(t *testing.T) {
	dir := t.TempDir()
	err := Unpack(bytes.NewReader(bomb(t, 101, 1<<20)), dir, 0, nil)
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "extracted size exceeds the limit of 100 MiB") {
		t.Fatalf("error %v, want the 100 MiB limit", err)
	}
	if got := diskUsage(t, dir); got > DefaultMaxUnpackSize {
		t.Errorf("%d bytes written, over the limit", got)
	}
}

// TestBuildExtractLimits: the tarballs one build extracts share one
// budget, so two bombs under the limit each do not pass together.
func TestBuildExtractLimits(t *testing.T) {
	src := t.TempDir()
	for _, name := range []string{"a.tgz", "b.tgz"} {
		if err := os.WriteFile(filepath.Join(src, name), bomb(t, 3, 1<<20), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	art := swv1beta1.OutputArtifact{Name: "out", Copy: []swv1beta1.CopyOperation{
		cp("@repo/a.tgz", "@artifact/a/", strategy(swv1beta1.ExtractStrategy)),
		cp("@repo/b.tgz", "@artifact/b/", strategy(swv1beta1.ExtractStrategy)),
	}}
	out := t.TempDir()
	err := Build(context.Background(), out, map[string]string{"repo": src}, art, Options{Limits: Limits{MaxSize: 5 << 20}})
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "extracted size exceeds the limit of 5 MiB") {
		t.Fatalf("error %v, want the 5 MiB limit", err)
	}
	if got := diskUsage(t, out); got > 5<<20 {
		t.Errorf("%d bytes written, over the limit", got)
	}
	// Under a limit that fits both, the build passes.
	out = t.TempDir()
	if err := Build(context.Background(), out, map[string]string{"repo": src}, art, Options{Limits: Limits{MaxSize: 6 << 20}}); err != nil {
		t.Fatal(err)
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{100 << 20: "100 MiB", 3 << 10: "3 KiB", 1000: "1000 bytes", 1<<20 + 1: "1048577 bytes"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

// copyTree writes files files of size bytes each into a new directory.
func copyTree(t *testing.T, files int, size int) string {
	t.Helper()
	src := t.TempDir()
	for i := range files {
		if err := os.WriteFile(filepath.Join(src, fmt.Sprintf("f%03d.yaml", i)), make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return src
}

// manyCopies is an output copying the whole tree of repo into n
// directories of its own.
func manyCopies(name string, n int) swv1beta1.OutputArtifact {
	art := swv1beta1.OutputArtifact{Name: name}
	for i := range n {
		art.Copy = append(art.Copy, cp("@repo/**", fmt.Sprintf("@artifact/%d/", i)))
	}
	return art
}

// fileCount is the number of regular files below dir.
func fileCount(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBuildCopyLimits: the pathological generator, thousands of copies
// of one tree (GiBs if written), stops at the job's copy budget, charged
// before each file is written: no more than the limit reaches the disk, the
// error names the limit and its flag, and the outputs of a job share the
// budget.
func TestBuildCopyLimits(t *testing.T) {
	limits := Limits{MaxSize: 4 << 20, MaxEntries: 500, SizeFlag: "-max-unpack-size", EntriesFlag: "-max-unpack-entries"}
	tests := []struct {
		name    string
		files   int
		size    int
		outputs []swv1beta1.OutputArtifact
		wantErr string
	}{
		// 8 files of 96 KiB copied 10,000 times: 7.5 GiB.
		{"bytes", 8, 96 << 10, []swv1beta1.OutputArtifact{manyCopies("out", 10_000)},
			"copied size exceeds the limit of 4 MiB (-max-unpack-size)"},
		// 100 empty files copied 10,000 times: a million files.
		{"entries", 100, 0, []swv1beta1.OutputArtifact{manyCopies("out", 10_000)},
			"copied entries exceed the limit of 500 (-max-unpack-entries)"},
		// One file larger than the limit: refused before a byte of it is written.
		{"one large file", 1, 5 << 20, []swv1beta1.OutputArtifact{manyCopies("out", 1)},
			"copied size exceeds the limit of 4 MiB (-max-unpack-size)"},
		// Two outputs of 3 MiB each: the second goes over.
		{"outputs share the budget", 4, 768 << 10, []swv1beta1.OutputArtifact{manyCopies("a", 1), manyCopies("b", 1)},
			"artifact \"b\" copy[0] from \"@repo/**\": write 0/f001.yaml: artifact build failed: limit exceeded: copied size exceeds the limit of 4 MiB (-max-unpack-size)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srcs := map[string]string{"repo": copyTree(t, tc.files, tc.size)}
			work := t.TempDir()
			o := Options{Limits: limits, Copied: NewBudget(limits)}
			var err error
			for i, art := range tc.outputs {
				dir := filepath.Join(work, fmt.Sprint(i))
				if err = os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err = Build(t.Context(), dir, srcs, art, o); err != nil {
					break
				}
			}
			if !errors.Is(err, ErrLimit) || !errors.Is(err, ErrBuild) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want ErrLimit and ErrBuild saying %q", err, tc.wantErr)
			}
			if got := diskUsage(t, work); got > limits.MaxSize || tc.name == "one large file" && got != 0 {
				t.Errorf("%d bytes written, over the limit of %d", got, limits.MaxSize)
			}
			if got := fileCount(t, work); got > limits.MaxEntries {
				t.Errorf("%d files written, over the limit of %d", got, limits.MaxEntries)
			}
		})
	}

	// Merges and extracts count too; a build within the budget passes.
	src := t.TempDir()
	for name, content := range map[string][]byte{"values.yaml": []byte("a: 1\n"), "b.tgz": bomb(t, 3, 1<<20)} {
		if err := os.WriteFile(filepath.Join(src, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	art := swv1beta1.OutputArtifact{Name: "out", Copy: []swv1beta1.CopyOperation{
		cp("@repo/values.yaml", "@artifact/values.yaml"),
		cp("@repo/values.yaml", "@artifact/values.yaml", strategy(swv1beta1.MergeStrategy)),
		cp("@repo/b.tgz", "@artifact/b/", strategy(swv1beta1.ExtractStrategy)),
	}}
	budget := NewBudget(limits)
	if err := Build(t.Context(), t.TempDir(), map[string]string{"repo": src}, art, Options{Limits: limits, Copied: budget}); err != nil {
		t.Fatal(err)
	}
	// values.yaml twice (5 bytes each, one file) and the three files of zeros.
	if budget.size != 3<<20+10 || budget.entries != 4 {
		t.Errorf("budget charged %d bytes, %d entries; want %d, 4", budget.size, budget.entries, 3<<20+10)
	}
	art.Copy = append(art.Copy, cp("@repo/b.tgz", "@artifact/c/", strategy(swv1beta1.ExtractStrategy)))
	err := Build(t.Context(), t.TempDir(), map[string]string{"repo": src}, art, Options{Limits: limits, Copied: NewBudget(limits)})
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "copied size exceeds the limit of 4 MiB") {
		t.Fatalf("error %v, want the copy budget's", err)
	}
}
