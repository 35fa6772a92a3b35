package role

import (
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/acl"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/buildinfo"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

func TestFlags(t *testing.T) {
	var o options
	fs := flag.NewFlagSet(service, flag.ContinueOnError)
	o.bindFlags(fs)
	t.Setenv("HEADWATER_MAX_ATTEMPTS", "7")
	if err := command.ParseArgs(fs, []string{"-concurrency", "2"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if o.concurrency != 2 || o.maxAttempts != 7 || o.maxFileSize != 0 || o.jobTimeout != 10*time.Minute || o.maxJobTimeout != time.Hour || o.telemetry.Addr != ":9101" || o.secrets.Kubeconfig != "" || o.bucketConcurrency != 8 ||
		o.refCacheTTL != 2*time.Second || !o.contentCache {
		t.Errorf("options = %+v", o)
	}
}

// TestJobDeadline: a job's deadline is its source's need (spec.timeout
// plus a minute) within -job-timeout and -max-job-timeout, so a tenant's
// long spec.timeout cannot hold a slot past the cap; a cap below
// -job-timeout is refused.
func TestJobDeadline(t *testing.T) {
	o := options{jobTimeout: 10 * time.Minute, maxJobTimeout: time.Hour}
	for need, want := range map[time.Duration]time.Duration{
		0:                           10 * time.Minute, // a kind that bounds nothing itself
		2 * time.Minute:             10 * time.Minute,
		30 * time.Minute:            30 * time.Minute,
		240 * time.Hour:             time.Hour, // spec.timeout of days
		time.Hour + time.Nanosecond: time.Hour,
	} {
		if got := o.jobDeadline(need); got != want {
			t.Errorf("jobDeadline(%s) = %s, want %s", need, got, want)
		}
	}
	var bad options
	bad.bindFlags(flag.NewFlagSet(service, flag.ContinueOnError))
	bad.maxJobTimeout = bad.jobTimeout - time.Second
	if _, err := bad.check(); err == nil || !strings.Contains(err.Error(), "--max-job-timeout") {
		t.Errorf("check with -max-job-timeout below -job-timeout: %v, want it refused", err)
	}
}

// TestRun starts the fetcher as main does, without a cluster, and has it
// fetch a repository.
func TestRun(t *testing.T) {
	// run points TMPDIR at its own work directory, removed when it
	// stops: the next test's is the test binary's again.
	t.Setenv("TMPDIR", os.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()

	root := t.TempDir()
	repo, err := gitserver.NewRepo(root, "app", t.TempDir(), "main")
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Write(map[string]string{"app.yaml": "kind: Namespace\n"}); err != nil {
		t.Fatal(err)
	}
	commit, err := repo.Commit("add app")
	if err != nil {
		t.Fatal(err)
	}
	srv := &gitserver.Server{Root: root}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Stop() }()

	var o options
	o.bindFlags(flag.NewFlagSet(service, flag.ContinueOnError))
	o.bus.URL = ns.ClientURL()
	o.storage.Path = t.TempDir()
	o.telemetry.Addr = freeAddr(t)
	o.secrets.Kubeconfig = filepath.Join(t.TempDir(), "no-cluster")
	// The git server is on loopback, which the egress policy refuses
	// by default.
	if err := o.egress.Policy.Allowed.Set("127.0.0.0/8"); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, o) }()

	waitReady(t, "http://"+o.telemetry.Addr+"/readyz")

	conn, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "test", logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &events.FetchRequested{
		Job:           events.Job{ID: "job-1", Object: events.ObjectRef{Kind: sourcev1.GitRepositoryKind, Namespace: "default", Name: "app"}},
		GitRepository: &sourcev1.GitRepositorySpec{URL: srv.RepoURL("app"), Reference: &sourcev1.GitRepositoryRef{Branch: "main"}},
	}
	if err := conn.NewPublisher("test").Publish(ctx, events.FetchSubject(sourcev1.GitRepositoryKind), events.TypeFetchRequested, req.Job, req); err != nil {
		t.Fatal(err)
	}
	cons, err := conn.EnsureConsumer(ctx, events.PackageStream, events.Consumer(events.PackageStream, "test", events.ConsumerOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m, err := events.Decode(msg.Data())
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := m.Data.(*events.Fetched); !ok || f.Revision != "main@sha1:"+commit {
		t.Errorf("fetched = %+v, want revision main@sha1:%s", m.Data, commit)
	}

	// The job is counted once the handler returns, just after it publishes;
	// the build information is there from the start.
	build := buildinfo.Get()
	families := []string{"headwater_fetch_duration_seconds", "headwater_fetch_bytes_total", `headwater_jobs_total{result="success"`,
		`headwater_build_info{goversion="` + build.GoVersion + `",revision="` + build.Revision +
			`",service="fetcher",version="` + build.Version + `"} 1`}
	deadline := time.Now().Add(30 * time.Second)
	for missing := families; len(missing) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %q after 30s", missing)
		}
		body := get(t, "http://"+o.telemetry.Addr+"/metrics")
		missing = nil
		for _, family := range families {
			if !strings.Contains(body, family) {
				missing = append(missing, family)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}

	stop()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
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

func waitReady(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s not ready after 30s", url)
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRunEgressRefused starts the fetcher as main does, with the egress
// policy's defaults, and has it fetch a repository on loopback: the first
// attempt fails Stalled with Flux's AccessDenied, in FetchFailed, with the
// policy's words and nothing of what listens there, and the job is not
// tried again.
func TestRunEgressRefused(t *testing.T) {
	// run points TMPDIR at its own work directory, removed when it
	// stops: the next test's is the test binary's again.
	t.Setenv("TMPDIR", os.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	root := t.TempDir()
	repo, err := gitserver.NewRepo(root, "app", t.TempDir(), "main")
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Write(map[string]string{"app.yaml": "kind: Namespace\n"}); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Commit("first"); err != nil {
		t.Fatal(err)
	}
	srv := &gitserver.Server{Root: root}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Stop() }()

	var o options
	o.bindFlags(flag.NewFlagSet(service, flag.ContinueOnError))
	o.bus.URL = ns.ClientURL()
	o.storage.Path = t.TempDir()
	o.telemetry.Addr = freeAddr(t)
	o.secrets.Kubeconfig = filepath.Join(t.TempDir(), "no-cluster")
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, o) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	waitReady(t, "http://"+o.telemetry.Addr+"/readyz")

	conn, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "test", logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &events.FetchRequested{
		Job:           events.Job{ID: "job-refused", Object: events.ObjectRef{Kind: sourcev1.GitRepositoryKind, Namespace: "default", Name: "app"}},
		GitRepository: &sourcev1.GitRepositorySpec{URL: srv.RepoURL("app"), Reference: &sourcev1.GitRepositoryRef{Branch: "main"}},
	}
	cons, err := conn.EnsureConsumer(ctx, events.PublishStream, events.Consumer(events.PublishStream, "test", events.ConsumerOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.NewPublisher("test").Publish(ctx, events.FetchSubject(sourcev1.GitRepositoryKind), events.TypeFetchRequested, req.Job, req); err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m, err := events.Decode(msg.Data())
	if err != nil {
		t.Fatal(err)
	}
	out, ok := m.Data.(*events.Outcome)
	if !ok || m.Event.Type() != events.TypeFetchFailed || out.Failure == nil {
		t.Fatalf("outcome %s %+v, want FetchFailed", m.Event.Type(), m.Data)
	}
	f := out.Failure
	if f.Condition != sourcev1.FetchFailedCondition || f.Reason != acl.AccessDeniedReason || !f.Stalled || f.Retrying ||
		!strings.HasSuffix(f.Message, egress.ErrRefused.Error()) {
		t.Errorf("failure %+v, want FetchFailed, AccessDenied, stalled, not retried, ending in %q", f, egress.ErrRefused)
	}
	// Nothing reached the server: the policy refused the dial.
	if listings, fetches := srv.Counts(); listings+fetches != 0 || strings.Contains(f.Message, "connection refused") {
		t.Errorf("the git server answered (%d listings, %d fetches), or the message says it did: %s", listings, fetches, f.Message)
	}
}
