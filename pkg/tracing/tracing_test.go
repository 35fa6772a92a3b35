package tracing

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/headwater-gitops/headwater/testsupport/otlpreceiver"
)

func TestConfigFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    Config
		wantErr bool
	}{
		{name: "nothing set: off"},
		{name: "endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, want: Config{Enabled: true, Protocol: ProtocolHTTP}},
		{name: "traces endpoint, grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			want: Config{Enabled: true, Protocol: ProtocolGRPC}},
		{name: "traces protocol wins", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, want: Config{Enabled: true, Protocol: ProtocolHTTP}},
		{name: "otlp exporter without endpoint", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: Config{Enabled: true, Protocol: ProtocolHTTP}},
		{name: "exporter none", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_TRACES_EXPORTER": "none"}},
		{name: "sdk disabled", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_SDK_DISABLED": "true"}},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: true},
		{name: "unknown protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, wantErr: true},
		{name: "unknown protocol, off", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ConfigFromEnv(func(k string) string { return tc.env[k] })
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("config = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestStartOffInstallsNothing(t *testing.T) {
	before := otel.GetTracerProvider()
	shutdown, err := Start(context.Background(), "test", Config{}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if otel.GetTracerProvider() != before {
		t.Error("tracing off installed a tracer provider")
	}
	_, span := otel.Tracer("test").Start(context.Background(), "x")
	if span.IsRecording() {
		t.Error("tracing off records spans")
	}
}

// TestStartExports: with an endpoint, a service's spans reach a real OTLP
// receiver, over HTTP and over gRPC, named for the service. (The global
// provider is replaced by each Start; spans are made from the provider
// Start installs.)
func TestStartExports(t *testing.T) {
	rcv, err := otlpreceiver.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	for _, tc := range []struct{ protocol, endpoint string }{
		{ProtocolHTTP, rcv.HTTPEndpoint()},
		{ProtocolGRPC, rcv.GRPCEndpoint()},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", tc.endpoint)
			t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tc.protocol)
			ctx := context.Background()
			shutdown, err := StartFromEnv(ctx, "fetcher", testr.New(t))
			if err != nil {
				t.Fatal(err)
			}
			_, span := otel.GetTracerProvider().Tracer("test").Start(ctx, "fetch "+tc.protocol)
			id := span.SpanContext().TraceID()
			span.End()
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := shutdown(sctx); err != nil {
				t.Fatal(err)
			}
			spans, err := rcv.Trace(id[:])
			if err != nil {
				t.Fatal(err)
			}
			if len(spans) != 1 || spans[0].Name != "fetch "+tc.protocol || spans[0].Service != "headwater-fetcher" ||
				spans[0].Kind != 1 /* internal */ {
				t.Errorf("received %+v", spans)
			}
			if trace.SpanContextFromContext(ctx).IsValid() {
				t.Error("context changed")
			}
		})
	}
}
