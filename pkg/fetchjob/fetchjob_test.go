package fetchjob

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
)

// publication is one event a recorder was asked to publish.
type publication struct {
	subject, eventType string
	job                events.Job
	data               any
}

// recorder is a Publisher that keeps what it is asked to publish: the
// protocol decides what goes where; the bus (tested with a real server in
// pkg/bus and the fetchers) how.
type recorder struct {
	mu  sync.Mutex
	got []publication
	err error
}

func (r *recorder) Publish(_ context.Context, subject, eventType string, job events.Job, data any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	r.got = append(r.got, publication{subject, eventType, job, data})
	return nil
}

func (r *recorder) only(t *testing.T) publication {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) != 1 {
		t.Fatalf("%d events published, want 1: %+v", len(r.got), r.got)
	}
	return r.got[0]
}

func testJob() events.Job {
	return events.Job{ID: "job-1", RequestedAt: time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC),
		Object: events.ObjectRef{Kind: "Widget", Namespace: "ns", Name: "w", UID: "uid", Generation: 2}}
}

func TestRequested(t *testing.T) {
	req := &events.FetchRequested{Job: testJob()}
	got, err := Requested(&events.Message{Data: req})
	if err != nil || got != req {
		t.Fatalf("Requested = %v, %v; want the request", got, err)
	}
	if _, err := Requested(&events.Message{Data: &events.Outcome{}}); !errors.Is(err, events.ErrMalformed) {
		t.Errorf("an outcome on the fetch stream: %v, want ErrMalformed", err)
	}
}

// TestUnchanged answers a job whose artifact holds the revision: a quiet
// one with nothing, any other with FetchUnchanged naming the artifact on
// the kind's publish subject.
func TestUnchanged(t *testing.T) {
	prev := &meta.Artifact{Path: "widget/ns/w/a.tar.gz", Revision: "v1", Digest: "sha256:abc"}
	for _, quiet := range []bool{true, false} {
		pub := &recorder{}
		req := &events.FetchRequested{Job: testJob(), Previous: prev, Quiet: quiet}
		published, err := Unchanged(context.Background(), pub, req)
		if err != nil {
			t.Fatal(err)
		}
		if quiet {
			if published || len(pub.got) != 0 {
				t.Errorf("quiet: published %v %+v, want nothing", published, pub.got)
			}
			continue
		}
		p := pub.only(t)
		want := &events.Outcome{Job: req.Job, Revision: "v1", Artifact: prev}
		if !published || p.subject != events.PublishSubject("Widget") || p.eventType != events.TypeFetchUnchanged ||
			!reflect.DeepEqual(p.data, want) {
			t.Errorf("published %v %+v, want FetchUnchanged %+v", published, p, want)
		}
	}
	pub := &recorder{err: errors.New("bus down")}
	if _, err := Unchanged(context.Background(), pub, &events.FetchRequested{Job: testJob(), Previous: prev}); err == nil {
		t.Errorf("a failed publish was not returned")
	}
}

func TestHand(t *testing.T) {
	pub := &recorder{}
	out := &events.Fetched{Job: testJob(), Revision: "v1", Staging: ".staging/x.tar"}
	if err := Hand(context.Background(), pub, out); err != nil {
		t.Fatal(err)
	}
	if p := pub.only(t); p.subject != events.PackageSubject("Widget") || p.eventType != events.TypeFetched || p.data != out || !reflect.DeepEqual(p.job, out.Job) {
		t.Errorf("published %+v, want Fetched on the kind's package subject", p)
	}
}

// TestReport publishes a failure as the job's FetchFailed outcome with the
// revision, the notices and the failed signature check.
func TestReport(t *testing.T) {
	pub := &recorder{}
	req := &events.FetchRequested{Job: testJob()}
	f := failure.New(failure.Final, sourcev1.FetchFailedCondition, "Broken", "upstream says %s", "no")
	f.Revision = "v2"
	f.Notices = []events.Notice{{Warning: true, Reason: events.ArtifactMissingReason, Message: "gone"}}
	v := &events.Verification{Mode: "HEAD", Reason: "VerificationError", Message: "bad signature"}
	if err := Report(context.Background(), pub, &events.Message{Data: req}, f, v); err != nil {
		t.Fatal(err)
	}
	p := pub.only(t)
	want := &events.Outcome{Job: req.Job, Revision: "v2", Failure: f.Data(), Notices: f.Notices, Verification: v}
	if p.subject != events.PublishSubject("Widget") || p.eventType != events.TypeFetchFailed || !reflect.DeepEqual(p.data, want) {
		t.Errorf("published %+v, want %+v", p, want)
	}
	if want.Failure.Message != "upstream says no" || want.Failure.Reason != "Broken" {
		t.Errorf("failure data %+v", want.Failure)
	}
	if err := Report(context.Background(), pub, &events.Message{Data: &events.Outcome{}}, f, nil); err == nil ||
		!strings.Contains(err.Error(), "not a fetch request") {
		t.Errorf("report of another event: %v", err)
	}
}
