package chartrepo

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
)

// WriteBigIndex writes the entries of a generated index of about size
// bytes in the shape `helm repo index` writes: charts named
// chart-0000, chart-0001, ... with as many versions each as it takes.
// It writes neither the apiVersion line nor "entries:", so a caller can
// add real entries around them. For benchmarks of large indexes.
func WriteBigIndex(w io.Writer, size int64, charts int) error {
	bw := bufio.NewWriter(w)
	entry := func(w io.Writer, c, v int) {
		fmt.Fprintf(w, "  - apiVersion: v2\n    appVersion: 1.%d.0\n    created: \"2026-01-01T00:00:00Z\"\n"+
			"    description: A Helm chart for Kubernetes, generated to measure how an index of many versions is read.\n"+
			"    digest: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n"+
			"    home: https://example.com/charts/chart-%04d\n    keywords:\n    - benchmark\n    - headwater\n"+
			"    maintainers:\n    - email: charts@example.com\n      name: Charts Team\n    name: chart-%04d\n"+
			"    type: application\n    urls:\n    - https://example.com/charts/chart-%04d-1.%d.0.tgz\n    version: 1.%d.0\n",
			v, c, c, c, v, v)
	}
	var one bytes.Buffer
	entry(&one, 0, 10)
	perChart := int(size / int64(charts) / int64(one.Len()))
	for c := 0; c < charts; c++ {
		fmt.Fprintf(bw, "  chart-%04d:\n", c)
		for v := perChart; v > 0; v-- {
			entry(bw, c, v)
		}
	}
	return bw.Flush()
}
