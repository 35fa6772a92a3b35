package announce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"

	"github.com/headwater-gitops/headwater/services/artifact-server/internal/sink"
)

const (
	service    = "artifact-server"
	advertised = "artifacts.test:9090"
	waitFor    = 20 * time.Second
)

// env is a real NATS server with Headwater's streams and an announcer
// worker on the publish stream.
type env struct {
	conn *bus.Conn
	reg  *prometheus.Registry
	// upstream publishes results as the fetcher and packager do.
	upstream *bus.Publisher
}

func newEnv(t *testing.T, configure func(*Announcer)) *env {
	t.Helper()
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	ctx := context.Background()
	conn, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "test", logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if err := conn.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := conn.EnsureConsumer(ctx, events.PublishStream,
		events.Consumer(events.PublishStream, events.ArtifactServerConsumer, events.ConsumerOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ann := &Announcer{Publisher: conn.NewPublisher(service), Service: service, Advertised: advertised}
	if configure != nil {
		configure(ann)
	}
	w := &bus.Worker{
		Service: service, Consumer: cons, Concurrency: 4, Handler: ann.Handle,
		Metrics: telemetry.NewJobMetrics(reg, service), Log: logr.Discard(),
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	return &env{conn: conn, reg: reg, upstream: conn.NewPublisher("packager")}
}

// subscribe returns a core NATS subscription to every public event.
func (e *env) subscribe(t *testing.T) *nats.Subscription {
	t.Helper()
	sub, err := e.conn.NC.SubscribeSync(events.EventSubjectPrefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.conn.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return sub
}

// jobs sums headwater_jobs_total for an event type and result.
func (e *env) jobs(t *testing.T, eventType, result string) float64 {
	t.Helper()
	families, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != "headwater_jobs_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if label(m, "type") == eventType && label(m, "result") == result {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) streamMsgs(t *testing.T, stream string) uint64 {
	t.Helper()
	s, err := e.conn.JS.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func job(id, name string) events.Job {
	return events.Job{
		ID:          id,
		Object:      events.ObjectRef{Kind: "GitRepository", Namespace: "flux-system", Name: name, UID: "uid-" + name, Generation: 3},
		RequestedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

func artifact(name string) *meta.Artifact {
	size := int64(1234)
	return &meta.Artifact{
		Path:           "gitrepository/flux-system/" + name + "/0123abcd.tar.gz",
		Revision:       "main@sha1:0123abcd",
		Digest:         "sha256:" + fmt.Sprintf("%064x", 42),
		LastUpdateTime: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)),
		Size:           &size,
	}
}

func decodeOutcome(t *testing.T, data []byte) (event.Event, *events.Outcome) {
	t.Helper()
	m, err := events.Decode(data)
	if err != nil {
		t.Fatalf("public event does not decode: %v", err)
	}
	out, ok := m.Data.(*events.Outcome)
	if !ok {
		t.Fatalf("public event data is %T", m.Data)
	}
	return m.Event, out
}

func TestAnnounceEveryResultType(t *testing.T) {
	e := newEnv(t, nil)
	sub := e.subscribe(t)
	failure := &events.Failure{Condition: "FetchFailed", Reason: "GitOperationFailed", Message: "failed to checkout", Stalled: false}
	tests := []struct {
		internal, public string
		name             string
		outcome          events.Outcome
	}{
		{events.TypePackaged, events.TypeArtifactStored, "stored",
			events.Outcome{Revision: "main@sha1:0123abcd", Artifact: artifact("stored"), EventMessage: "stored artifact for commit 'Add README'"}},
		{events.TypeFetchUnchanged, events.TypeArtifactUnchanged, "unchanged",
			events.Outcome{Revision: "main@sha1:0123abcd", Artifact: artifact("unchanged")}},
		{events.TypeFetchFailed, events.TypeArtifactFailed, "fetch.failed", // a dot in the name
			events.Outcome{Failure: failure, Notices: []events.Notice{{Warning: true, Reason: "ArtifactVerificationFailed", Message: "m"}}}},
		{events.TypePackageFailed, events.TypeArtifactFailed, "package-failed",
			events.Outcome{Artifact: artifact("package-failed"), Failure: &events.Failure{Condition: "StorageOperationFailed", Reason: "ArchiveOperationFailed", Message: "disk full"}}},
		{events.TypeDeleted, events.TypeArtifactDeleted, "deleted", events.Outcome{}},
	}
	want := map[string]int{}
	for i, tt := range tests {
		tt.outcome.Job = job(fmt.Sprintf("job-%d", i), tt.name)
		tests[i] = tt
		if err := e.upstream.Publish(context.Background(), events.PublishSubject("GitRepository"), tt.internal, tt.outcome.Job, &tt.outcome); err != nil {
			t.Fatal(err)
		}
		want[events.EventSubject("GitRepository", "flux-system", tt.name)] = i
	}
	got := map[string]*nats.Msg{}
	for len(got) < len(tests) {
		msg, err := sub.NextMsg(waitFor)
		if err != nil {
			t.Fatalf("waiting for public events (got %d of %d): %v", len(got), len(tests), err)
		}
		got[msg.Subject] = msg
	}
	for subject, i := range want {
		tt := tests[i]
		t.Run(tt.internal, func(t *testing.T) {
			msg, ok := got[subject]
			if !ok {
				t.Fatalf("no event on %s; got subjects %v", subject, keys(got))
			}
			if ct := msg.Header.Get("Content-Type"); ct != events.ContentType {
				t.Errorf("Content-Type = %q", ct)
			}
			ev, out := decodeOutcome(t, msg.Data)
			if ev.Type() != tt.public {
				t.Errorf("type = %q, want %q", ev.Type(), tt.public)
			}
			if ev.ID() != events.MessageID(tt.outcome.Job, tt.public) {
				t.Errorf("id = %q", ev.ID())
			}
			if ev.Source() != events.Source+"/"+service {
				t.Errorf("source = %q", ev.Source())
			}
			if ev.Subject() != "gitrepository/flux-system/"+tt.name {
				t.Errorf("subject = %q", ev.Subject())
			}
			if out.Job.ID != tt.outcome.Job.ID || !reflect.DeepEqual(out.Job.Object, tt.outcome.Job.Object) || !out.Job.RequestedAt.Equal(tt.outcome.Job.RequestedAt) {
				t.Errorf("job = %+v, want %+v", out.Job, tt.outcome.Job)
			}
			if out.Revision != tt.outcome.Revision || out.EventMessage != tt.outcome.EventMessage || len(out.Notices) != len(tt.outcome.Notices) {
				t.Errorf("outcome fields changed: %+v", out)
			}
			if (out.Failure == nil) != (tt.outcome.Failure == nil) || (out.Failure != nil && *out.Failure != *tt.outcome.Failure) {
				t.Errorf("failure = %+v, want %+v", out.Failure, tt.outcome.Failure)
			}
			if tt.outcome.Artifact == nil {
				if out.Artifact != nil {
					t.Errorf("artifact = %+v, want none", out.Artifact)
				}
				return
			}
			wantURL := "http://" + advertised + "/" + tt.outcome.Artifact.Path
			if out.Artifact == nil || out.Artifact.URL != wantURL {
				t.Fatalf("artifact = %+v, want URL %q", out.Artifact, wantURL)
			}
			if out.Artifact.Digest != tt.outcome.Artifact.Digest || out.Artifact.Revision != tt.outcome.Artifact.Revision ||
				*out.Artifact.Size != *tt.outcome.Artifact.Size || out.Artifact.Path != tt.outcome.Artifact.Path {
				t.Errorf("artifact = %+v, want %+v", out.Artifact, tt.outcome.Artifact)
			}
		})
	}
	// Every announced result has left the work queue.
	eventually(t, "publish stream to drain", func() bool { return e.streamMsgs(t, events.PublishStream) == 0 })
}

func keys(m map[string]*nats.Msg) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestAnnounceOnce handles the same result twice, as after a redelivery,
// and finds one public event in the event stream.
func TestAnnounceOnce(t *testing.T) {
	e := newEnv(t, nil)
	j := job("job-once", "podinfo")
	out := events.Outcome{Job: j, Revision: "main@sha1:0123abcd", Artifact: artifact("podinfo")}
	// Published without a message ID, so the publish stream keeps both
	// copies and the announcer handles both.
	body, err := events.Encode("packager", events.TypePackaged, "copy", events.ObjectSubject(j.Object), &out)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := e.conn.JS.Publish(context.Background(), events.PublishSubject(j.Object.Kind), body); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "both copies handled", func() bool { return e.jobs(t, events.TypePackaged, "success") == 2 })
	if n := e.streamMsgs(t, events.EventStream); n != 1 {
		t.Fatalf("event stream holds %d events, want 1", n)
	}
	s, err := e.conn.JS.Stream(context.Background(), events.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetLastMsgForSubject(context.Background(), events.EventSubject("GitRepository", "flux-system", "podinfo"))
	if err != nil {
		t.Fatal(err)
	}
	ev, got := decodeOutcome(t, raw.Data)
	if ev.Type() != events.TypeArtifactStored || got.Artifact.URL != "http://"+advertised+"/"+out.Artifact.Path {
		t.Errorf("event %s with artifact %+v", ev.Type(), got.Artifact)
	}
}

// TestRejectsAndContinues terminates messages that are not announceable
// results and keeps announcing.
func TestRejectsAndContinues(t *testing.T) {
	e := newEnv(t, nil)
	sub := e.subscribe(t)
	ctx := context.Background()
	subject := events.PublishSubject("GitRepository")
	noJobID, err := events.Encode("packager", events.TypePackaged, "x", "gitrepository/a/b", &events.Outcome{Job: events.Job{Object: job("", "b").Object}})
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range [][]byte{[]byte("not a cloudevent"), []byte(`{"specversion":"1.0"}`), noJobID} {
		if _, err := e.conn.JS.Publish(ctx, subject, body); err != nil {
			t.Fatal(err)
		}
	}
	// A valid CloudEvent that is not a result.
	fr := &events.FetchRequested{Job: job("job-request", "request")}
	if err := e.upstream.Publish(ctx, subject, events.TypeFetchRequested, fr.Job, fr); err != nil {
		t.Fatal(err)
	}
	good := events.Outcome{Job: job("job-good", "good"), Artifact: artifact("good")}
	if err := e.upstream.Publish(ctx, subject, events.TypePackaged, good.Job, &good); err != nil {
		t.Fatal(err)
	}

	msg, err := sub.NextMsg(waitFor)
	if err != nil {
		t.Fatalf("waiting for the good result's event: %v", err)
	}
	if msg.Subject != events.EventSubject("GitRepository", "flux-system", "good") {
		t.Fatalf("first public event on %s", msg.Subject)
	}
	eventually(t, "rejections", func() bool {
		return e.jobs(t, "malformed", "rejected") == 3 && e.jobs(t, events.TypeFetchRequested, "rejected") == 1
	})
	eventually(t, "publish stream to drain", func() bool { return e.streamMsgs(t, events.PublishStream) == 0 })
	for _, result := range []string{"retry", "error"} {
		for _, typ := range []string{"malformed", events.TypeFetchRequested, events.TypePackaged} {
			if n := e.jobs(t, typ, result); n != 0 {
				t.Errorf("jobs{%s,%s} = %v, want 0", typ, result, n)
			}
		}
	}
	if msg, err := sub.NextMsg(100 * time.Millisecond); err == nil {
		t.Errorf("unexpected public event on %s", msg.Subject)
	} else if !errors.Is(err, nats.ErrTimeout) {
		t.Fatal(err)
	}
}

// failingPublisher fails every publish, like a NATS outage, and counts
// its calls.
type failingPublisher struct{ calls atomic.Int64 }

func (p *failingPublisher) Publish(context.Context, string, string, events.Job, any) error {
	p.calls.Add(1)
	return errors.New("nats: timeout")
}

// TestTransientAndTerminal runs the announcer under the real worker with a
// publisher that always fails: a result is retried, a public type fed back
// into the publish stream is terminated without a publish.
func TestTransientAndTerminal(t *testing.T) {
	pub := &failingPublisher{}
	e := newEnv(t, func(a *Announcer) { a.Publisher = pub })
	ctx := context.Background()
	subject := events.PublishSubject("GitRepository")
	public := events.Outcome{Job: job("job-public", "public"), Artifact: artifact("public")}
	if err := e.upstream.Publish(ctx, subject, events.TypeArtifactStored, public.Job, &public); err != nil {
		t.Fatal(err)
	}
	eventually(t, "public type rejected", func() bool { return e.jobs(t, events.TypeArtifactStored, "rejected") == 1 })
	if n := pub.calls.Load(); n != 0 {
		t.Fatalf("rejected message was published %d times", n)
	}
	result := events.Outcome{Job: job("job-result", "result"), Artifact: artifact("result")}
	if err := e.upstream.Publish(ctx, subject, events.TypePackaged, result.Job, &result); err != nil {
		t.Fatal(err)
	}
	eventually(t, "failed publish retried later", func() bool { return e.jobs(t, events.TypePackaged, "error") >= 1 })
	if n := e.jobs(t, events.TypePackaged, "rejected"); n != 0 {
		t.Errorf("a transient failure was rejected %v times", n)
	}
	// The result waits in the work queue for its retry.
	if n := e.streamMsgs(t, events.PublishStream); n != 1 {
		t.Errorf("publish stream holds %d messages, want the result awaiting retry", n)
	}
}

func TestHandleRefusesNonOutcomeData(t *testing.T) {
	pub := &failingPublisher{}
	a := &Announcer{Publisher: pub, Service: service, Advertised: advertised}
	ev := event.New()
	ev.SetType(events.TypePackaged)
	err := a.Handle(context.Background(), &events.Message{Event: ev, Data: &events.Fetched{Job: job("j", "x")}}, bus.Delivery{Attempt: 1})
	if err == nil || pub.calls.Load() != 0 {
		t.Fatalf("err = %v, publishes = %d; want an error and no publish", err, pub.calls.Load())
	}
}

func TestPublicDoesNotMutate(t *testing.T) {
	a := &Announcer{Advertised: advertised}
	in := &events.Outcome{Job: job("j", "podinfo"), Artifact: artifact("podinfo")}
	out := a.Public(in)
	if in.Artifact.URL != "" {
		t.Errorf("input artifact URL set to %q", in.Artifact.URL)
	}
	if out.Artifact == in.Artifact {
		t.Error("output shares the input's artifact")
	}
	if want := "http://" + advertised + "/gitrepository/flux-system/podinfo/0123abcd.tar.gz"; out.Artifact.URL != want {
		t.Errorf("URL = %q, want %q", out.Artifact.URL, want)
	}
	if a.Public(&events.Outcome{Job: in.Job}).Artifact != nil {
		t.Error("an outcome without artifact got one")
	}
}

// TestSinks announces on NATS and also delivers to HTTP sinks; a failing
// and a hanging sink are counted and hold nothing up.
func TestSinks(t *testing.T) {
	var mu sync.Mutex
	var received []event.Event
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, err := cehttp.NewEventFromHTTPRequest(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		received = append(received, *ev)
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(good.Close)
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	t.Cleanup(failing.Close)
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(hanging.Close)
	t.Cleanup(func() { close(release) })

	reg := prometheus.NewRegistry()
	sinks, err := sink.New([]string{good.URL + "/events?token=secret", failing.URL, hanging.URL},
		sink.Options{Timeout: 200 * time.Millisecond}, reg, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sinksDone := make(chan struct{})
	go func() { defer close(sinksDone); sinks.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-sinksDone })

	e := newEnv(t, func(a *Announcer) { a.Sink = sinks })
	sub := e.subscribe(t)
	const n = 3
	for i := range n {
		out := events.Outcome{Job: job(fmt.Sprintf("job-%d", i), fmt.Sprintf("src-%d", i)), Artifact: artifact(fmt.Sprintf("src-%d", i))}
		if err := e.upstream.Publish(context.Background(), events.PublishSubject("GitRepository"), events.TypePackaged, out.Job, &out); err != nil {
			t.Fatal(err)
		}
	}
	onNATS := map[string]*events.Outcome{}
	for range n {
		msg, err := sub.NextMsg(waitFor)
		if err != nil {
			t.Fatalf("NATS announcement held up: %v", err)
		}
		ev, out := decodeOutcome(t, msg.Data)
		onNATS[ev.ID()] = out
	}
	eventually(t, "sink deliveries", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(received) == n
	})
	mu.Lock()
	for _, ev := range received {
		natsOut, ok := onNATS[ev.ID()]
		if !ok {
			t.Errorf("sink got event %s that NATS did not", ev.ID())
			continue
		}
		if ev.Type() != events.TypeArtifactStored || ev.Source() != events.Source+"/"+service || ev.Subject() != events.ObjectSubject(natsOut.Job.Object) {
			t.Errorf("sink event attributes: %s %s %s", ev.Type(), ev.Source(), ev.Subject())
		}
		var out events.Outcome
		if err := json.Unmarshal(ev.Data(), &out); err != nil {
			t.Fatal(err)
		}
		if out.Artifact == nil || out.Artifact.URL != natsOut.Artifact.URL || out.Artifact.URL == "" {
			t.Errorf("sink artifact %+v, NATS URL %q", out.Artifact, natsOut.Artifact.URL)
		}
	}
	mu.Unlock()
	eventually(t, "failures counted", func() bool {
		return sinkCount(t, reg, failing.URL, "failed") == n && sinkCount(t, reg, hanging.URL, "failed") == n
	})
	if got := sinkCount(t, reg, good.URL+"/events", "success"); got != n {
		t.Errorf("good sink successes = %v, want %d (labelled without its query)", got, n)
	}
}

func sinkCount(t *testing.T, reg *prometheus.Registry, sinkName, result string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "headwater_event_sink_deliveries_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if label(m, "sink") == sinkName && label(m, "result") == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestPublicFillsOutputURLs: an ArtifactGenerator's outcome has one
// artifact per output, each given its URL.
func TestPublicFillsOutputURLs(t *testing.T) {
	a := &Announcer{Advertised: advertised}
	in := &events.Outcome{Job: job("j", "gen"), Outputs: []events.GeneratedOutput{
		{Name: "a", Artifact: meta.Artifact{Path: "externalartifact/apps/a/1.tar.gz"}, Changed: true},
		{Name: "b", Artifact: meta.Artifact{Path: "externalartifact/apps/b/2.tar.gz"}},
	}}
	out := a.Public(in)
	for i, o := range out.Outputs {
		if want := "http://" + advertised + "/" + in.Outputs[i].Artifact.Path; o.Artifact.URL != want || o.Changed != in.Outputs[i].Changed {
			t.Errorf("output %s: URL %q changed %v, want %q", o.Name, o.Artifact.URL, o.Changed, want)
		}
		if in.Outputs[i].Artifact.URL != "" {
			t.Errorf("input output %s URL set", o.Name)
		}
	}
}
