package helmindex

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
)

// bigIndex writes an index of about size bytes (2,000 charts with as many
// versions as it takes) and returns its path and the name of a chart in
// the middle of it.
func bigIndex(b *testing.B, size int64) (string, string) {
	b.Helper()
	p := filepath.Join(b.TempDir(), "index.yaml")
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := fmt.Fprintln(f, "apiVersion: v1\nentries:"); err != nil {
		b.Fatal(err)
	}
	if err := chartrepo.WriteBigIndex(f, size, 2000); err != nil {
		b.Fatal(err)
	}
	if _, err := fmt.Fprintln(f, "generated: \"2026-01-01T00:00:00Z\""); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return p, "chart-1000"
}

// maxRSS reports the process's peak resident set in MiB.
func maxRSS(b *testing.B) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		b.ReportMetric(float64(ru.Maxrss)/1024, "peak-RSS-MiB")
	}
}

// benchIndex runs read over a 48 MiB index b.N times and reports the
// allocations and the process's peak RSS.
func benchIndex(b *testing.B, read func(f *os.File, chart string) error) {
	p, name := bigIndex(b, 48<<20)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		err = read(f, name)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	maxRSS(b)
}

// BenchmarkCheck48MiB checks a 48 MiB index: its memory is a line buffer
// (see B/op), whatever the index's size.
func BenchmarkCheck48MiB(b *testing.B) {
	benchIndex(b, func(f *os.File, _ string) error { return Check(f) })
}

// BenchmarkVersions48MiB finds one chart's versions in a 48 MiB index.
func BenchmarkVersions48MiB(b *testing.B) {
	benchIndex(b, func(f *os.File, chart string) error {
		cvs, err := Versions(f, chart)
		if err == nil && len(cvs) == 0 {
			err = fmt.Errorf("no versions of %s", chart)
		}
		return err
	})
}
