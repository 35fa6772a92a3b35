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
