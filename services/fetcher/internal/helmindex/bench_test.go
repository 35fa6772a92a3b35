package helmindex

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// bigIndex writes an index of about size bytes in the shape `helm repo
// index` writes (2,000 charts with as many versions as it takes) and
// returns its path and the name of a chart in the middle of it.
func bigIndex(b *testing.B, size int64) (string, string) {
	b.Helper()
	p := filepath.Join(b.TempDir(), "index.yaml")
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "apiVersion: v1\nentries:")
	const charts = 2000
	perChart := int(size / charts / 600)
	for c := 0; c < charts; c++ {
		fmt.Fprintf(w, "  chart-%04d:\n", c)
		for v := perChart; v > 0; v-- {
			fmt.Fprintf(w, "  - apiVersion: v2\n    appVersion: 1.%d.0\n    created: \"2026-01-01T00:00:00Z\"\n"+
				"    description: A Helm chart for Kubernetes, generated to measure how an index of many versions is read.\n"+
				"    digest: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n"+
				"    home: https://example.com/charts/chart-%04d\n    keywords:\n    - benchmark\n    - headwater\n"+
				"    maintainers:\n    - email: charts@example.com\n      name: Charts Team\n    name: chart-%04d\n"+
				"    type: application\n    urls:\n    - https://example.com/charts/chart-%04d-1.%d.0.tgz\n    version: 1.%d.0\n",
				v, c, c, c, v, v)
		}
	}
	fmt.Fprintln(w, "generated: \"2026-01-01T00:00:00Z\"")
	if err := w.Flush(); err != nil {
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

// BenchmarkCheck48MiB checks a 48 MiB index: its memory is a line buffer
// (see B/op), whatever the index's size.
func BenchmarkCheck48MiB(b *testing.B) {
	p, _ := bigIndex(b, 48<<20)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		if err := Check(f); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	maxRSS(b)
}

// BenchmarkVersions48MiB finds one chart's versions in a 48 MiB index.
func BenchmarkVersions48MiB(b *testing.B) {
	p, name := bigIndex(b, 48<<20)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		cvs, err := Versions(f, name)
		if err != nil || len(cvs) == 0 {
			b.Fatalf("Versions = %d, %v", len(cvs), err)
		}
		f.Close()
	}
	maxRSS(b)
}
