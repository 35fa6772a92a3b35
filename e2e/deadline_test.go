package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/failure"
)

// The deadline Env's job deadlines: short, so that the test outwaits them,
// and long enough for the victim's jobs on a loaded machine (every job
// has them). The fetcher's cap is what a tenant's spec.timeout meets; the
// packager's -job-timeout is every packaging job's.
const (
	deadlineFetchCap = 20 * time.Second
	deadlinePackage  = 10 * time.Second
)

// startDeadlineEnv starts an Env of the test's own with one slot in the
// fetcher and one in the packager, so that a job that held its slot would
// hold every tenant's work, and short job deadlines. The packager's
// limits are off, so the deadline is what stops the heavy generator (the
// copy limit stopping it first is TestLockdown's).
func startDeadlineEnv(t *testing.T) *privateEnv {
	t.Helper()
	return startPrivateEnv(t, "deadline", func(cfg *harness.Config) {
		cfg.ExtraArgs[harness.Fetcher] = append(cfg.ExtraArgs[harness.Fetcher], "-concurrency", "1",
			"-job-timeout", "10s", "-max-job-timeout", deadlineFetchCap.String())
		cfg.ExtraArgs[harness.Packager] = append(cfg.ExtraArgs[harness.Packager], "-concurrency", "1",
			"-job-timeout", deadlinePackage.String(), "-max-unpack-size", "0", "-max-unpack-entries", "0")
	})
}

// trickleServer answers every request as a git server that has begun its
// reference advertisement and never finishes it: a pkt-line announced as
// 65520 bytes long, then one byte of it every 200 ms, until the client
// hangs up.
type trickleServer struct {
	*httptest.Server
	// requests counts the requests seen, open those being answered.
	requests, open atomic.Int32
	stop           chan struct{}
}

func newTrickleServer(t *testing.T) *trickleServer {
	t.Helper()
	s := &trickleServer{stop: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		s.open.Add(1)
		defer s.open.Add(-1)
		w.Header().Set("Content-Type", "application/x-git-upload-pack-advertisement")
		w.WriteHeader(http.StatusOK)
		flusher := w.(http.Flusher)
		_, _ = io.WriteString(w, "fff0")
		flusher.Flush()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-s.stop:
				return
			case <-tick.C:
				if _, err := io.WriteString(w, "a"); err != nil {
					return
				}
				flusher.Flush()
			}
		}
	}))
	t.Cleanup(func() {
		close(s.stop)
		s.CloseClientConnections()
		s.Close()
	})
	return s
}

// waitWarning waits for a Warning Event of reason on the object name in
// namespace ns whose message has inMsg, and returns its message.
func (e *privateEnv) waitWarning(t *testing.T, ns, name, reason, inMsg string) string {
	t.Helper()
	var msg string
	eventually(t, fmt.Sprintf("a Warning Event %s on %s/%s", reason, ns, name), func() error {
		var list corev1.EventList
		if err := e.Client.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, ev := range list.Items {
			if ev.InvolvedObject.Name == name && ev.Type == corev1.EventTypeWarning && ev.Reason == reason && strings.Contains(ev.Message, inMsg) {
				msg = ev.Message
				return nil
			}
		}
		return fmt.Errorf("no such Event among %d", len(list.Items))
	})
	return msg
}

// TestJobDeadline is written as an attacker in namespace deadline-a who
// tries to hold the shared services' slots, each of which serves one job
// at a time here:
//
//   - a GitRepository at a server that trickles its answer forever, with a
//     spec.timeout of half an hour: the fetch fails at the fetcher's
//     -max-job-timeout with DeadlineExceeded (FetchFailed and Ready, a
//     Warning Event), the fetcher hangs up on the server, and a victim's
//     source created while the attacker's fetch hangs becomes Ready;
//   - an ArtifactGenerator whose copy operations would write the
//     attacker's tree thousands of times: the job fails at the packager's
//     -job-timeout with DeadlineExceeded (Ready, a Warning Event) and a
//     victim's generator queued behind it is served.
//
// The victim's first source keeps its artifact, which still downloads;
// afterwards a new commit of it passes both services; every service is
// still running when the Env stops.
func TestJobDeadline(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	e := startDeadlineEnv(t)
	ctx := t.Context()
	const attacker = "deadline-a"
	if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: attacker}}); err != nil {
		t.Fatal(err)
	}
	victimRepo, c := e.newRepo(t, "deadline-victim", map[string]string{"apps/app/deploy.yaml": "kind: Deployment # the victim's\n"})
	e.createSource(t, "deadline-victim", e.Git.RepoURL("deadline-victim"))
	before := e.waitArtifact(t, "deadline-victim", revision(c)).Status.Artifact.DeepCopy()

	// The fetcher: a trickling server and a spec.timeout of half an hour
	// (the longest the API lets a client write in minutes is as long as
	// it likes: only the cap bounds it).
	trickle := newTrickleServer(t)
	slow := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Namespace: attacker, Name: "trickle"},
		Spec: sourcev1.GitRepositorySpec{
			URL:       trickle.URL + "/app.git",
			Interval:  metav1.Duration{Duration: time.Hour},
			Timeout:   &metav1.Duration{Duration: 30 * time.Minute},
			Reference: &sourcev1.GitRepositoryRef{Branch: branch},
		},
	}
	if err := e.Client.Create(ctx, slow); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the attacker's fetch holds the fetcher's one slot", func() error {
		if n := trickle.open.Load(); n != 1 {
			return fmt.Errorf("%d requests being trickled (of %d)", n, trickle.requests.Load())
		}
		return nil
	})
	_, c2 := e.newRepo(t, "deadline-victim2", map[string]string{"app.yaml": "kind: ConfigMap # queued behind the attacker\n"})
	e.createSource(t, "deadline-victim2", e.Git.RepoURL("deadline-victim2"))

	deadlineMsg := fmt.Sprintf("the job did not finish within its deadline of %s", deadlineFetchCap)
	eventually(t, "the attacker's GitRepository fails at the deadline", func() error {
		obj := &sourcev1.GitRepository{}
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(slow), obj); err != nil {
			return err
		}
		fetch := apimeta.FindStatusCondition(obj.Status.Conditions, sourcev1.FetchFailedCondition)
		ready := apimeta.FindStatusCondition(obj.Status.Conditions, meta.ReadyCondition)
		if fetch == nil || fetch.Status != metav1.ConditionTrue || fetch.Reason != failure.DeadlineExceededReason || fetch.Message != deadlineMsg {
			return fmt.Errorf("FetchFailed = %+v", fetch)
		}
		if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != failure.DeadlineExceededReason || ready.Message != deadlineMsg {
			return fmt.Errorf("Ready = %+v", ready)
		}
		if obj.Status.Artifact != nil {
			return fmt.Errorf("artifact %+v from a server that never answered", obj.Status.Artifact)
		}
		return nil
	})
	e.waitWarning(t, attacker, slow.Name, failure.DeadlineExceededReason, deadlineMsg)
	e.waitArtifact(t, "deadline-victim2", revision(c2))
	eventually(t, "the fetcher hangs up on the trickling server", func() error {
		if n := trickle.open.Load(); n != 0 {
			return fmt.Errorf("%d requests still being trickled", n)
		}
		return nil
	})

	// The packager: a generator of the attacker's own source whose copy
	// operations write its 400 files again and again, 4000 times.
	files := map[string]string{}
	for i := range 400 {
		files[fmt.Sprintf("f/%03d.yaml", i)] = fmt.Sprintf("n: %d\n", i)
	}
	_, c3 := e.newRepo(t, "deadline-a-repo", files)
	own := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Namespace: attacker, Name: "own"},
		Spec: sourcev1.GitRepositorySpec{
			URL:       e.Git.RepoURL("deadline-a-repo"),
			Interval:  metav1.Duration{Duration: time.Hour},
			Reference: &sourcev1.GitRepositoryRef{Branch: branch},
		},
	}
	if err := e.Client.Create(ctx, own); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the attacker's own source Ready", func() error {
		obj := &sourcev1.GitRepository{}
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(own), obj); err != nil {
			return err
		}
		if obj.Status.Artifact == nil || obj.Status.Artifact.Revision != revision(c3) {
			return fmt.Errorf("artifact %+v", obj.Status.Artifact)
		}
		return nil
	})
	var copies []swv1beta1.CopyOperation
	for i := range 4000 {
		copies = append(copies, swv1beta1.CopyOperation{From: "@repo/**", To: fmt.Sprintf("@artifact/c%04d/", i)})
	}
	heavy := &swv1beta1.ArtifactGenerator{
		ObjectMeta: metav1.ObjectMeta{Namespace: attacker, Name: "heavy"},
		Spec: swv1beta1.ArtifactGeneratorSpec{
			Sources:         []swv1beta1.SourceReference{{Alias: "repo", Kind: sourcev1.GitRepositoryKind, Name: own.Name}},
			OutputArtifacts: []swv1beta1.OutputArtifact{{Name: "heavy-out", Copy: copies}},
		},
	}
	plain := &swv1beta1.ArtifactGenerator{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "deadline-plain"},
		Spec: swv1beta1.ArtifactGeneratorSpec{
			Sources: []swv1beta1.SourceReference{{Alias: "repo", Kind: sourcev1.GitRepositoryKind, Name: "deadline-victim"}},
			OutputArtifacts: []swv1beta1.OutputArtifact{{Name: "deadline-plain-out",
				Copy: []swv1beta1.CopyOperation{{From: "@repo/apps/app/**", To: "@artifact/"}}}},
		},
	}
	for _, g := range []*swv1beta1.ArtifactGenerator{heavy, plain} {
		if err := e.Client.Create(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	packageMsg := fmt.Sprintf("the job did not finish within its deadline of %s", deadlinePackage)
	ready := e.waitGeneratorIn(t, client.ObjectKeyFromObject(heavy), metav1.ConditionFalse, failure.DeadlineExceededReason)
	if ready.Message != packageMsg {
		t.Errorf("heavy: Ready message %q, want %q", ready.Message, packageMsg)
	}
	e.waitWarning(t, attacker, heavy.Name, failure.DeadlineExceededReason, packageMsg)
	e.waitGeneratorIn(t, client.ObjectKeyFromObject(plain), metav1.ConditionTrue, meta.SucceededReason)

	// The victim is untouched, and both services serve its next commit.
	now := e.get(t, "deadline-victim")
	if !apimeta.IsStatusConditionTrue(now.Status.Conditions, meta.ReadyCondition) ||
		now.Status.Artifact.Digest != before.Digest || now.Status.Artifact.Revision != before.Revision {
		t.Errorf("victim after the attacks: %+v, want Ready with %s", now.Status, before.Digest)
	}
	if got := sha256Digest(download(t, before.URL)); got != before.Digest {
		t.Errorf("the victim's artifact downloads with digest %s, want %s", got, before.Digest)
	}
	c4 := commit(t, victimRepo, map[string]string{"apps/app/deploy.yaml": "kind: Deployment # the victim's, v2\n"}, "v2")
	e.requestReconcile(t, "deadline-victim")
	e.waitArtifact(t, "deadline-victim", revision(c4))
}
