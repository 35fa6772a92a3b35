package archive_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/headwater-gitops/headwater/pkg/archive"
)

// benchFiles and benchFileSize make about 64 MiB of content.
const (
	benchFiles    = 128
	benchFileSize = 512 << 10
)

// benchContent returns the content of generated file i: even files are
// text-like and compress well, odd files are random and do not compress.
func benchContent(i int) []byte {
	r := rand.New(rand.NewChaCha8([32]byte{byte(i), byte(i >> 8)}))
	b := make([]byte, benchFileSize)
	if i%2 == 1 {
		for j := 0; j < len(b); j += 8 {
			v := r.Uint64()
			for k := 0; k < 8 && j+k < len(b); k++ {
				b[j+k] = byte(v >> (8 * k))
			}
		}
		return b
	}
	words := []string{"apiVersion: ", "kind: ", "metadata:\n", "  name: ", "spec:\n", "replicas: ", "image: ", "\n"}
	var buf bytes.Buffer
	for buf.Len() < len(b) {
		buf.WriteString(words[r.IntN(len(words))])
		fmt.Fprintf(&buf, "%d\n", r.IntN(1000))
	}
	copy(b, buf.Bytes())
	return b
}

// benchPath spreads the generated files over a few directories.
func benchPath(i int) string { return fmt.Sprintf("dir%02d/file%03d", i%16, i) }

func BenchmarkCanonicalize(b *testing.B) {
	var src bytes.Buffer
	tw := tar.NewWriter(&src)
	for d := range 16 {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: fmt.Sprintf("dir%02d/", d), Mode: 0o755}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range benchFiles {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: benchPath(i), Mode: 0o644, Size: benchFileSize}); err != nil {
			b.Fatal(err)
		}
		if _, err := tw.Write(benchContent(i)); err != nil {
			b.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	data := src.Bytes()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	var res archive.Result
	for b.Loop() {
		var err error
		res, err = archive.Canonicalize(io.Discard, bytes.NewReader(data), archive.CanonicalOptions{})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if res.Files != benchFiles {
		b.Fatalf("Files = %d, want %d", res.Files, benchFiles)
	}
	b.ReportMetric(float64(res.Size)/float64(len(data)), "ratio")
}

func BenchmarkWriteTar(b *testing.B) {
	root := b.TempDir()
	var total int64
	for i := range benchFiles {
		p := filepath.Join(root, filepath.FromSlash(benchPath(i)))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, benchContent(i), 0o644); err != nil {
			b.Fatal(err)
		}
		total += benchFileSize
	}
	b.SetBytes(total)
	b.ReportAllocs()
	b.ResetTimer()
	var st archive.Stats
	for b.Loop() {
		var err error
		st, err = archive.WriteTar(context.Background(), io.Discard, root, archive.TarOptions{})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if st.Files != benchFiles || st.Bytes != total {
		b.Fatalf("Stats = %+v, want %d files of %d bytes", st, benchFiles, total)
	}
}
