package telemetry

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/buildinfo"
)

// TestServe serves a registry with the build information and a failing
// readiness check, and reads the three endpoints as Prometheus and the
// kubelet would.
func TestServe(t *testing.T) {
	reg := NewRegistry()
	RegisterBuildInfo(reg, "fetcher")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var notReady Checks
	notReady.Set("nats", func() error { return errors.New("disconnected") })
	if err := Serve(ctx, addr, reg, &notReady, logr.Discard()); err != nil {
		t.Fatal(err)
	}

	info := buildinfo.Get()
	for path, want := range map[string]struct {
		code int
		body string
	}{
		"/metrics": {http.StatusOK, `headwater_build_info{goversion="` + info.GoVersion + `",revision="` + info.Revision +
			`",service="fetcher",version="` + info.Version + `"} 1`},
		"/healthz": {http.StatusOK, "ok"},
		"/readyz":  {http.StatusServiceUnavailable, "nats: disconnected"},
	} {
		var body []byte
		resp, err := http.Get("http://" + addr + path)
		if err == nil {
			body, err = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
		}
		switch {
		case err != nil:
			t.Errorf("GET %s: %v", path, err)
		case resp.StatusCode != want.code || !strings.Contains(string(body), want.body):
			t.Errorf("GET %s = %d, want %d with %q:\n%s", path, resp.StatusCode, want.code, want.body, body)
		}
	}
}

// get reads url and returns its status code and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// TestChecksSetAfterServe serves the endpoints before the service's parts
// are up, as every service does: alive at once, not ready, with the
// reason, until the part's own check is set and passes.
func TestChecksSetAfterServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ready Checks
	ready.Set("nats", Pending("not connected yet"))
	if err := Serve(ctx, addr, nil, &ready, logr.Discard()); err != nil {
		t.Fatal(err)
	}
	base := "http://" + addr

	if code, body := get(t, base+"/healthz"); code != http.StatusOK || body != "ok" {
		t.Errorf("/healthz = %d %q, want 200 ok", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "nats: not connected yet") {
		t.Errorf("/readyz = %d %q, want 503 naming nats", code, body)
	}
	if code, _ := get(t, base+"/metrics"); code != http.StatusNotFound {
		t.Errorf("/metrics without a registry = %d, want 404", code)
	}

	// The part comes up: its own check replaces the pending one.
	up := true
	var mu sync.Mutex
	ready.Set("nats", func() error {
		mu.Lock()
		defer mu.Unlock()
		if !up {
			return errors.New("not connected to nats")
		}
		return nil
	})
	if code, body := get(t, base+"/readyz"); code != http.StatusOK || body != "ok" {
		t.Errorf("/readyz = %d %q, want 200 ok", code, body)
	}
	mu.Lock()
	up = false
	mu.Unlock()
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "nats: not connected to nats") {
		t.Errorf("/readyz after the loss = %d %q, want 503 naming nats", code, body)
	}
	if code, body := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after the loss = %d %q, want 200: liveness never follows a dependency", code, body)
	}
}

// TestChecksInform: a check set with Inform is reported by
// /readyz?verbose and never fails readiness; checks run in name order.
func TestChecksInform(t *testing.T) {
	var ready Checks
	ready.Inform("nats", Pending("not connected yet"))
	ready.Set("storage", nil)
	if err := ready.Err(); err != nil {
		t.Fatalf("Err() = %v, want nil: an informing check does not decide", err)
	}
	rec := httptest.NewRecorder()
	ready.serveReadyz(rec, httptest.NewRequest(http.MethodGet, "/readyz?verbose", nil))
	want := "[-]nats failed (does not affect readiness): not connected yet\n[+]storage ok\nreadyz check passed\n"
	if rec.Code != http.StatusOK || rec.Body.String() != want {
		t.Errorf("verbose /readyz = %d\n%s\nwant 200\n%s", rec.Code, rec.Body, want)
	}

	ready.Set("storage", Pending("not opened yet"))
	ready.Set("cache", Pending("not synced yet"))
	if err := ready.Err(); err == nil || err.Error() != "cache: not synced yet\nstorage: not opened yet" {
		t.Errorf("Err() = %v, want both failures in name order", err)
	}
	rec = httptest.NewRecorder()
	ready.serveReadyz(rec, httptest.NewRequest(http.MethodGet, "/readyz?verbose=1", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "[-]storage failed: not opened yet\n") {
		t.Errorf("verbose /readyz = %d\n%s", rec.Code, rec.Body)
	}

	var none *Checks
	if err := none.Err(); err != nil {
		t.Errorf("nil Checks: Err() = %v, want ready", err)
	}
}

// TestServeOff: an empty address and "0" (Flux's --metrics-addr=0, as
// controller-runtime reads it) serve nothing and are no error.
func TestServeOff(t *testing.T) {
	for _, addr := range []string{"", "0"} {
		if err := Serve(context.Background(), addr, NewRegistry(), nil, logr.Discard()); err != nil {
			t.Errorf("Serve(%q) = %v, want nothing served and no error", addr, err)
		}
	}
	if err := Serve(context.Background(), "no-port", NewRegistry(), nil, logr.Discard()); err == nil {
		t.Error("Serve(\"no-port\") = nil, want the listen error")
	}
}
