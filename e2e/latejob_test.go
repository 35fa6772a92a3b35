package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
)

// lateJobCap is the late-job Env's fetch deadline (-max-job-timeout): the
// frozen fetcher is resumed after it, so that its job fails late.
const lateJobCap = 20 * time.Second

// stallProxy forwards to a git server, but holds the first fetch of
// objects (POST git-upload-pack) until release is closed or its client
// hangs up: the fetch of whoever takes the first job stays in flight.
type stallProxy struct {
	*httptest.Server
	stalled, release chan struct{}
	first            atomic.Bool
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(u)
	p := &stallProxy{stalled: make(chan struct{}), release: make(chan struct{})}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack") && p.first.CompareAndSwap(false, true) {
			close(p.stalled)
			select {
			case <-p.release:
			case <-r.Context().Done():
				return
			}
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		close(p.release)
		p.CloseClientConnections()
		p.Close()
	})
	return p
}

// TestLateJob freezes a fetcher (SIGSTOP) in the middle of a fetch, as a
// node cut off from the network with its processes still running would
// be: its job is redelivered to the other fetcher, and the source moves on
// to a newer commit. The frozen fetcher then resumes, past the job's
// deadline, and reports the job it held failed (DeadlineExceeded): the
// outcome of an older job, arriving after a newer one's. It must not
// touch the source: it stays Ready at the newer commit, no Warning Event
// is recorded, and the watcher counts the outcome as superseded
// (headwater_superseded_outcomes_total). Before the watcher ordered
// outcomes by job, the source went Ready=False DeadlineExceeded here.
func TestLateJob(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	e := startPrivateEnv(t, "late", func(cfg *harness.Config) {
		cfg.FetcherReplicas = 2
		cfg.ExtraArgs[harness.Fetcher] = append(cfg.ExtraArgs[harness.Fetcher], "-concurrency", "1",
			"-job-timeout", "10s", "-max-job-timeout", lateJobCap.String())
		cfg.ExtraArgs[harness.Watcher] = append(cfg.ExtraArgs[harness.Watcher], "-leader-elect=false")
	})
	const name = "late-job"
	repo, commit1 := e.newRepo(t, name, sampleFiles(t))
	proxy := newStallProxy(t, e.Git.URL())
	e.createSource(t, name, proxy.URL+"/"+name+".git")

	// The first job's fetch hangs at the proxy: freeze the fetcher that
	// holds it.
	select {
	case <-proxy.stalled:
	case <-time.After(time.Minute):
		t.Fatal("no fetch reached the git server within a minute")
	}
	var frozen *harness.Service
	eventually(t, "the fetcher holding the first job", func() error {
		for _, f := range e.Replicas(harness.Fetcher) {
			n, err := metricSum(f.TelemetryAddr, "headwater_jobs_in_flight", `service="fetcher"`)
			if err != nil {
				return err
			}
			if n == 1 {
				frozen = f
				return nil
			}
		}
		return fmt.Errorf("no fetcher has a job in flight")
	})
	if err := syscall.Kill(frozen.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozenAt := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(frozen.Pid(), syscall.SIGCONT); err != nil {
				t.Errorf("resume %s: %v", frozen.Name, err)
			}
		}
	}
	t.Cleanup(resume)
	t.Logf("%s frozen with the first job's fetch in flight", frozen.Name)

	// The job is redelivered to the other fetcher once its ack wait
	// passes; then a new commit is fetched there too.
	e.waitArtifact(t, name, revision(commit1))
	commit2 := commit(t, repo, map[string]string{"late.txt": "second"}, "Second commit")
	e.requestReconcile(t, name)
	newest := e.waitArtifact(t, name, revision(commit2)).Status.Artifact

	// Resume the frozen fetcher once its job's deadline has passed: it
	// reports the job failed.
	watcher := e.Service(harness.Watcher)
	superseded := func() float64 {
		v, err := metricSum(watcher.TelemetryAddr, "headwater_superseded_outcomes_total")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := superseded()
	if wait := lateJobCap + 2*time.Second - time.Since(frozenAt); wait > 0 {
		time.Sleep(wait)
	}
	resume()
	late := e.waitCloudEvent(t, name, events.TypeArtifactFailed, func(o *events.Outcome) bool {
		return o.Failure != nil && o.Failure.Reason == failure.DeadlineExceededReason
	}).outcome()
	t.Logf("late outcome of job %s, requested %s: %s", late.Job.ID, late.Job.RequestedAt.Format(time.RFC3339Nano), late.Failure.Message)
	eventually(t, "the late outcome counted as superseded", func() error {
		if n := superseded(); n != before+1 {
			return fmt.Errorf("headwater_superseded_outcomes_total = %v, want %v", n, before+1)
		}
		return nil
	})

	obj := e.get(t, name)
	if ready := apimeta.FindStatusCondition(obj.Status.Conditions, meta.ReadyCondition); ready == nil ||
		ready.Status != metav1.ConditionTrue || obj.Status.Artifact == nil || obj.Status.Artifact.Digest != newest.Digest {
		t.Errorf("after the late outcome: Ready %+v, artifact %+v; want Ready with the newest artifact %s", ready, obj.Status.Artifact, newest.Digest)
	}
	if c := apimeta.FindStatusCondition(obj.Status.Conditions, sourcev1.FetchFailedCondition); c != nil {
		t.Errorf("FetchFailed = %+v after the late outcome, want none", c)
	}
	for _, ev := range e.events(t, name) {
		if ev.Type == corev1.EventTypeWarning {
			t.Errorf("Warning Event %s %q: a late outcome was recorded", ev.Reason, ev.Message)
		}
	}
	if got := sha256Digest(download(t, newest.URL)); got != newest.Digest {
		t.Errorf("newest artifact served with digest %s, status says %s", got, newest.Digest)
	}
}
