package bench

import (
	"strings"
	"testing"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/headwater-gitops/headwater/testsupport/otlpreceiver"
)

// TestStageTable lays out two sources' changes: the first status write of
// each counts (with the trace it ends), a later one and one of another
// tenant do not, and a change that fetched nothing is skipped.
func TestStageTable(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(ms int) uint64 { return uint64(start.Add(time.Duration(ms) * time.Millisecond).UnixNano()) }
	span := func(trace, service, name, ns, obj string, from, to int) otlpreceiver.Span {
		s := &tracepb.Span{TraceId: []byte(trace), Name: name, StartTimeUnixNano: at(from), EndTimeUnixNano: at(to)}
		for k, v := range map[string]string{"headwater.object.namespace": ns, "headwater.object.name": obj} {
			s.Attributes = append(s.Attributes, &commonpb.KeyValue{Key: k,
				Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}})
		}
		return otlpreceiver.Span{Service: service, Span: s}
	}
	change := func(trace, ns, obj string, shift int) []otlpreceiver.Span {
		return []otlpreceiver.Span{
			span(trace, "headwater-watcher", "reconcile", ns, obj, shift+10, shift+20),
			span(trace, "headwater-fetcher", "fetch", ns, obj, shift+100, shift+300),
			span(trace, "headwater-watcher", "write status", ns, obj, shift+400, shift+410),
		}
	}
	var spans []otlpreceiver.Span
	spans = append(spans, change("t1", "small", "loaded-1", 0)...)
	spans = append(spans, change("t2", "small", "loaded-2", 1000)...)
	spans = append(spans, change("t3", "small", "loaded-1", 5000)...) // a later change
	spans = append(spans, change("t4", "big", "loaded-3", 9000)...)   // another tenant
	spans = append(spans, change("t5", "small", "idle-1", 9000)...)   // another round
	spans = append(spans,                                             // a change that fetched nothing
		span("t6", "headwater-watcher", "reconcile", "small", "loaded-4", 0, 1),
		span("t6", "headwater-watcher", "write status", "small", "loaded-4", 2, 3))

	table, n := stageTable(spans, "small", "loaded-", start)
	if n != 2 {
		t.Fatalf("sources found: %d, want 2\n%s", n, table)
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	want := []string{
		"headwater-watcher / reconcile    2  1010 ms  1010 ms  10 ms  10 ms",
		"headwater-fetcher / fetch        2  1100 ms  1100 ms  200 ms  200 ms",
		"headwater-watcher / write status 2  1400 ms  1400 ms  10 ms  10 ms",
	}
	if len(lines) != len(want)+1 {
		t.Fatalf("table has %d lines, want %d:\n%s", len(lines), len(want)+1, table)
	}
	for i, w := range want {
		if strings.Join(strings.Fields(lines[i+1]), " ") != strings.Join(strings.Fields(w), " ") {
			t.Errorf("row %d: %q, want %q", i, lines[i+1], w)
		}
	}
}
