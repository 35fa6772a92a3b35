package packager

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// wait bounds every wait for a result.
const wait = 15 * time.Second

// harness is a packager worker on an embedded NATS server over a directory
// storage, with a consumer of the publish stream to read its results.
type harness struct {
	t       *testing.T
	conn    *bus.Conn
	store   *storage.Dir
	reg     *prometheus.Registry
	results jetstream.Consumer
	// pub publishes jobs, as the fetcher and the watcher do.
	pub *bus.Publisher
}

type harnessOptions struct {
	opts Options
	// wrap, when set, wraps the storage the worker sees.
	wrap func(storage.Storage) storage.Storage
	// maxAttempts is the consumer's MaxDeliver, as the -max-attempts
	// flag sets it; events.DefaultMaxDeliver when 0.
	maxAttempts int
}

func defaultOptions() Options {
	return Options{DigestAlgo: "sha256", RetentionRecords: 2, RetentionTTL: time.Minute}
}

func newHarness(t *testing.T, ho harnessOptions) *harness {
	t.Helper()
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })

	ctx, cancel := context.WithCancel(context.Background())
	log := testr.New(t)
	conn, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "packager-test", log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if err := conn.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := conn.EnsureConsumer(ctx, events.PackageStream,
		events.Consumer(events.PackageStream, events.PackagerConsumer, events.ConsumerOptions{MaxDeliver: ho.maxAttempts}))
	if err != nil {
		t.Fatal(err)
	}
	results, err := conn.EnsureConsumer(ctx, events.PublishStream, jetstream.ConsumerConfig{
		Durable: "test-results", AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	store, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })

	var workerStore storage.Storage = store
	if ho.wrap != nil {
		workerStore = ho.wrap(store)
	}
	reg := prometheus.NewRegistry()
	p := New(workerStore, conn.NewPublisher("packager"), ho.opts, NewMetrics(reg))
	w := &bus.Worker{
		Service:     "packager",
		Consumer:    cons,
		Concurrency: 2,
		Handler:     p.Handle,
		Report:      p.Report,
		Metrics:     telemetry.NewJobMetrics(reg, "packager"),
		Log:         log,
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := w.Run(ctx); err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })

	return &harness{t: t, conn: conn, store: store, reg: reg, results: results, pub: conn.NewPublisher("test")}
}

// job returns a job for the GitRepository default/<name>.
func job(id, name string) events.Job {
	return events.Job{
		ID: id,
		Object: events.ObjectRef{
			Kind: "GitRepository", Namespace: "default", Name: name, UID: "uid-" + name, Generation: 1,
		},
		RequestedAt: time.Now().UTC(),
	}
}

// fetched returns a Fetched job of source name whose staged content is at
// the job's staging key.
func fetched(id, name, artifactName string) *events.Fetched {
	return &events.Fetched{
		Job:          job(id, name),
		Revision:     "main@sha1:" + artifactName,
		Staging:      storage.StagingKey(id),
		ArtifactName: artifactName,
		EventMessage: "stored artifact for commit 'Add README'",
		Notices:      []events.Notice{{Reason: "Note", Message: "carried over"}},
	}
}

// stage stores content as f's staged content.
func (h *harness) stage(f *events.Fetched, content []byte) {
	h.t.Helper()
	if _, err := h.store.Put(context.Background(), f.Staging, bytes.NewReader(content)); err != nil {
		h.t.Fatal(err)
	}
}

// send publishes a job on the package stream.
func (h *harness) send(eventType string, j events.Job, data any) {
	h.t.Helper()
	if err := h.pub.Publish(context.Background(), events.PackageSubject(j.Object.Kind), eventType, j, data); err != nil {
		h.t.Fatal(err)
	}
}

// next returns the next result on the publish stream.
func (h *harness) next() *events.Message {
	h.t.Helper()
	msg, err := h.results.Next(jetstream.FetchMaxWait(wait))
	if err != nil {
		h.t.Fatalf("no result within %s: %v", wait, err)
	}
	if err := msg.Ack(); err != nil {
		h.t.Fatal(err)
	}
	m, err := events.Decode(msg.Data())
	if err != nil {
		h.t.Fatal(err)
	}
	return m
}

// nextOutcome returns the next result, checking its type and job.
func (h *harness) nextOutcome(eventType, jobID string) *events.Outcome {
	h.t.Helper()
	m := h.next()
	out, ok := m.Data.(*events.Outcome)
	if !ok || m.Event.Type() != eventType || out.Job.ID != jobID {
		h.t.Fatalf("got %s for job %q (%+v), want %s for job %q", m.Event.Type(), events.JobOf(m.Data).ID, m.Data, eventType, jobID)
	}
	return out
}

// stagingGone waits until f's staged content is deleted, which the packager
// does after publishing the outcome.
func (h *harness) stagingGone(f *events.Fetched) {
	h.t.Helper()
	eventually(h.t, "staged content deleted", func() bool {
		_, err := h.store.Stat(context.Background(), f.Staging)
		return errors.Is(err, storage.ErrNotFound)
	})
}

// packaged stages content for f, sends it and returns its Packaged outcome
// once the job is finished (its staged content deleted, its garbage
// collected), so that nothing of it runs on beside what the test does next.
func (h *harness) packaged(f *events.Fetched, content []byte) *events.Outcome {
	h.t.Helper()
	done := map[string]string{"type": events.TypeFetched, "result": "success"}
	before := h.metric("headwater_jobs_total", done)
	h.stage(f, content)
	h.send(events.TypeFetched, f.Job, f)
	out := h.nextOutcome(events.TypePackaged, f.Job.ID)
	eventually(h.t, "job finished", func() bool { return h.metric("headwater_jobs_total", done) > before })
	h.stagingGone(f)
	return out
}

// file is the path of key in the storage directory.
func (h *harness) file(key string) string {
	return filepath.Join(h.store.Path(), filepath.FromSlash(key))
}

// sha256File returns the sha256 digest of key's stored bytes.
func (h *harness) sha256File(key string) string {
	h.t.Helper()
	b, err := os.ReadFile(h.file(key))
	if err != nil {
		h.t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// metric returns the value of a counter or gauge, or the sample count of a
// histogram, whose labels include the given ones; 0 when absent.
func (h *harness) metric(name string, labels map[string]string) float64 {
	h.t.Helper()
	families, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	var total float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				total += m.Counter.GetValue()
			case m.Gauge != nil:
				total += m.Gauge.GetValue()
			case m.Histogram != nil:
				total += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return total
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	found := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
			found++
		}
	}
	return found == len(want)
}

// eventually polls cond until it holds or the wait ends.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true within %s", what, wait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testFile is a file of the test tree.
type testFile struct {
	content string
	mode    os.FileMode
}

// testTree is the content of the source tree tests package.
var testTree = map[string]testFile{
	"README.md":                  {"# podinfo\n", 0o600},
	"deploy/app.yaml":            {"kind: Deployment\n", 0o644},
	"deploy/nested/config.json":  {`{"replicas": 2}`, 0o664},
	"scripts/run.sh":             {"#!/bin/sh\necho hi\n", 0o700},
	"scripts/zz-last-in-order.t": {"z", 0o644},
}

// writeTree writes testTree under a new directory with the given file
// modification time, and returns the directory.
func writeTree(t *testing.T, mtime time.Time) string {
	t.Helper()
	root := t.TempDir()
	for rel, f := range testTree {
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.content), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(root, "empty"), 0o700); err != nil {
		t.Fatal(err)
	}
	return root
}

// stagingTar returns the staging tar of a test tree, as the fetcher makes it.
func stagingTar(t *testing.T, root string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := archive.WriteTar(context.Background(), &buf, root, archive.TarOptions{}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// rawTar builds a tar of the given headers, each file with body content.
func rawTar(t *testing.T, entries ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		body := bytes.Repeat([]byte("x"), int(h.Size))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// entry is one entry of an unpacked artifact.
type entry struct {
	hdr     *tar.Header
	content string
}

// untar reads a stored tar.gz artifact in order.
func (h *harness) untar(key string) []entry {
	h.t.Helper()
	f, err := os.Open(h.file(key))
	if err != nil {
		h.t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		h.t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var out []entry
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			h.t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			h.t.Fatal(err)
		}
		out = append(out, entry{hdr: hdr, content: string(b)})
	}
}
