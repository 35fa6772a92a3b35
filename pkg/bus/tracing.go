package bus

import (
	"context"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// TracerName is the instrumentation scope of the spans of the bus: one
// "publish <event type>" span (a producer) for each message published and
// one "process <event type>" span (a consumer) for each message handled,
// in every service.
const TracerName = "github.com/headwater-gitops/headwater/pkg/bus"

// tracer makes the bus's spans from the global tracer provider: the no-op
// one unless the service traces (package tracing).
var tracer = otel.Tracer(TracerName)

// The options of the bus's spans, made once: a variadic argument built at
// each call would be allocated for every message.
var (
	producer = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}
	consumer = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
)

// spanNames caches "<operation> <event type>", so that a span's name costs
// no allocation once its type has been seen.
var spanNames struct {
	sync.RWMutex
	m map[[2]string]string
}

// spanName returns operation+" "+eventType.
func spanName(operation, eventType string) string {
	key := [2]string{operation, eventType}
	spanNames.RLock()
	name, ok := spanNames.m[key]
	spanNames.RUnlock()
	if ok {
		return name
	}
	name = operation + " " + eventType
	spanNames.Lock()
	defer spanNames.Unlock()
	if spanNames.m == nil {
		spanNames.m = map[[2]string]string{}
	}
	// Event types are a closed set: Encode and Decode refuse the others.
	spanNames.m[key] = name
	return name
}

// Span attributes of the bus's spans, after OpenTelemetry's messaging and
// CloudEvents semantic conventions, and Headwater's own for the job.
const (
	attrMessagingSystem = "messaging.system"
	attrOperation       = "messaging.operation.type"
	attrDestination     = "messaging.destination.name"
	attrMessageID       = "messaging.message.id"
	attrDeliveryCount   = "messaging.nats.delivery.count"
	attrEventType       = "cloudevents.event_type"
	attrEventSubject    = "cloudevents.event_subject"
	attrService         = "headwater.service"
	attrJob             = "headwater.job.id"
	attrKind            = "headwater.object.kind"
	attrNamespace       = "headwater.object.namespace"
	attrName            = "headwater.object.name"
	attrResult          = "headwater.result"
)

// startPublishSpan starts the producer span of a message of eventType
// published on subject with id; the message carries its context.
func startPublishSpan(ctx context.Context, service, subject, eventType, id, ceSubject string) (context.Context, trace.Span) {
	ctx, span := tracer.Start(ctx, spanName("publish", eventType), producer...)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String(attrMessagingSystem, "nats"),
			attribute.String(attrOperation, "send"),
			attribute.String(attrDestination, subject),
			attribute.String(attrMessageID, id),
			attribute.String(attrEventType, eventType),
			attribute.String(attrEventSubject, ceSubject),
			attribute.String(attrService, service))
	}
	return ctx, span
}

// startProcessSpan starts the consumer span of a delivery of m (nil when
// the message did not decode) on subject: the child of the span that
// published it when the message carries a valid trace context, the root of
// a new trace otherwise.
func startProcessSpan(ctx context.Context, service, subject string, m *events.Message, d Delivery) (context.Context, trace.Span) {
	name := "process malformed"
	if m != nil {
		ctx = m.TraceContext(ctx)
		name = spanName("process", m.Event.Type())
	}
	ctx, span := tracer.Start(ctx, name, consumer...)
	if !span.IsRecording() {
		return ctx, span
	}
	span.SetAttributes(
		attribute.String(attrMessagingSystem, "nats"),
		attribute.String(attrOperation, "process"),
		attribute.String(attrDestination, subject),
		attribute.String(attrDeliveryCount, strconv.FormatUint(d.Attempt, 10)),
		attribute.String(attrService, service))
	if m != nil {
		job := events.JobOf(m.Data)
		span.SetAttributes(
			attribute.String(attrMessageID, m.Event.ID()),
			attribute.String(attrEventType, m.Event.Type()),
			attribute.String(attrEventSubject, m.Event.Subject()),
			attribute.String(attrJob, job.ID),
			attribute.String(attrKind, job.Object.Kind),
			attribute.String(attrNamespace, job.Object.Namespace),
			attribute.String(attrName, job.Object.Name))
	}
	return ctx, span
}

// endSpan ends span with the result of its work: err (nil for success)
// and, for a handled message, how it was settled.
func endSpan(span trace.Span, result string, err error) {
	if span.IsRecording() {
		if result != "" {
			span.SetAttributes(attribute.String(attrResult, result))
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}
