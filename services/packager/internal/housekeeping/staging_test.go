package housekeeping

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// env is a package stream on an embedded NATS server and a directory
// storage.
type env struct {
	t      *testing.T
	conn   *bus.Conn
	stream jetstream.Stream
	store  *testStore
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	conn, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "housekeeping-test", testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if err := conn.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	stream, err := conn.JS.Stream(ctx, events.PackageStream)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, conn: conn, stream: stream, store: newTestStore(t)}
}

// stage stores staged content for a job, aged by age.
func (e *env) stage(jobID string, age time.Duration) string {
	e.t.Helper()
	key := storage.StagingKey(jobID)
	e.store.putAged(key, jobID, age)
	return key
}

// fetched publishes a Fetched job for jobID on the package stream.
func (e *env) fetched(jobID string) {
	e.t.Helper()
	j := events.Job{ID: jobID, Object: events.ObjectRef{Kind: "GitRepository", Namespace: "default", Name: "podinfo"}}
	f := &events.Fetched{Job: j, Revision: "main@sha1:1", Staging: storage.StagingKey(jobID), ArtifactName: "1.tar.gz"}
	if err := e.conn.NewPublisher("fetcher").Publish(context.Background(), events.PackageSubject(j.Object.Kind), events.TypeFetched, j, f); err != nil {
		e.t.Fatal(err)
	}
}

func TestSweepStaging(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	pendingOld := e.stage("pending-old", 3*time.Hour)
	abandoned := e.stage("abandoned", 2*time.Hour)
	young := e.stage("young", time.Minute)
	e.fetched("pending-old")
	// Messages that do not name staged content are read past.
	if _, err := e.conn.JS.Publish(ctx, events.PackageSubject("GitRepository"), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	e.fetched("no-staging-left")

	j := &Janitor{Store: e.store, StagingTTL: time.Hour, Pending: StreamPending(e.stream, 100), Log: testr.New(t)}
	deleted, err := j.SweepStaging(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(deleted, []string{abandoned}) {
		t.Errorf("deleted %q, want only %q", deleted, abandoned)
	}
	for key, want := range map[string]bool{pendingOld: true, abandoned: false, young: true} {
		if got := e.store.exists(key); got != want {
			t.Errorf("%s exists = %v, want %v", key, got, want)
		}
	}
}

func TestSweepStagingSkipsWhenJobsCannotBeListed(t *testing.T) {
	e := newEnv(t)
	old := e.stage("old", 2*time.Hour)
	for _, id := range []string{"a", "b", "c"} {
		e.fetched(id)
	}
	// A limit below the stream's size makes the listing fail.
	j := &Janitor{Store: e.store, StagingTTL: time.Hour, Pending: StreamPending(e.stream, 2), Log: testr.New(t)}
	deleted, err := j.SweepStaging(context.Background())
	if err == nil || len(deleted) != 0 {
		t.Errorf("Sweep = %q, %v; want nothing deleted and an error", deleted, err)
	}
	if !e.store.exists(old) {
		t.Error("staged content deleted although the pending jobs were unknown")
	}
}

func TestStreamPendingSkipsAcknowledgedMessages(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, id := range []string{"pending-1", "done", "pending-2"} {
		e.fetched(id)
	}
	// A consumer takes every job and acknowledges "done": the work queue
	// keeps the pending ones, with a gap between them.
	cons, err := e.conn.EnsureConsumer(ctx, events.PackageStream,
		events.Consumer(events.PackageStream, events.PackagerConsumer, events.ConsumerOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(3, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for msg := range batch.Messages() {
		n++
		m, err := events.Decode(msg.Data())
		if err != nil {
			t.Fatal(err)
		}
		if events.JobOf(m.Data).ID == "done" {
			if err := msg.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n != 3 {
		t.Fatalf("fetched %d jobs, want 3", n)
	}

	wanted, err := StreamPending(e.stream, 100)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(wanted) != 2 || !wanted[storage.StagingKey("pending-1")] || !wanted[storage.StagingKey("pending-2")] {
		t.Errorf("wanted = %v, want the two pending jobs' staging", wanted)
	}
}

func TestStreamPendingNamesReusedArtifacts(t *testing.T) {
	e := newEnv(t)
	j := events.Job{ID: "reuse", Object: events.ObjectRef{Kind: "GitRepository", Namespace: "default", Name: "other"}}
	f := &events.Fetched{Job: j, Revision: "main@sha1:1", Staging: storage.StagingKey(j.ID), ArtifactName: "1.tar.gz",
		Reuse: &events.Reuse{Key: ".cache/k.tar.gz", Digest: "sha256:00", Size: 1}}
	if err := e.conn.NewPublisher("fetcher").Publish(context.Background(), events.PackageSubject(j.Object.Kind), events.TypeFetched, j, f); err != nil {
		t.Fatal(err)
	}
	wanted, err := StreamPending(e.stream, 100)(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(wanted) != 2 || !wanted[".cache/k.tar.gz"] || !wanted[storage.StagingKey(j.ID)] {
		t.Errorf("wanted = %v, want the reused artifact and the job's staging key", wanted)
	}
}

// TestSweepTemporary checks that the janitor removes the temporary file of
// a write abandoned longer than the staging TTL (a packager killed while
// storing an artifact) and leaves a fresh one and the artifacts.
func TestSweepTemporary(t *testing.T) {
	s := newTestStore(t)
	s.putAged("gitrepository/default/podinfo/1.tar.gz", "artifact", 3*time.Hour)
	abandoned := "gitrepository/default/podinfo/.2.tar.gz.tmp-0123456789abcdef"
	writing := "gitrepository/default/podinfo/.3.tar.gz.tmp-fedcba9876543210"
	for key, age := range map[string]time.Duration{abandoned: 2 * time.Hour, writing: time.Second} {
		p := filepath.Join(s.Path(), filepath.FromSlash(key))
		if err := os.WriteFile(p, []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
		mt := time.Now().Add(-age)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	j := &Janitor{Store: s, StagingTTL: time.Hour, Log: testr.New(t)}
	deleted, err := j.SweepTemporary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(deleted, []string{abandoned}) {
		t.Errorf("deleted %q, want only %q", deleted, abandoned)
	}
	for key, want := range map[string]bool{abandoned: false, writing: true, "gitrepository/default/podinfo/1.tar.gz": true} {
		if _, err := os.Stat(filepath.Join(s.Path(), filepath.FromSlash(key))); (err == nil) != want {
			t.Errorf("%s exists = %v, want %v", key, err == nil, want)
		}
	}
}
