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
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/buildinfo"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

func TestFlagDefaults(t *testing.T) {
	fs := flag.NewFlagSet(service, flag.ContinueOnError)
	var o options
	o.bindFlags(fs)
	t.Setenv("HEADWATER_ARTIFACT_RETENTION_RECORDS", "5")
	if err := command.ParseArgs(fs, []string{"-concurrency=3"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if o.telemetry.Addr != ":9102" || o.concurrency != 3 || o.maxAttempts != events.DefaultMaxDeliver || o.stagingTTL != time.Hour ||
		o.packager.DigestAlgo != "sha256" || o.packager.RetentionRecords != 5 ||
		o.packager.RetentionTTL != time.Minute || o.packager.MaxFileSize != 0 || o.packager.ContentCacheTTL != time.Hour ||
		o.packager.MaxUnpackSize != 100<<20 || o.packager.MaxUnpackEntries != 100_000 || o.jobTimeout != 10*time.Minute || o.packager.NoCrossNamespaceRefs {
		t.Errorf("options = %+v", o)
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	for _, args := range [][]string{
		{"-artifact-digest-algo=md5"},
		{"-concurrency=0"},
		{"-max-attempts=0"},
		{"-artifact-retention-records=-1"},
		{"-content-cache-ttl=1m"},
		{"-max-unpack-size=-1"},
		{"-job-timeout=0"},
	} {
		fs := flag.NewFlagSet(service, flag.ContinueOnError)
		var o options
		o.bindFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := run(logr.NewContext(context.Background(), testr.New(t)), o); err == nil {
			t.Errorf("run accepted %q", args)
		}
	}
}

// TestRun starts the service as main does and packages one job through it.
func TestRun(t *testing.T) {
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	addr := freeAddr(t)
	dataDir := t.TempDir()

	fs := flag.NewFlagSet(service, flag.ContinueOnError)
	var o options
	o.bindFlags(fs)
	if err := fs.Parse([]string{"-nats-url=" + ns.ClientURL(), "-storage-path=" + dataDir, "-telemetry-addr=" + addr}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(logr.NewContext(ctx, testr.New(t)), o) }()

	// Ready once connected.
	eventually(t, "ready", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	// A fetcher's job: stage and publish.
	client, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "fetcher", testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	store, err := storage.NewDir(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "README.md"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	var tarball bytes.Buffer
	if _, err := archive.WriteTar(ctx, &tarball, src, archive.TarOptions{}); err != nil {
		t.Fatal(err)
	}
	j := events.Job{ID: "job-1", Object: events.ObjectRef{Kind: "GitRepository", Namespace: "default", Name: "podinfo"}}
	f := &events.Fetched{Job: j, Revision: "main@sha1:abc", Staging: storage.StagingKey(j.ID), ArtifactName: "abc.tar.gz"}
	if _, err := store.Put(ctx, f.Staging, &tarball); err != nil {
		t.Fatal(err)
	}
	if err := client.NewPublisher("fetcher").Publish(ctx, events.PackageSubject(j.Object.Kind), events.TypeFetched, j, f); err != nil {
		t.Fatal(err)
	}

	results, err := client.EnsureConsumer(ctx, events.PublishStream, jetstream.ConsumerConfig{Durable: "test", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := results.Next(jetstream.FetchMaxWait(15 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m, err := events.Decode(msg.Data())
	if err != nil {
		t.Fatal(err)
	}
	out := m.Data.(*events.Outcome)
	if m.Event.Type() != events.TypePackaged || out.Artifact == nil || out.Artifact.Path != "gitrepository/default/podinfo/abc.tar.gz" {
		t.Fatalf("result %s %+v, want Packaged abc.tar.gz", m.Event.Type(), out)
	}
	if err := storage.Verify(ctx, store, out.Artifact.Path, out.Artifact.Digest); err != nil {
		t.Error(err)
	}

	build := buildinfo.Get()
	eventually(t, "metrics exported", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body bytes.Buffer
		_, _ = body.ReadFrom(resp.Body)
		for _, sample := range []string{
			"headwater_artifact_bytes_count 1",
			"headwater_gc_deleted_total 0",
			`headwater_jobs_total{result="success",service="packager",type="` + events.TypeFetched + `"} 1`,
			`headwater_build_info{goversion="` + build.GoVersion + `",revision="` + build.Revision +
				`",service="packager",version="` + build.Version + `"} 1`,
		} {
			if !strings.Contains(body.String(), sample) {
				return false
			}
		}
		return true
	})

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

// TestRunWaitsForNATS starts the service before NATS: it is alive at
// once, not ready while nothing listens at its NATS URL, saying so, and
// ready once a server starts there.
func TestRunWaitsForNATS(t *testing.T) {
	natsAddr := freeAddr(t)
	_, natsPort, err := net.SplitHostPort(natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(natsPort)
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)

	fs := flag.NewFlagSet(service, flag.ContinueOnError)
	var o options
	o.bindFlags(fs)
	if err := fs.Parse([]string{"-nats-url=nats://" + natsAddr, "-storage-path=" + t.TempDir(), "-telemetry-addr=" + addr}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(logr.NewContext(ctx, testr.New(t)), o) }()

	probe := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	eventually(t, "alive", func() bool { code, _ := probe("/healthz"); return code == http.StatusOK })
	eventually(t, "not ready, waiting for nats", func() bool {
		code, body := probe("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "nats: connecting to nats://"+natsAddr+": ")
	})
	if code, body := probe("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while nats is down = %d %q, want 200", code, body)
	}

	ns, err := natsserver.Start(natsserver.Options{Port: port, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	eventually(t, "ready once nats is up", func() bool { code, _ := probe("/readyz"); return code == http.StatusOK })
	eventually(t, "headwater_bus_ready 1", func() bool {
		_, body := probe("/metrics")
		return strings.Contains(body, `headwater_bus_ready{service="packager"} 1`)
	})

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after cancel")
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

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true within 15s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
