package e2e

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/headwater-gitops/headwater/testsupport/otlpreceiver"
)

// TestOneTracePerChange: a new GitRepository's change is one trace, as an
// OTLP collector receives it from the services: the watcher's reconcile
// (the root), the fetch, the package and the announcement, each in its own
// service, down to the watcher's status write, every span's parent in the
// trace. The services export to the receiver runTests starts, with the
// standard OTEL_* variables.
func TestOneTracePerChange(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "traced"
	_, commit := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	waitArtifact(t, name, revision(commit))

	// The service and span name of each step, in the order of the change.
	want := []struct{ service, span string }{
		{"headwater-watcher", "reconcile"},
		{"headwater-fetcher", "fetch"},
		{"headwater-packager", "package"},
		{"headwater-artifact-server", "announce"},
		{"headwater-watcher", "write status"},
	}
	var spans []otlpreceiver.Span
	eventually(t, "one trace from "+name+"'s reconcile to its status write", func() error {
		// The status write of the outcome that made it Ready names the
		// trace.
		var write *otlpreceiver.Span
		for _, s := range traces.Spans() {
			if s.Service == "headwater-watcher" && s.Name == "write status" && s.Attr("headwater.object.name") == name {
				write = &s
				break
			}
		}
		if write == nil {
			return fmt.Errorf("no status write span for %s among %d spans", name, len(traces.Spans()))
		}
		var err error
		if spans, err = traces.Trace(write.TraceId); err != nil {
			return err
		}
		for _, w := range want {
			if find(spans, w.service, w.span) == nil {
				return fmt.Errorf("trace %x has no %q span from %s; it has %s", write.TraceId, w.span, w.service, describe(spans))
			}
		}
		return nil
	})

	byID := map[string]otlpreceiver.Span{}
	for _, s := range spans {
		byID[string(s.SpanId)] = s
	}
	var roots []otlpreceiver.Span
	for _, s := range spans {
		if len(s.ParentSpanId) == 0 {
			roots = append(roots, s)
			continue
		}
		if _, ok := byID[string(s.ParentSpanId)]; !ok {
			t.Errorf("span %q of %s has a parent that is not in the trace", s.Name, s.Service)
		}
	}
	if len(roots) != 1 || roots[0].Name != "reconcile" || roots[0].Service != "headwater-watcher" {
		t.Fatalf("roots %s, want the watcher's reconcile alone", describe(roots))
	}
	// Each step descends from the one before it.
	for i := 1; i < len(want); i++ {
		s, prev := find(spans, want[i].service, want[i].span), find(spans, want[i-1].service, want[i-1].span)
		if !descends(byID, *s, *prev) {
			t.Errorf("%q of %s does not descend from %q of %s", s.Name, s.Service, prev.Name, prev.Service)
		}
		if s.Attr("headwater.object.name") != name || s.Attr("headwater.object.kind") != "GitRepository" {
			t.Errorf("%q of %s names %s %s", s.Name, s.Service, s.Attr("headwater.object.kind"), s.Attr("headwater.object.name"))
		}
	}
}

// find returns the first span of service named name, or nil.
func find(spans []otlpreceiver.Span, service, name string) *otlpreceiver.Span {
	for i := range spans {
		if spans[i].Service == service && spans[i].Name == name {
			return &spans[i]
		}
	}
	return nil
}

// descends reports whether s has ancestor among its parents in byID.
func descends(byID map[string]otlpreceiver.Span, s, ancestor otlpreceiver.Span) bool {
	for len(s.ParentSpanId) > 0 {
		if bytes.Equal(s.ParentSpanId, ancestor.SpanId) {
			return true
		}
		p, ok := byID[string(s.ParentSpanId)]
		if !ok {
			return false
		}
		s = p
	}
	return false
}

// describe lists spans as "service/name", sorted.
func describe(spans []otlpreceiver.Span) string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Service+"/"+s.Name)
	}
	sort.Strings(out)
	return "[" + strings.Join(out, ", ") + "]"
}
