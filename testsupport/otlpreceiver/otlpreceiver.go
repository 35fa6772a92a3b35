// Package otlpreceiver is an OpenTelemetry collector's trace receiver for
// tests: the OTLP trace service over gRPC and over HTTP (POST /v1/traces,
// binary or JSON protobuf, gzip or not), built from the protocol's own
// service definitions (go.opentelemetry.io/proto/otlp), that keeps the
// spans it is sent so a test can look for its trace.
package otlpreceiver

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// maxBody bounds an HTTP export request.
const maxBody = 64 << 20

// Span is a span received, with the service.name of the resource that sent
// it and its instrumentation scope.
type Span struct {
	Service string
	Scope   string
	*tracepb.Span
}

// Attr returns the string form of the span's attribute key ("" when it has
// none).
func (s Span) Attr(key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			if v, ok := kv.GetValue().GetValue().(*commonpb.AnyValue_StringValue); ok {
				return v.StringValue
			}
			return kv.GetValue().String()
		}
	}
	return ""
}

// Receiver receives OTLP trace exports on GRPCAddr and HTTPAddr.
type Receiver struct {
	// GRPCAddr and HTTPAddr are the host:port the receiver listens on.
	GRPCAddr, HTTPAddr string

	coltracepb.UnimplementedTraceServiceServer
	grpc *grpc.Server
	http *http.Server

	mu       sync.Mutex
	spans    []Span
	requests int
}

// Start starts a receiver on two free ports of 127.0.0.1. Close stops it.
func Start() (*Receiver, error) {
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("otlp receiver: %w", err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = gl.Close()
		return nil, fmt.Errorf("otlp receiver: %w", err)
	}
	r := &Receiver{GRPCAddr: gl.Addr().String(), HTTPAddr: hl.Addr().String()}
	r.grpc = grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(r.grpc, r)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	r.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.grpc.Serve(gl) }()
	go func() { _ = r.http.Serve(hl) }()
	return r, nil
}

// HTTPEndpoint is the OTEL_EXPORTER_OTLP_ENDPOINT of the HTTP receiver.
func (r *Receiver) HTTPEndpoint() string { return "http://" + r.HTTPAddr }

// GRPCEndpoint is the OTEL_EXPORTER_OTLP_ENDPOINT of the gRPC receiver.
func (r *Receiver) GRPCEndpoint() string { return "http://" + r.GRPCAddr }

// Close stops both servers.
func (r *Receiver) Close() {
	r.grpc.Stop()
	_ = r.http.Close()
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Requests counts the export requests received.
func (r *Receiver) Requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

// Export receives an export over gRPC.
func (r *Receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// serveHTTP receives an export over HTTP (OTLP/HTTP).
func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = http.MaxBytesReader(w, req.Body, maxBody)
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		defer zr.Close()
		body = io.LimitReader(zr, maxBody)
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var in coltracepb.ExportTraceServiceRequest
	json := req.Header.Get("Content-Type") == "application/json"
	if json {
		err = protojson.Unmarshal(b, &in)
	} else {
		err = proto.Unmarshal(b, &in)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&in)
	var out []byte
	if json {
		out, err = protojson.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/json")
	} else {
		out, err = proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	_, _ = w.Write(out)
}

// add keeps the spans of an export.
func (r *Receiver) add(req *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, Span{Service: service, Scope: ss.GetScope().GetName(), Span: s})
			}
		}
	}
}

// ErrNoTrace is returned by Trace when no span was received for the trace.
var ErrNoTrace = errors.New("no span of the trace received")

// Trace returns the spans received of the trace whose 16-byte ID is id.
func (r *Receiver) Trace(id []byte) ([]Span, error) {
	var out []Span
	for _, s := range r.Spans() {
		if string(s.TraceId) == string(id) {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, ErrNoTrace
	}
	return out, nil
}
