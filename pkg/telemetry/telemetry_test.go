package telemetry

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
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
	notReady := map[string]Check{"nats": func() error { return errors.New("disconnected") }}
	if err := Serve(ctx, addr, reg, notReady, logr.Discard()); err != nil {
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
