// Package tracing turns on OpenTelemetry tracing in a service when the
// operator configures an OTLP endpoint, with the standard OTEL_* environment
// variables, and leaves the no-op tracer provider in place otherwise.
//
// Spans are made where the work is (pkg/bus for every message published and
// handled, the services for their own steps) through otel.Tracer; the trace
// context travels on the bus in the CloudEvents distributed-tracing
// extension (pkg/events). This package only decides whether those spans go
// anywhere:
//
//   - OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set,
//     or OTEL_TRACES_EXPORTER=otlp: spans are batched and exported by OTLP,
//     over HTTP (http/protobuf, the default) or gRPC
//     (OTEL_EXPORTER_OTLP_PROTOCOL or OTEL_EXPORTER_OTLP_TRACES_PROTOCOL =
//     grpc). The exporter, the batcher (OTEL_BSP_*), the sampler
//     (OTEL_TRACES_SAMPLER, parent-based always-on by default) and the
//     resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) read the rest of
//     the standard variables themselves.
//   - otherwise, or OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true:
//     nothing is installed, and every span is OpenTelemetry's no-op.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/headwater-gitops/headwater/pkg/buildinfo"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// Protocols of the OTLP exporter (OTEL_EXPORTER_OTLP_PROTOCOL).
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Config is what the environment asks of tracing.
type Config struct {
	// Enabled is true when spans are exported.
	Enabled bool
	// Protocol is the OTLP exporter's, ProtocolHTTP or ProtocolGRPC.
	Protocol string
}

// ConfigFromEnv reads Config from the standard OpenTelemetry variables
// through getenv (os.Getenv in a service). An exporter or protocol that
// Headwater does not ship is an error, so a typo does not silently turn
// tracing off.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return Config{}, nil
	}
	endpoint := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	var c Config
	switch exporter := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exporter {
	case "":
		c.Enabled = endpoint
	case "otlp":
		c.Enabled = true
	case "none":
		return Config{}, nil
	default:
		return Config{}, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: only otlp and none are supported", exporter)
	}
	if !c.Enabled {
		return Config{}, nil
	}
	protocol := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch protocol = strings.TrimSpace(protocol); protocol {
	case "", ProtocolHTTP:
		c.Protocol = ProtocolHTTP
	case ProtocolGRPC:
		c.Protocol = ProtocolGRPC
	default:
		return Config{}, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: only %s and %s are supported", protocol, ProtocolHTTP, ProtocolGRPC)
	}
	return c, nil
}

// Start installs the global tracer provider of service as c asks and
// returns what flushes and stops it, which the service calls on its way
// out. When c is not Enabled it installs nothing (the global provider stays
// OpenTelemetry's no-op) and shutdown does nothing. Export failures are
// logged to log.
func Start(ctx context.Context, service string, c Config, log logr.Logger) (shutdown func(context.Context) error, err error) {
	if !c.Enabled {
		return func(context.Context) error { return nil }, nil
	}
	var exp sdktrace.SpanExporter
	switch c.Protocol {
	case ProtocolGRPC:
		exp, err = otlptracegrpc.New(ctx)
	default:
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// Later options win: the environment's service name and attributes
	// override Headwater's.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "headwater-"+service),
			attribute.String("service.version", buildinfo.Get().Version)),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetLogger(log)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Error(err, "tracing") }))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	log.Info("exporting traces by OTLP", "protocol", c.Protocol)
	return tp.Shutdown, nil
}

// StartFromEnv is Start with the Config of the process's environment.
func StartFromEnv(ctx context.Context, service string, log logr.Logger) (shutdown func(context.Context) error, err error) {
	c, err := ConfigFromEnv(os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	return Start(ctx, service, c, log)
}

// Span attributes Headwater's own spans carry for the object a job is for.
const (
	AttrJob       = "headwater.job.id"
	AttrKind      = "headwater.object.kind"
	AttrNamespace = "headwater.object.namespace"
	AttrName      = "headwater.object.name"
)

// StartJob starts the span of a step of job's work (a fetch, a package, a
// status write), named name, with tracer: a child of the span ctx carries,
// which for a job off the bus is the worker's span of the message. The
// job's attributes are set only when the span records, so tracing off
// costs a no-op span.
func StartJob(ctx context.Context, tracer trace.Tracer, name string, job events.Job) (context.Context, trace.Span) {
	ctx, span := tracer.Start(ctx, name)
	if span.IsRecording() {
		span.SetAttributes(JobAttributes(job)...)
	}
	return ctx, span
}

// JobAttributes are the attributes that name job and its object.
func JobAttributes(job events.Job) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String(AttrJob, job.ID),
		attribute.String(AttrKind, job.Object.Kind),
		attribute.String(AttrNamespace, job.Object.Namespace),
		attribute.String(AttrName, job.Object.Name),
	}
}

// End ends span, recording err (nil for success) as its error status.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
