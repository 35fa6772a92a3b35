package helmchartfetch

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v3/pkg/registry"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	registryserver "github.com/headwater-gitops/headwater/testsupport/registry"
)

// TestFetchChartOCIHeld pulls charts from the CNCF distribution registry
// behind a proxy that answers 429 with Retry-After to the requests a test
// case names: the tags listing (Helm's registry client) or the manifest
// (go-containerregistry). The fetch fails, the fetch's tracker learns the
// registry's host held it (the fetch handler answers RateLimited from it),
// the limiter holds the host, and no request reaches the registry while it
// is held, however the client retries.
func TestFetchChartOCIHeld(t *testing.T) {
	srv := registryserver.New(t, registryserver.Options{})
	push, err := registry.NewClient(registry.ClientOptPlainHTTP(), registry.ClientOptWriter(io.Discard),
		registry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "creds.json")))
	must(t, err)
	p, err := chartrepo.Package(t.TempDir(), chartrepo.Chart{Name: "podinfo", Version: "6.0.0"})
	must(t, err)
	data, err := os.ReadFile(p)
	must(t, err)
	_, err = push.Push(data, srv.Host+"/charts/podinfo:6.0.0")
	must(t, err)

	target, err := url.Parse("http://" + srv.Host)
	must(t, err)
	upstream := httputil.NewSingleHostReverseProxy(target)
	var refuse atomic.Value // the path part refused with 429
	refuse.Store("")
	var refused, served atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if part := refuse.Load().(string); part != "" && strings.Contains(r.URL.Path, part) {
			refused.Add(1)
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		served.Add(1)
		upstream.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	host := strings.TrimPrefix(proxy.URL, "http://")
	cs := &events.ChartSource{Kind: sourcev1.HelmRepositoryKind, Name: "oci", HelmRepository: &sourcev1.HelmRepositorySpec{
		URL: "oci://" + host + "/charts", Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true}}

	for _, tc := range []struct {
		name, refuse, version string
	}{
		{"tags", "/tags/list", "6.x"},
		{"manifest", "/manifests/", "6.0.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refuse.Store(tc.refuse)
			refused.Store(0)
			l := &hostlimit.Limiter{Rules: hostlimit.Rules{}, Store: &hostlimit.MemoryStore{}}
			s := &Source{}
			s.Limit(l)
			ctx, tracker := hostlimit.Track(t.Context())
			req := request(sourcev1.HelmChartSpec{Chart: "podinfo", Version: tc.version}, cs)
			res, err := s.Resolve(ctx, req)
			if err == nil {
				_, err = res.Download(ctx, t.TempDir())
			}
			if f := failure.As(err); f == nil || f.Handling == failure.Stalling {
				t.Fatalf("fetch through a refusing registry: %v, want a failure that is not stalling", err)
			}
			h := tracker.Held()
			if h == nil || !h.ByHost || h.Host != host {
				t.Fatalf("the fetch's tracker holds %v (fetch: %v), want the registry's host %s held by the host", h, err, host)
			}
			if err := l.Acquire(t.Context(), host); !errors.As(err, new(*hostlimit.HeldError)) {
				t.Errorf("next request to the registry: %v, want a *HeldError", err)
			}
			if n := refused.Load(); n != 1 {
				t.Errorf("the registry refused %d requests, want 1: none is sent while it is held", n)
			}
		})
	}
	refuse.Store("")
	if served.Load() == 0 {
		t.Error("no request reached the registry through the proxy")
	}
}
