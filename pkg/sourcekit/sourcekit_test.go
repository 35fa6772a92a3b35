package sourcekit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/sourcekit"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

const kind = "Widget"

// kit is a plug-in fetcher of Widgets run by sourcekit.Run against a real
// NATS server that admits each identity with its permissions, and
// directory storage.
type kit struct {
	ids   *natsserver.Identities
	url   string
	store *storage.Dir
	admin jetstream.JetStream
	// fetch is what the kind's Fetch does, per test step.
	fetch atomic.Pointer[sourcekit.FetchFunc]
	calls atomic.Int64
}

func startKit(t *testing.T) *kit {
	t.Helper()
	dir := t.TempDir()
	ids, err := natsserver.NewIdentities(dir, events.PluginIdentity(kind))
	if err != nil {
		t.Fatal(err)
	}
	ns, err := natsserver.Start(natsserver.Options{StoreDir: filepath.Join(dir, "nats"), Users: ids.Users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	store, err := storage.NewDir(filepath.Join(dir, "storage"))
	if err != nil {
		t.Fatal(err)
	}
	k := &kit{ids: ids, url: ns.ClientURL(), store: store}

	adminConn, err := bus.Connect(t.Context(), bus.Options{URL: k.url, NKeyFile: ids.SeedFiles[natsserver.Admin]}, natsserver.Admin, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(adminConn.Close)
	if err := adminConn.EnsureStreams(t.Context()); err != nil {
		t.Fatal(err)
	}
	k.admin = adminConn.JS
	// The built-in fetchers' consumer is there too: the work queue gives
	// each its own subjects.
	if _, err := adminConn.EnsureConsumer(t.Context(), events.FetchStream, events.Consumer(events.FetchStream, events.FetcherConsumer,
		events.ConsumerOptions{FilterSubjects: events.BuiltinFetchSubjects()})); err != nil {
		t.Fatal(err)
	}

	var fetch sourcekit.FetchFunc = func(ctx context.Context, req *sourcekit.Request) (*sourcekit.Result, error) {
		k.calls.Add(1)
		return (*k.fetch.Load())(ctx, req)
	}
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), testr.New(t)))
	done := make(chan error, 1)
	go func() {
		done <- sourcekit.Run(ctx, kind, fetch, sourcekit.Options{
			Bus:         bus.Options{URL: k.url, NKeyFile: ids.SeedFiles[events.PluginIdentity(kind)], StreamReplicas: 1},
			Storage:     storage.Options{Backend: "dir", Path: store.Path()},
			Concurrency: 1, MaxAttempts: 1, Timeout: 30 * time.Second, MaxFileSize: 1 << 20, WorkDir: dir,
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
	return k
}

// setFetch makes the kind's Fetch f.
func (k *kit) setFetch(f sourcekit.FetchFunc) { k.fetch.Store(&f) }

// job publishes a sealed-looking fetch job of a Widget.
func (k *kit) job(t *testing.T, id string, prev *meta.Artifact, plugin *events.PluginSpec) events.Job {
	t.Helper()
	job := events.Job{ID: id, RequestedAt: time.Now().UTC(), Seal: "seal-" + id,
		Object: events.ObjectRef{Kind: kind, Namespace: "ns", Name: "w", UID: "uid", Generation: 1}}
	req := &events.FetchRequested{Job: job, Previous: prev, Plugin: plugin}
	body, err := events.Encode("watcher", events.TypeFetchRequested, events.MessageID(job, events.TypeFetchRequested), "widget/ns/w", req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.admin.Publish(t.Context(), events.FetchSubject(kind), body); err != nil {
		t.Fatal(err)
	}
	return job
}

// next returns the next message on the subjects of stream the kit's
// fetcher publishes (its kind's package or publish subject).
func (k *kit) next(t *testing.T, stream, subject string) *events.Message {
	t.Helper()
	c, err := k.admin.CreateOrUpdateConsumer(t.Context(), stream, jetstream.ConsumerConfig{
		Durable: "test", FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Fetch(1, jetstream.FetchMaxWait(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range msgs.Messages() {
		_ = m.Ack()
		decoded, err := events.Decode(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		return decoded
	}
	t.Fatalf("nothing on %s", subject)
	return nil
}

var spec = &events.PluginSpec{APIVersion: "example.com/v1", Kind: kind, Spec: json.RawMessage(`{"size":3}`)}

// TestRun drives a plug-in fetcher through its kind's jobs: new content is
// staged and sent to the packager, the sealed job unchanged; an unchanged
// revision is answered FetchUnchanged; a failure FetchFailed with the
// kind's reason; a job without a plug-in spec is refused with
// UnsupportedKind. The fetcher's identity may not answer for another kind.
func TestRun(t *testing.T) {
	k := startKit(t)

	k.setFetch(func(_ context.Context, req *sourcekit.Request) (*sourcekit.Result, error) {
		if string(req.Spec) != `{"size":3}` || req.Namespace != "ns" || req.Name != "w" {
			t.Errorf("request %+v", req)
		}
		if err := os.WriteFile(filepath.Join(req.Dir, "widget.yaml"), []byte("abc"), 0o644); err != nil {
			return nil, err
		}
		return &sourcekit.Result{Revision: "v1", Dir: req.Dir, Metadata: map[string]string{"etag": `"1"`, "empty": ""}}, nil
	})
	job := k.job(t, "j1", nil, spec)
	m := k.next(t, events.PackageStream, events.PackageSubject(kind))
	fetched, ok := m.Data.(*events.Fetched)
	if !ok || m.Event.Type() != events.TypeFetched {
		t.Fatalf("got %s %T", m.Event.Type(), m.Data)
	}
	if !reflect.DeepEqual(fetched.Job, job) || fetched.Revision != "v1" || fetched.Format != events.FormatTree ||
		!strings.HasSuffix(fetched.ArtifactName, ".tar.gz") || fetched.Metadata["etag"] != `"1"` || len(fetched.Metadata) != 1 ||
		fetched.EventMessage != "stored artifact for revision 'v1'" {
		t.Errorf("fetched %+v", fetched)
	}
	if _, err := k.store.Stat(t.Context(), fetched.Staging); err != nil {
		t.Errorf("staged content: %v", err)
	}

	// The stored artifact is intact and the revision the same: unchanged.
	if _, err := k.store.Put(t.Context(), "widget/ns/w/a.tar.gz", strings.NewReader("artifact")); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("artifact"))
	prev := &meta.Artifact{Path: "widget/ns/w/a.tar.gz", Revision: "v1", Digest: "sha256:" + hex.EncodeToString(sum[:]),
		Metadata: map[string]string{"etag": `"1"`}}
	k.setFetch(func(_ context.Context, req *sourcekit.Request) (*sourcekit.Result, error) {
		if req.Previous == nil || req.Previous.Metadata["etag"] != `"1"` {
			t.Errorf("previous %+v", req.Previous)
		}
		return &sourcekit.Result{Unchanged: true}, nil
	})
	k.job(t, "j2", prev, spec)
	m = k.next(t, events.PublishStream, events.PublishSubject(kind))
	if out, ok := m.Data.(*events.Outcome); m.Event.Type() != events.TypeFetchUnchanged || !ok || out.Artifact.Digest != prev.Digest {
		t.Errorf("unchanged: %s %+v", m.Event.Type(), m.Data)
	}

	// A stored artifact that is not intact is not offered as Previous.
	bad := *prev
	bad.Digest = "sha256:" + strings.Repeat("0", 64)
	k.setFetch(func(_ context.Context, req *sourcekit.Request) (*sourcekit.Result, error) {
		if req.Previous != nil {
			t.Errorf("a corrupt artifact offered as previous")
		}
		return nil, sourcekit.Final("Broken", "upstream says %s", "no")
	})
	k.job(t, "j3", &bad, spec)
	m = k.next(t, events.PublishStream, events.PublishSubject(kind))
	out, _ := m.Data.(*events.Outcome)
	if m.Event.Type() != events.TypeFetchFailed || out == nil || out.Failure == nil || out.Failure.Reason != "Broken" ||
		out.Failure.Condition != "FetchFailed" || out.Failure.Message != "upstream says no" {
		t.Errorf("failed: %s %+v", m.Event.Type(), m.Data)
	}

	// A job without the plug-in's spec is not fetched.
	before := k.calls.Load()
	k.job(t, "j4", nil, nil)
	m = k.next(t, events.PublishStream, events.PublishSubject(kind))
	out, _ = m.Data.(*events.Outcome)
	if out == nil || out.Failure == nil || out.Failure.Reason != sourcekit.UnsupportedKindReason || !out.Failure.Stalled {
		t.Errorf("no spec: %s %+v", m.Event.Type(), m.Data)
	}
	if k.calls.Load() != before {
		t.Errorf("Fetch called for a job without a spec")
	}

	// The plug-in's identity may not publish for another kind.
	nc, err := nats.Connect(k.url, mustOption(t, k.ids.SeedFiles[events.PluginIdentity(kind)]))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, events.PackageSubject("GitRepository"), []byte("{}")); err == nil {
		t.Errorf("the plug-in's identity published a GitRepository's package job")
	}
}

func mustOption(t *testing.T, seedFile string) nats.Option {
	t.Helper()
	o, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	return o
}
