package events

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// remoteParent is a span context as a publisher's span would carry it.
func remoteParent(t *testing.T) trace.SpanContext {
	t.Helper()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, err := trace.ParseTraceState("vendor=value")
	if err != nil {
		t.Fatal(err)
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts})
}

func TestTraceContextRoundTrip(t *testing.T) {
	sc := remoteParent(t)
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	job := testJob()
	body, err := EncodeContext(ctx, "watcher", TypeFetchRequested, "id", ObjectSubject(job.Object), &FetchRequested{Job: job})
	if err != nil {
		t.Fatal(err)
	}
	var wire map[string]any
	if err := json.Unmarshal(body, &wire); err != nil {
		t.Fatal(err)
	}
	if got, want := wire[TraceParentExtension], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"; got != want {
		t.Errorf("traceparent on the wire = %v, want %s", got, want)
	}
	if got := wire[TraceStateExtension]; got != "vendor=value" {
		t.Errorf("tracestate on the wire = %v, want vendor=value", got)
	}
	m, err := Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	got := trace.SpanContextFromContext(m.TraceContext(context.Background()))
	if !got.IsRemote() || got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() || !got.IsSampled() ||
		got.TraceState().String() != "vendor=value" {
		t.Errorf("extracted %+v, want the remote %+v", got, sc)
	}
}

func TestEncodeWithoutTrace(t *testing.T) {
	job := testJob()
	body, err := EncodeContext(context.Background(), "watcher", TypeFetchRequested, "id", ObjectSubject(job.Object), &FetchRequested{Job: job})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(body), TraceParentExtension) || strings.Contains(string(body), TraceStateExtension) {
		t.Errorf("a message published outside a trace carries a trace context: %s", body)
	}
	m, err := Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	if sc := trace.SpanContextFromContext(m.TraceContext(context.Background())); sc.IsValid() {
		t.Errorf("extracted %+v from a message without a trace context", sc)
	}
}

// TestBadTraceContext: a malformed, huge or mistyped trace header is
// dropped (the handler's span starts a new trace); the message itself
// decodes and is handled as any other.
func TestBadTraceContext(t *testing.T) {
	const valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct {
		name        string
		parent      any
		state       any
		wantParent  bool
		wantStateOK bool
	}{
		{name: "garbage", parent: "not a traceparent"},
		{name: "zero trace id", parent: "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
		{name: "bad version", parent: "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{name: "huge", parent: valid + strings.Repeat("-0", 512<<10)},
		{name: "number", parent: 42},
		{name: "object", parent: map[string]any{"a": "b"}},
		{name: "empty", parent: ""},
		{name: "huge tracestate", parent: valid, state: "a=" + strings.Repeat("b", 1<<20), wantParent: true},
		{name: "malformed tracestate", parent: valid, state: "=,=,===", wantParent: true},
		{name: "mistyped tracestate", parent: valid, state: true, wantParent: true},
		{name: "valid tracestate", parent: valid, state: "a=b", wantParent: true, wantStateOK: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := testJob()
			body, err := Encode("watcher", TypeFetchRequested, "id", ObjectSubject(job.Object), &FetchRequested{Job: job})
			if err != nil {
				t.Fatal(err)
			}
			var wire map[string]any
			if err := json.Unmarshal(body, &wire); err != nil {
				t.Fatal(err)
			}
			wire[TraceParentExtension] = tc.parent
			if tc.state != nil {
				wire[TraceStateExtension] = tc.state
			}
			if body, err = json.Marshal(wire); err != nil {
				t.Fatal(err)
			}
			m, err := Decode(body)
			if err != nil {
				t.Fatalf("a message with a bad trace header is rejected: %v", err)
			}
			if JobOf(m.Data).ID != job.ID {
				t.Errorf("job = %+v, want %+v", JobOf(m.Data), job)
			}
			sc := trace.SpanContextFromContext(m.TraceContext(context.Background()))
			if sc.IsValid() != tc.wantParent {
				t.Errorf("parent valid = %v, want %v (%+v)", sc.IsValid(), tc.wantParent, sc)
			}
			if got := sc.TraceState().Len() > 0; got != tc.wantStateOK {
				t.Errorf("tracestate kept = %v (%q), want %v", got, sc.TraceState().String(), tc.wantStateOK)
			}
		})
	}
}
