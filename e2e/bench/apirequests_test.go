package bench

import (
	"strings"
	"testing"
	"time"
)

func TestCountAuditRequests(t *testing.T) {
	// A watch is logged when it starts and when it ends; everything else
	// once, when complete.
	log := `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseComplete","verb":"get","userAgent":"watcher/v0.0.0 (linux/amd64) kubernetes/$Format","requestReceivedTimestamp":"2026-11-25T10:00:00.500000Z","stageTimestamp":"2026-11-25T10:00:00.501000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a2","stage":"ResponseStarted","verb":"watch","userAgent":"watcher/v0.0.0 (linux/amd64) kubernetes/$Format","requestReceivedTimestamp":"2026-11-25T10:00:01.000000Z","stageTimestamp":"2026-11-25T10:00:01.001000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a3","stage":"ResponseComplete","verb":"patch","userAgent":"fetcher/v0.0.0 (linux/amd64) kubernetes/$Format","requestReceivedTimestamp":"2026-11-25T10:00:02.000000Z","stageTimestamp":"2026-11-25T10:00:02.001000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a2","stage":"ResponseComplete","verb":"watch","userAgent":"watcher/v0.0.0 (linux/amd64) kubernetes/$Format","requestReceivedTimestamp":"2026-11-25T10:00:01.000000Z","stageTimestamp":"2026-11-25T10:00:03.000000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a4","stage":"ResponseComplete","verb":"update","userAgent":"kube-apiserver/v1.34.4 (linux/amd64) kubernetes/abc","requestReceivedTimestamp":"2026-11-25T10:00:03.000000Z","stageTimestamp":"2026-11-25T10:00:03.001000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a5","stage":"ResponseComplete","verb":"list","userAgent":"bench.test/v0.0.0 (linux/amd64) kubernetes/$Format","requestReceivedTimestamp":"2026-11-25T10:00:04.000000Z","stageTimestamp":"2026-11-25T10:00:04.001000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a6","stage":"ResponseComplete","verb":"get","requestReceivedTimestamp":"2026-11-25T10:00:04.500000Z","stageTimestamp":"2026-11-25T10:00:04.501000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a7","stage":"ResponseComplete","verb":"get","userAgent":"watcher/v0.0.0 (linux/amd64) kubernetes/$Format","requestReceivedTimestamp":"2026-11-25T10:00:05.000000Z","stageTimestamp":"2026-11-25T10:00:05.001000Z"}
`
	from := time.Date(2026, 11, 25, 10, 0, 1, 0, time.UTC)
	to := time.Date(2026, 11, 25, 10, 0, 5, 0, time.UTC)
	got, err := countAuditRequests(strings.NewReader(log), from, to)
	if err != nil {
		t.Fatal(err)
	}
	// a1 is before the window, a7 at its end (excluded); the watch a2 counts once.
	want := map[string]int64{"watcher": 1, "fetcher": 1, apiServerAgent: 1, "bench.test": 1, "(none)": 1}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	if _, err := countAuditRequests(strings.NewReader("{not json\n"), from, to); err == nil {
		t.Error("a line that is not JSON: no error")
	}
}

func TestSystemAPIRequests(t *testing.T) {
	m := &Measurement{}
	if _, ok := m.SystemAPIRequests(); ok {
		t.Error("counted without an audit log")
	}
	m.APIRequestsByAgent = map[string]int64{"watcher": 10, "fetcher": 5, apiServerAgent: 100, benchAgent(): 1000}
	if n, ok := m.SystemAPIRequests(); !ok || n != 15 {
		t.Errorf("SystemAPIRequests = %d, %v; want 15 (neither the API server's own nor the benchmark's)", n, ok)
	}
}
