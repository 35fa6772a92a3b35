package events

import (
	"context"
	"encoding/json"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The CloudEvents distributed-tracing extension: every message published
// within a trace carries its W3C trace context (https://www.w3.org/TR/trace-context/)
// in these two extension attributes, so a change is one trace from the
// watcher's reconcile to the status it writes, across every service.
const (
	// TraceParentExtension is the W3C traceparent of the span that
	// published the message ("00-<trace id>-<span id>-<flags>").
	TraceParentExtension = "traceparent"
	// TraceStateExtension is the W3C tracestate that goes with it, when
	// there is one.
	TraceStateExtension = "tracestate"
)

// Bounds of the trace context read from a message. A traceparent is 55
// characters today (version 00); a later version may add fields, but never
// kilobytes. W3C asks tracers to propagate at least 512 characters of
// tracestate and lets them drop the rest. Longer values are dropped whole
// before they are parsed, so a huge header costs nothing.
const (
	maxTraceParent = 256
	maxTraceState  = 512
)

// w3c is the W3C Trace Context format: the contract of the bus, whatever
// propagator a service installs globally.
var w3c propagation.TraceContext

// setTrace sets e's tracing extension attributes from the span context ctx
// carries; without one (tracing off, no incoming trace) it sets nothing.
func setTrace(ctx context.Context, e *cloudevents.Event) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	c := traceCarrier{}
	w3c.Inject(ctx, c)
	for k, v := range c {
		e.SetExtension(k, v)
	}
}

// TraceContext returns ctx with the trace context m carries as its remote
// parent span context, so that spans started from it join the publisher's
// trace. A message without one, or with a malformed, oversized or
// non-string traceparent, returns ctx unchanged: its span starts a new
// trace, and the message is handled as any other. A tracestate that is
// malformed or oversized is dropped alone.
func (m *Message) TraceContext(ctx context.Context) context.Context {
	ext := m.Event.Extensions()
	parent, ok := ext[TraceParentExtension].(string)
	if !ok || parent == "" || len(parent) > maxTraceParent {
		return ctx
	}
	c := traceCarrier{TraceParentExtension: parent}
	if state, ok := ext[TraceStateExtension].(string); ok && len(state) <= maxTraceState {
		c[TraceStateExtension] = state
	}
	return w3c.Extract(ctx, c)
}

// traceCarrier holds the trace context as the propagator reads and writes
// it.
type traceCarrier map[string]string

// Get returns the value of key.
func (c traceCarrier) Get(key string) string { return c[key] }

// Set sets key to value.
func (c traceCarrier) Set(key, value string) { c[key] = value }

// Keys lists the keys set.
func (c traceCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// withoutTrace returns body, a JSON object, without its tracing extension
// attributes, and whether it had any: Decode tries again without them when
// a message does not parse as a CloudEvent.
func withoutTrace(body []byte) ([]byte, bool) {
	var attrs map[string]json.RawMessage
	if json.Unmarshal(body, &attrs) != nil {
		return nil, false
	}
	_, parent := attrs[TraceParentExtension]
	_, state := attrs[TraceStateExtension]
	if !parent && !state {
		return nil, false
	}
	delete(attrs, TraceParentExtension)
	delete(attrs, TraceStateExtension)
	b, err := json.Marshal(attrs)
	return b, err == nil
}
