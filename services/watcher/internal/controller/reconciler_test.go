package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/services/watcher/internal/seal"
	"github.com/headwater-gitops/headwater/services/watcher/internal/sourcekind"
)

func TestJobID(t *testing.T) {
	now := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	key, err := seal.NewKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{Kind: sourceKind(), Seal: key, Now: func() time.Time { return now }}
	obj := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "default", UID: "u", Generation: 3,
		Annotations: map[string]string{meta.ReconcileRequestAnnotation: "tok"}}}
	include := func(digest string) []events.Include {
		return []events.Include{{Name: "a", ToPath: "a", Artifact: meta.Artifact{Digest: digest}}}
	}
	base := r.job(obj, &events.FetchRequested{Includes: include("sha256:1")}, 0)

	if !strings.HasPrefix(base.ID, "u/3/tok/") || base.Object.Generation != 3 || base.ReconcileToken != "tok" {
		t.Fatalf("job = %+v", base)
	}
	if err := key.Verify(base); err != nil {
		t.Errorf("the job is not sealed: %v", err)
	}
	if again := r.job(obj, &events.FetchRequested{Includes: include("sha256:1")}, 0); again.ID != base.ID {
		t.Errorf("the same reconcile in the same second made a new ID: %s vs %s", again.ID, base.ID)
	}
	for name, fetch := range map[string]*events.FetchRequested{
		"included artifact changed": {Includes: include("sha256:2")},
		"forced":                    {Includes: include("sha256:1"), Force: true},
		"stored artifact changed":   {Includes: include("sha256:1"), Previous: &meta.Artifact{Digest: "sha256:p"}},
		"webhook's fresh job":       {Includes: include("sha256:1"), Fresh: true},
		"quiet job":                 {Includes: include("sha256:1"), Quiet: true},
	} {
		if got := r.job(obj, fetch, 0); got.ID == base.ID {
			t.Errorf("%s: same ID %s, so the new job would be dropped as a duplicate", name, got.ID)
		}
	}
	// A retry the watcher scheduled, in the same second with the same
	// inputs (a host's hold that ended a few milliseconds after the job
	// met it), is a new job, and so is each retry after it.
	first := r.job(obj, &events.FetchRequested{Includes: include("sha256:1")}, 1)
	second := r.job(obj, &events.FetchRequested{Includes: include("sha256:1")}, 2)
	if first.ID == base.ID || second.ID == first.ID || second.ID == base.ID {
		t.Errorf("retries reused an ID: job %s, retry 1 %s, retry 2 %s", base.ID, first.ID, second.ID)
	}
	if again := r.job(obj, &events.FetchRequested{Includes: include("sha256:1")}, 1); again.ID != first.ID {
		t.Errorf("the same retry's reconcile repeated made a new ID: %s vs %s", again.ID, first.ID)
	}
	now = now.Add(time.Second)
	if later := r.job(obj, &events.FetchRequested{Includes: include("sha256:1")}, 0); later.ID == base.ID {
		t.Error("a reconcile a second later reused the ID")
	}
}

func sourceKind() sourcekind.Kind { return sourcekind.GitRepository() }

// publisherFunc is a Publisher that is a function.
type publisherFunc func(ctx context.Context, subject, eventType string, job events.Job, data any) error

func (f publisherFunc) Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error {
	return f(ctx, subject, eventType, job, data)
}

// admission is an Admission whose Publish is a function.
type admission struct{ publisherFunc }

func (a *admission) Forget(string, string, string) {}

// TestFetchJobsAdmission: a fetch job that takes the whole path goes
// through Admission; a quiet one, whose outcome is not reported (so no
// outcome would free its slot), goes to the bus at once, as every job does
// without Admission.
func TestFetchJobsAdmission(t *testing.T) {
	var direct, admitted int
	jobs := publisherFunc(func(context.Context, string, string, events.Job, any) error { direct++; return nil })
	adm := &admission{publisherFunc: func(context.Context, string, string, events.Job, any) error { admitted++; return nil }}
	r := &Reconciler{Jobs: jobs, Admission: adm}
	for _, quiet := range []bool{false, true} {
		if err := r.fetchJobs(&events.FetchRequested{Quiet: quiet}).Publish(t.Context(), "s", "t", events.Job{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if direct != 1 || admitted != 1 {
		t.Errorf("published %d jobs at once and %d through Admission, want 1 and 1 (the quiet one at once)", direct, admitted)
	}
	r.Admission = nil
	if err := r.fetchJobs(&events.FetchRequested{}).Publish(t.Context(), "s", "t", events.Job{}, nil); err != nil {
		t.Fatal(err)
	}
	if direct != 2 {
		t.Errorf("without Admission a job was not published at once")
	}
}
