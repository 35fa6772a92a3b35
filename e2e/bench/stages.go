package bench

import (
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/headwater-gitops/headwater/testsupport/otlpreceiver"
)

// Stage timing (scenario f with -stages): every Headwater service exports
// its spans to a receiver in the benchmark, and each source's first change
// (the trace from its reconcile to the status write that records its first
// artifact) is laid out in time from the start of its tenant's round. The
// spans of a trace are the stages of that change (docs/design.md, "One
// trace per change"); where a source waits shows as the gap between the
// end of one span and the start of the next.

// stageOTelEnv is the services' environment that exports every span to
// endpoint, soon after it ends, without dropping any under a flood (the
// batch processor's queue holds 2048 spans by default).
func stageOTelEnv(endpoint string) []string {
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint,
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_BSP_SCHEDULE_DELAY=500",
		"OTEL_BSP_MAX_QUEUE_SIZE=262144",
		"OTEL_BSP_MAX_EXPORT_BATCH_SIZE=4096",
		"OTEL_TRACES_SAMPLER=always_on",
	}
}

// stageStat is one stage (a span of a service) across the sources of a
// round: when it started and how long it took, each in order of size.
type stageStat struct {
	key           string
	starts, takes []time.Duration
}

// stageTable lays out, for the sources of namespace ns whose names start
// with prefix, the spans of each one's first change, counted from start.
// It returns the table's text and the number of sources found with a
// whole change (a reconcile and a status write in one trace).
func stageTable(spans []otlpreceiver.Span, ns, prefix string, start time.Time) (string, int) {
	// The status writes of the round's sources, the first of each.
	byTrace := map[string][]otlpreceiver.Span{}
	for _, s := range spans {
		byTrace[string(s.TraceId)] = append(byTrace[string(s.TraceId)], s)
	}
	first := map[string][]otlpreceiver.Span{}
	firstEnd := map[string]uint64{}
	for _, s := range spans {
		if s.Service != "headwater-watcher" || s.Name != "write status" ||
			s.Attr("headwater.object.namespace") != ns || !strings.HasPrefix(s.Attr("headwater.object.name"), prefix) {
			continue
		}
		name := s.Attr("headwater.object.name")
		trace := byTrace[string(s.TraceId)]
		if !slices.ContainsFunc(trace, func(t otlpreceiver.Span) bool { return t.Name == "fetch" }) {
			continue // a status write of a change that fetched nothing
		}
		if end, ok := firstEnd[name]; ok && end <= s.EndTimeUnixNano {
			continue
		}
		firstEnd[name], first[name] = s.EndTimeUnixNano, trace
	}
	stats := map[string]*stageStat{}
	origin := uint64(start.UnixNano())
	for _, trace := range first {
		seen := map[string]bool{}
		for _, s := range trace {
			key := s.Service + " / " + s.Name
			if seen[key] {
				continue // a redelivery: its first attempt counts
			}
			seen[key] = true
			st := stats[key]
			if st == nil {
				st = &stageStat{key: key}
				stats[key] = st
			}
			st.starts = append(st.starts, time.Duration(int64(s.StartTimeUnixNano)-int64(origin)))
			st.takes = append(st.takes, time.Duration(s.EndTimeUnixNano-s.StartTimeUnixNano))
		}
	}
	rows := make([]*stageStat, 0, len(stats))
	for _, st := range stats {
		slices.Sort(st.starts)
		slices.Sort(st.takes)
		rows = append(rows, st)
	}
	slices.SortFunc(rows, func(a, b *stageStat) int { return int(median(a.starts) - median(b.starts)) })
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "stage (service / span)\tsources\tstarts p50\tstarts max\ttakes p50\ttakes max\n")
	for _, st := range rows {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\n", st.key, len(st.starts),
			ms(median(st.starts)), ms(st.starts[len(st.starts)-1]), ms(median(st.takes)), ms(st.takes[len(st.takes)-1]))
	}
	_ = w.Flush()
	return b.String(), len(first)
}

// median is the middle of sorted d (0 when empty).
func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[len(d)/2]
}

// ms is d in milliseconds, "1234 ms".
func ms(d time.Duration) string {
	return fmt.Sprintf("%d ms", d.Milliseconds())
}
