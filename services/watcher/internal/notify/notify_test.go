package notify

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	eventv1 "github.com/fluxcd/pkg/apis/event/v1beta1"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

// receiver is a notification-controller stand-in: an HTTP server that
// decodes every request into Flux's own event type and answers with the
// status its answer function gives (200 when nil).
type receiver struct {
	*httptest.Server
	mu       sync.Mutex
	received []eventv1.Event
	answer   func(ev eventv1.Event, attempt int) int
}

func newReceiver(t *testing.T, answer func(ev eventv1.Event, attempt int) int) *receiver {
	t.Helper()
	r := &receiver{answer: answer}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json" {
			t.Errorf("request %s with content type %q, want a POST of application/json", req.Method, req.Header.Get("Content-Type"))
		}
		var ev eventv1.Event
		dec := json.NewDecoder(req.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ev); err != nil {
			t.Errorf("decode event: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.received = append(r.received, ev)
		attempt := 0
		for _, e := range r.received {
			if e.Reason == ev.Reason {
				attempt++
			}
		}
		r.mu.Unlock()
		status := http.StatusAccepted
		if r.answer != nil {
			status = r.answer(ev, attempt)
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(r.Close)
	return r
}

// events returns the Events received so far.
func (r *receiver) events() []eventv1.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]eventv1.Event(nil), r.received...)
}

// waitFor polls until an Event with reason arrived and returns every Event
// received with that reason.
func (r *receiver) waitFor(t *testing.T, reason string) []eventv1.Event {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got []eventv1.Event
		for _, ev := range r.events() {
			if ev.Reason == reason {
				got = append(got, ev)
			}
		}
		if len(got) > 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event received; received: %+v", reason, r.events())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := sourcev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// start makes a Forwarder posting to addr with millisecond backoff and runs
// it until the test ends.
func start(t *testing.T, addr string, reg prometheus.Registerer) *Forwarder {
	t.Helper()
	f, err := New(Options{Addr: addr, Scheme: scheme(t), Registerer: reg, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	f.client.RetryWaitMin, f.client.RetryWaitMax = time.Millisecond, 5*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := f.Start(ctx); err != nil {
			t.Errorf("start: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

func gitRepository() *sourcev1.GitRepository {
	return &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{
		Namespace: "apps", Name: "podinfo", UID: "u-1", ResourceVersion: "7",
		Annotations: map[string]string{
			eventv1.Group + "/commit": "a1b2c3", // posted: Flux's event annotations
			"example.com/owner":       "team",   // not posted
		},
	}}
}

func TestForwardFluxFormat(t *testing.T) {
	r := newReceiver(t, nil)
	f := start(t, r.URL, nil)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	rev, digest := "main@sha1:0123456789abcdef0123456789abcdef01234567", "sha256:f00d"

	f.Forward(gitRepository(), ArtifactMetadata(rev, digest), corev1.EventTypeNormal, "NewArtifact", "stored artifact for commit 'first'")
	ev := r.waitFor(t, "NewArtifact")[0]

	want := corev1.ObjectReference{Kind: sourcev1.GitRepositoryKind, APIVersion: sourcev1.GroupVersion.String(),
		Namespace: "apps", Name: "podinfo", UID: "u-1", ResourceVersion: "7"}
	if ev.InvolvedObject != want {
		t.Errorf("involvedObject = %+v, want %+v", ev.InvolvedObject, want)
	}
	if ev.Severity != eventv1.EventSeverityInfo || ev.Message != "stored artifact for commit 'first'" {
		t.Errorf("severity %q message %q", ev.Severity, ev.Message)
	}
	if ev.ReportingController != "source-controller" || ev.ReportingInstance != host {
		t.Errorf("reporting %q/%q, want source-controller/%s", ev.ReportingController, ev.ReportingInstance, host)
	}
	if ev.Timestamp.IsZero() {
		t.Error("no timestamp")
	}
	wantMeta := map[string]string{
		"source.toolkit.fluxcd.io/revision": rev,
		"source.toolkit.fluxcd.io/digest":   digest,
		"event.toolkit.fluxcd.io/commit":    "a1b2c3",
	}
	if len(ev.Metadata) != len(wantMeta) {
		t.Errorf("metadata = %v, want %v", ev.Metadata, wantMeta)
	}
	for k, v := range wantMeta {
		if !ev.HasMetadata(k, v) {
			t.Errorf("metadata = %v, want %s=%s", ev.Metadata, k, v)
		}
	}
}

func TestForwardSeverity(t *testing.T) {
	r := newReceiver(t, nil)
	f := start(t, r.URL, nil)
	obj := gitRepository()
	obj.Annotations = nil

	// Posted in order by one loop: when the last Event arrives, every
	// earlier one that was to be posted has been.
	f.Forward(obj, nil, eventv1.EventTypeTrace, "GitOperationSucceeded", "no changes since last reconciliation: observed revision 'x'")
	f.Forward(obj, nil, corev1.EventTypeWarning, "GitOperationFailed", "failed to checkout")
	f.Forward(obj, nil, corev1.EventTypeNormal, "Succeeded", "stored artifact for commit 'x'")
	r.waitFor(t, "Succeeded")

	got := map[string]string{}
	for _, ev := range r.events() {
		got[ev.Reason] = ev.Severity
		if ev.Metadata != nil {
			t.Errorf("%s: metadata %v, want none", ev.Reason, ev.Metadata)
		}
	}
	want := map[string]string{"GitOperationFailed": eventv1.EventSeverityError, "Succeeded": eventv1.EventSeverityInfo}
	if len(got) != len(want) || got["GitOperationFailed"] != want["GitOperationFailed"] || got["Succeeded"] != want["Succeeded"] {
		t.Errorf("posted severities %v, want %v (a trace Event is not posted)", got, want)
	}
}

func TestForwardRetries(t *testing.T) {
	tests := []struct {
		name     string
		answers  []int // the answers to the attempts, the last one repeated
		attempts int
		result   string
	}{
		{name: "retried on 5xx until accepted", answers: []int{500, 502, 503, 202}, attempts: 4, result: resultPosted},
		{name: "given up after Flux's 4 retries", answers: []int{500}, attempts: 5, result: resultFailed},
		{name: "429 is a duplicate: not retried", answers: []int{429}, attempts: 1, result: resultPosted},
		{name: "501 is not retried", answers: []int{501}, attempts: 1, result: resultPosted},
		{name: "4xx is not retried", answers: []int{400}, attempts: 1, result: resultPosted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newReceiver(t, func(ev eventv1.Event, attempt int) int {
				if ev.Reason != "Tested" {
					return http.StatusAccepted
				}
				return tt.answers[min(attempt, len(tt.answers))-1]
			})
			reg := prometheus.NewRegistry()
			f := start(t, r.URL, reg)
			obj := gitRepository()
			f.Forward(obj, nil, corev1.EventTypeWarning, "Tested", "m")
			// The next Event is posted once the first one's attempts are over.
			f.Forward(obj, nil, corev1.EventTypeNormal, "After", "m")
			r.waitFor(t, "After")
			if n := len(r.waitFor(t, "Tested")); n != tt.attempts {
				t.Errorf("%d attempts, want %d", n, tt.attempts)
			}
			// The counter is incremented after the post returns.
			deadline := time.Now().Add(10 * time.Second)
			for testutil.ToFloat64(f.results.WithLabelValues(resultPosted))+testutil.ToFloat64(f.results.WithLabelValues(resultFailed)) < 2 {
				if time.Now().After(deadline) {
					t.Fatal("results not counted")
				}
				time.Sleep(10 * time.Millisecond)
			}
			wantPosted, wantFailed := 2.0, 0.0
			if tt.result == resultFailed {
				wantPosted, wantFailed = 1, 1
			}
			if p, fl := testutil.ToFloat64(f.results.WithLabelValues(resultPosted)), testutil.ToFloat64(f.results.WithLabelValues(resultFailed)); p != wantPosted || fl != wantFailed {
				t.Errorf("posted %v failed %v, want %v and %v", p, fl, wantPosted, wantFailed)
			}
		})
	}
}

func TestForwardConnectionErrorRetried(t *testing.T) {
	// A receiver that drops the connection twice: transport errors are
	// retried as 5xx answers are.
	var mu sync.Mutex
	attempts, got := 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		attempts++
		n := attempts
		mu.Unlock()
		if n <= 2 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			_ = conn.Close()
			return
		}
		var ev eventv1.Event
		if err := json.NewDecoder(req.Body).Decode(&ev); err != nil {
			t.Errorf("decode: %v", err)
		}
		mu.Lock()
		got++
		mu.Unlock()
	}))
	defer srv.Close()
	f := start(t, srv.URL, nil)
	f.Forward(gitRepository(), nil, corev1.EventTypeNormal, "NewArtifact", "m")
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n, a := got, attempts
		mu.Unlock()
		if n == 1 {
			if a != 3 {
				t.Errorf("%d attempts, want 3", a)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("event not posted after %d attempts", a)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNewWithoutAddress(t *testing.T) {
	f, err := New(Options{Scheme: scheme(t)})
	if err != nil || f != nil {
		t.Fatalf("New without an address = %v, %v; want nil, nil", f, err)
	}
	// A nil Forwarder takes Events and posts nothing; the recorder still
	// records them in Kubernetes, a trace one as Normal.
	k8s := events.NewFakeRecorder(2)
	rec := &Recorder{Recorder: k8s, Forwarder: f}
	rec.Eventf(gitRepository(), nil, eventv1.EventTypeTrace, "GarbageCollectionSucceeded", "Reconcile", "%s", "garbage collected artifacts for deleted resource")
	rec.AnnotatedEventf(gitRepository(), nil, ArtifactMetadata("r", "d"), corev1.EventTypeNormal, "NewArtifact", "Reconcile", "stored %s", "x")
	for _, want := range []string{
		"Normal GarbageCollectionSucceeded garbage collected artifacts for deleted resource",
		"Normal NewArtifact stored x",
	} {
		if got := <-k8s.Events; got != want {
			t.Errorf("kubernetes event %q, want %q", got, want)
		}
	}
	// The Kubernetes Event carries the metadata and the object's Flux
	// event annotations, as Flux's.
	k8s.Verbose = true
	rec.AnnotatedEventf(gitRepository(), nil, ArtifactMetadata("r", "d"), corev1.EventTypeNormal, "NewArtifact", "Reconcile", "m")
	want := "Normal NewArtifact Reconcile m map[event.toolkit.fluxcd.io/commit:a1b2c3 source.toolkit.fluxcd.io/digest:d source.toolkit.fluxcd.io/revision:r]"
	if got := <-k8s.Events; got != want {
		t.Errorf("kubernetes event %q, want %q", got, want)
	}
	for _, addr := range []string{"ftp://x/", "localhost:9090", "://"} {
		if _, err := New(Options{Addr: addr, Scheme: scheme(t)}); err == nil {
			t.Errorf("New(%q): no error", addr)
		}
	}
}

func TestRecorderPostsWhatItRecords(t *testing.T) {
	r := newReceiver(t, nil)
	f := start(t, r.URL, nil)
	k8s := events.NewFakeRecorder(2)
	rec := &Recorder{Recorder: k8s, Forwarder: f}
	rec.Eventf(gitRepository(), nil, eventv1.EventTypeTrace, "GitOperationSucceeded", "Reconcile", "no changes")
	rec.AnnotatedEventf(gitRepository(), nil, ArtifactMetadata("main@sha1:1", "sha256:2"), corev1.EventTypeNormal, "NewArtifact", "Reconcile", "stored artifact for commit '%s'", "m")
	ev := r.waitFor(t, "NewArtifact")[0]
	if ev.Message != "stored artifact for commit 'm'" || !ev.HasMetadata(RevisionKey, "main@sha1:1") || !ev.HasMetadata(DigestKey, "sha256:2") {
		t.Errorf("posted %+v", ev)
	}
	if n := len(r.events()); n != 1 {
		t.Errorf("%d events posted, want 1 (the trace one is not)", n)
	}
	if got := <-k8s.Events; got != "Normal GitOperationSucceeded no changes" {
		t.Errorf("kubernetes event %q", got)
	}
}

// TestDrainOnStop checks that the Events still queued when the watcher
// stops are posted before Start returns.
func TestDrainOnStop(t *testing.T) {
	r := newReceiver(t, nil)
	f, err := New(Options{Addr: r.URL, Scheme: scheme(t), Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	obj := gitRepository()
	for _, reason := range []string{"First", "Second", "Third"} {
		f.Forward(obj, nil, corev1.EventTypeNormal, reason, "m")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.events(); len(got) != 3 || got[0].Reason != "First" || got[2].Reason != "Third" {
		t.Errorf("posted %+v, want First, Second and Third in order", got)
	}
}

// TestQueueFullDrops checks that Forward never blocks: with nothing
// posting, Events beyond the queue's size are dropped and counted.
func TestQueueFullDrops(t *testing.T) {
	reg := prometheus.NewRegistry()
	f, err := New(Options{Addr: "http://127.0.0.1:1/", Scheme: scheme(t), QueueSize: 2, Registerer: reg, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		f.Forward(gitRepository(), nil, corev1.EventTypeWarning, "GitOperationFailed", "m")
	}
	if n := testutil.ToFloat64(f.results.WithLabelValues(resultDropped)); n != 3 {
		t.Errorf("dropped %v, want 3", n)
	}
	if n, err := testutil.GatherAndCount(reg, "headwater_notifications_total"); err != nil || n != 3 {
		t.Errorf("headwater_notifications_total has %d series (%v), want posted, failed and dropped", n, err)
	}
}
