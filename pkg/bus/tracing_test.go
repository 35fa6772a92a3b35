package bus_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
)

var (
	spansOnce sync.Once
	spans     *tracetest.SpanRecorder
)

// recordSpans installs, once per test binary, a global tracer provider
// that records every span: the bus takes its tracer from the global
// provider, which delegates to the first one set.
func recordSpans(t testing.TB) *tracetest.SpanRecorder {
	t.Helper()
	spansOnce.Do(func() {
		spans = tracetest.NewSpanRecorder()
		otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	})
	return spans
}

// spansOf returns the ended spans of trace id.
func spansOf(rec *tracetest.SpanRecorder, id trace.TraceID) map[string]sdktrace.ReadOnlySpan {
	out := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID() == id {
			out[s.Name()] = s
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// TestTraceThroughTheBus: a message published within a span carries its
// trace context; the worker handles it within a consumer span that is the
// child of the message's publish span, in the same trace, and the handler's
// context carries that span.
func TestTraceThroughTheBus(t *testing.T) {
	rec := recordSpans(t)
	b := newTestBus(t)
	cons := b.consumer(t, "traced", events.ConsumerOptions{})
	handled := make(chan trace.SpanContext, 1)
	runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Concurrency: 1,
		Handler: func(ctx context.Context, _ *events.Message, _ bus.Delivery) error {
			handled <- trace.SpanContextFromContext(ctx)
			return nil
		},
	})
	ctx, root := otel.Tracer("test").Start(context.Background(), "change")
	j := job("job-traced")
	if err := b.pub.Publish(ctx, subject, events.TypePackaged, j, &events.Outcome{Job: j}); err != nil {
		t.Fatal(err)
	}
	root.End()
	var got trace.SpanContext
	select {
	case got = <-handled:
	case <-t.Context().Done():
		t.Fatal("not handled")
	}
	id := root.SpanContext().TraceID()
	if got.TraceID() != id {
		t.Fatalf("the handler's trace is %s, want the publisher's %s", got.TraceID(), id)
	}
	var byName map[string]sdktrace.ReadOnlySpan
	eventually(t, "the publish and process spans ended", func() bool {
		byName = spansOf(rec, id)
		return len(byName) == 3
	})
	pub, proc := byName["publish "+events.TypePackaged], byName["process "+events.TypePackaged]
	if pub == nil || proc == nil {
		t.Fatalf("spans %v", byName)
	}
	if pub.Parent().SpanID() != root.SpanContext().SpanID() || pub.SpanKind() != trace.SpanKindProducer {
		t.Errorf("publish span: parent %s kind %s, want the root's child, a producer", pub.Parent().SpanID(), pub.SpanKind())
	}
	if proc.Parent().SpanID() != pub.SpanContext().SpanID() || !proc.Parent().IsRemote() || proc.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("process span: parent %+v kind %s, want the publish span (remote), a consumer", proc.Parent(), proc.SpanKind())
	}
	if got.SpanID() != proc.SpanContext().SpanID() {
		t.Errorf("the handler's span is %s, want the process span %s", got.SpanID(), proc.SpanContext().SpanID())
	}
	for key, want := range map[string]string{
		"headwater.job.id": "job-traced", "headwater.object.name": "podinfo", "headwater.result": "success",
		"messaging.destination.name": subject, "headwater.service": "test",
	} {
		if v := attr(proc, key); v != want {
			t.Errorf("process span %s = %q, want %q", key, v, want)
		}
	}
}

// TestBadTraceHeaderStartsNewTrace: a message whose traceparent is garbage
// or huge is handled and acknowledged, in a span of a trace of its own.
func TestBadTraceHeaderStartsNewTrace(t *testing.T) {
	rec := recordSpans(t)
	b := newTestBus(t)
	cons := b.consumer(t, "badtrace", events.ConsumerOptions{})
	handled := make(chan trace.SpanContext, 2)
	runWorker(t, &bus.Worker{
		Service: "test", Consumer: cons, Concurrency: 1,
		Handler: func(ctx context.Context, _ *events.Message, _ bus.Delivery) error {
			handled <- trace.SpanContextFromContext(ctx)
			return nil
		},
	})
	for i, parent := range []any{"00-zzzz-not-hex-01", "00-" + strings.Repeat("0", 256<<10), map[string]any{"x": 1}} {
		j := job("job-badtrace")
		body, err := events.Encode("tester", events.TypePackaged, "id-"+string(rune('a'+i)), events.ObjectSubject(j.Object), &events.Outcome{Job: j})
		if err != nil {
			t.Fatal(err)
		}
		var wire map[string]any
		if err := json.Unmarshal(body, &wire); err != nil {
			t.Fatal(err)
		}
		wire[events.TraceParentExtension] = parent
		if body, err = json.Marshal(wire); err != nil {
			t.Fatal(err)
		}
		b.publishRaw(t, body)
		var sc trace.SpanContext
		select {
		case sc = <-handled:
		case <-t.Context().Done():
			t.Fatal("not handled")
		}
		if !sc.IsValid() {
			t.Fatalf("handler got no span")
		}
		var s sdktrace.ReadOnlySpan
		eventually(t, "the process span ended", func() bool {
			s = spansOf(rec, sc.TraceID())["process "+events.TypePackaged]
			return s != nil
		})
		if s.Parent().IsValid() {
			t.Errorf("message %d: span has parent %+v, want a new root", i, s.Parent())
		}
		if r := attr(s, "headwater.result"); r != "success" {
			t.Errorf("message %d: result %q, want success", i, r)
		}
	}
	eventually(t, "every message acknowledged", func() bool {
		info := consumerInfo(t, cons)
		return info.NumAckPending == 0 && info.NumPending == 0
	})
}

// BenchmarkPublishHandleTraced is BenchmarkPublishHandle with tracing on:
// an SDK tracer provider that samples and records every span (kept in
// memory, exported nowhere), each message published within a span.
func BenchmarkPublishHandleTraced(b *testing.B) {
	recordSpans(b)
	ctx, span := otel.Tracer("bench").Start(context.Background(), "bench")
	defer span.End()
	benchmarkPublishHandle(b, ctx)
}
