package role

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/buildinfo"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

func TestFlags(t *testing.T) {
	t.Setenv("HEADWATER_STORAGE_ADV_ADDR", "artifacts.flux-system.svc:80")
	t.Setenv("HEADWATER_EVENT_SINK_URL", "http://a/hook,http://b/hook")
	var o options
	fs := flag.NewFlagSet(service, flag.ContinueOnError)
	o.bindFlags(fs)
	if err := command.ParseArgs(fs, []string{"-concurrency", "3"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if o.addr != ":9090" || o.telemetry.Addr != ":9103" || o.concurrency != 3 {
		t.Errorf("addr %q telemetry %q concurrency %d", o.addr, o.telemetry.Addr, o.concurrency)
	}
	if o.advAddr != "artifacts.flux-system.svc:80" {
		t.Errorf("advAddr = %q", o.advAddr)
	}
	if len(o.sinks) != 2 || o.sinks[1] != "http://b/hook" {
		t.Errorf("sinks = %v", o.sinks)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func get(url string) (int, []byte, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// TestRun starts the whole service against a real NATS server and storage
// directory: it becomes ready, serves an artifact, announces a result with
// the artifact's URL, and stops cleanly when its context ends.
// storeAndGet writes an artifact into the directory storage at dir and
// downloads it from the artifact-server at addr, failing t (with what in
// the message) unless the same bytes come back. It returns the artifact's
// key and content.
func storeAndGet(ctx context.Context, t *testing.T, dir, addr, what string) (key string, content []byte) {
	t.Helper()
	store, err := storage.NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	key = storage.ArtifactKey("GitRepository", "default", "podinfo", "abc.tar.gz")
	content = []byte("artifact bytes")
	if _, err := store.Put(ctx, key, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if code, body, err := get("http://" + addr + "/" + key); err != nil || code != http.StatusOK || !bytes.Equal(body, content) {
		t.Fatalf("%s: %d %q %v", what, code, body, err)
	}
	return key, content
}

func TestRun(t *testing.T) {
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	dir := filepath.Join(t.TempDir(), "data")

	var o options
	fs := flag.NewFlagSet(service, flag.ContinueOnError)
	o.bindFlags(fs)
	addr, telemetryAddr := freeAddr(t), freeAddr(t)
	if err := fs.Parse([]string{"-nats-url", ns.ClientURL(), "-storage-path", dir, "-storage-addr", addr,
		"-telemetry-addr", telemetryAddr, "-log-level", "error"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- run(ctx, o) }()

	deadline := time.Now().Add(60 * time.Second)
	for {
		if code, _, err := get("http://" + telemetryAddr + "/readyz"); err == nil && code == http.StatusOK {
			break
		}
		select {
		case err := <-runErr:
			t.Fatalf("run ended early: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("not ready")
		}
		time.Sleep(20 * time.Millisecond)
	}

	key, content := storeAndGet(ctx, t, dir, addr, "GET artifact")

	conn, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "test", logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sub, err := conn.NC.SubscribeSync(events.EventSubjectPrefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	job := events.Job{ID: "job-1", Object: events.ObjectRef{Kind: "GitRepository", Namespace: "default", Name: "podinfo", UID: "u", Generation: 1}}
	out := events.Outcome{Job: job, Artifact: &meta.Artifact{Path: key, Revision: "main@sha1:abc", Digest: "sha256:" + string(bytes.Repeat([]byte("0"), 64))}}
	if err := conn.NewPublisher("packager").Publish(ctx, events.PublishSubject("GitRepository"), events.TypePackaged, job, &out); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m, err := events.Decode(msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	url := m.Data.(*events.Outcome).Artifact.URL
	if url != "http://"+addr+"/"+key {
		t.Fatalf("announced URL %q", url)
	}
	// The announced URL downloads the artifact.
	if code, body, err := get(url); err != nil || code != http.StatusOK || !bytes.Equal(body, content) {
		t.Fatalf("GET announced URL: %d %q %v", code, body, err)
	}
	// The job is counted once it is acknowledged, just after the announcement;
	// the HTTP requests and the build information are there by then.
	build := buildinfo.Get()
	for want := []byte(`headwater_jobs_total{result="success",service="artifact-server",type="` + events.TypePackaged + `"} 1`); ; {
		code, body, err := get("http://" + telemetryAddr + "/metrics")
		if err == nil && code == http.StatusOK && bytes.Contains(body, want) {
			if !bytes.Contains(body, []byte(`headwater_http_requests_total{code="200",method="GET"} 2`)) ||
				!bytes.Contains(body, []byte(`headwater_build_info{goversion="`+build.GoVersion+`",revision="`+build.Revision+
					`",service="artifact-server",version="`+build.Version+`"} 1`)) {
				t.Fatalf("http or build metrics missing:\n%s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics: %d %v\n%s", code, err, body)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Not ready while the storage is gone, ready again once it is back;
	// still ready while NATS is down: the artifacts are on disk.
	readyz := func(wantCode int, wantBody string) {
		t.Helper()
		for {
			code, body, err := get("http://" + telemetryAddr + "/readyz")
			if err == nil && code == wantCode && bytes.Contains(body, []byte(wantBody)) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz: %d %q %v, want %d %q", code, body, err, wantCode, wantBody)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := os.Rename(dir, dir+"-gone"); err != nil {
		t.Fatal(err)
	}
	readyz(http.StatusServiceUnavailable, "storage: ")
	if err := os.Rename(dir+"-gone", dir); err != nil {
		t.Fatal(err)
	}
	readyz(http.StatusOK, "ok")
	ns.Shutdown()
	ns.WaitForShutdown()
	for {
		code, body, err := get("http://" + telemetryAddr + "/readyz?verbose")
		if err == nil && code == http.StatusOK && bytes.Contains(body, []byte("[-]nats failed (does not affect readiness): not connected")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz?verbose with NATS down: %d %q %v, want 200 reporting nats", code, body, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body, err := get("http://" + addr + "/" + key); err != nil || code != http.StatusOK || !bytes.Equal(body, content) {
		t.Fatalf("GET artifact with NATS down: %d %q %v", code, body, err)
	}

	cancel()
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop")
	}
	if _, _, err := get("http://" + addr + "/" + key); err == nil {
		t.Error("artifact server still answers after shutdown")
	}
}

// TestRunServesWithoutNATS starts the service while nothing listens at its
// NATS URL: it is alive and ready (its storage is), serves an artifact,
// and reports the bus as down without failing readiness, until a NATS
// server starts there.
func TestRunServesWithoutNATS(t *testing.T) {
	natsAddr := freeAddr(t)
	_, natsPort, err := net.SplitHostPort(natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(natsPort)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "data")
	var o options
	fs := flag.NewFlagSet(service, flag.ContinueOnError)
	o.bindFlags(fs)
	addr, telemetryAddr := freeAddr(t), freeAddr(t)
	if err := fs.Parse([]string{"-nats-url", "nats://" + natsAddr, "-storage-path", dir, "-storage-addr", addr,
		"-telemetry-addr", telemetryAddr, "-log-level", "error"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- run(ctx, o) }()

	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			select {
			case err := <-runErr:
				t.Fatalf("run ended early: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not true within 30s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	eventually("alive", func() bool {
		code, _, err := get("http://" + telemetryAddr + "/healthz")
		return err == nil && code == http.StatusOK
	})
	eventually("ready, reporting nats", func() bool {
		code, body, err := get("http://" + telemetryAddr + "/readyz?verbose")
		return err == nil && code == http.StatusOK &&
			bytes.Contains(body, []byte("[-]nats failed (does not affect readiness): connecting to nats://"+natsAddr+": ")) &&
			bytes.Contains(body, []byte("[+]storage ok"))
	})
	if code, body, err := get("http://" + telemetryAddr + "/readyz"); err != nil || code != http.StatusOK {
		t.Errorf("/readyz with NATS down: %d %q %v, want 200", code, body, err)
	}
	busReady := func(v string) func() bool {
		return func() bool {
			_, body, err := get("http://" + telemetryAddr + "/metrics")
			return err == nil && bytes.Contains(body, []byte(`headwater_bus_ready{service="artifact-server"} `+v))
		}
	}
	eventually("headwater_bus_ready 0", busReady("0"))

	storeAndGet(ctx, t, dir, addr, "GET artifact with NATS down")

	ns, err := natsserver.Start(natsserver.Options{Port: port, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	eventually("headwater_bus_ready 1", busReady("1"))
	eventually("nats reported up", func() bool {
		_, body, err := get("http://" + telemetryAddr + "/readyz?verbose")
		return err == nil && bytes.Contains(body, []byte("[+]nats ok"))
	})

	cancel()
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop")
	}
}
