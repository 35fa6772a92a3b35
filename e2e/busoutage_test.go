package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// busUnavailableReason is the watcher's reason for a source whose fetch
// job the bus does not take.
const busUnavailableReason = "BusUnavailable"

// TestBusOutage stops NATS under a Ready GitRepository (every NATS server
// down: what a JetStream without quorum looks like to the watcher, whose
// publishes are refused), pushes a commit and requests a reconcile: the
// source keeps its artifact, served unchanged, and says why it is not
// fresh (FetchFailed and Ready=False BusUnavailable naming the bus,
// Reconciling ProgressingWithRetry, the request handled) with one Warning
// Event. NATS back on its store, the source is Ready at the new commit by
// itself, the failure cleared.
func TestBusOutage(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	e := startPrivateEnv(t, "Bus", func(cfg *harness.Config) {
		// A retry of the refused job every 5 s (30 s by default).
		cfg.ExtraArgs[harness.Watcher] = append(cfg.ExtraArgs[harness.Watcher], "-leader-elect=false", "-requeue-dependency", "5s")
	})
	const name = "bus-outage"
	repo, commit1 := e.newRepo(t, name, sampleFiles(t))
	e.createSource(t, name, e.Git.RepoURL(name))
	before := e.waitArtifact(t, name, revision(commit1)).Status.Artifact

	if err := e.StopNATS(); err != nil {
		t.Fatal(err)
	}
	stopped := true
	t.Cleanup(func() {
		if stopped {
			_ = e.StartNATS()
		}
	})
	commit2 := commit(t, repo, map[string]string{"CHANGELOG.md": "# Changes\n\nwhile the bus is down\n"}, "Change while the bus is down")
	token := e.requestReconcile(t, name)

	var obj *sourcev1.GitRepository
	eventually(t, "the source says its fetch job waits for the bus", func() error {
		obj = e.get(t, name)
		ready := apimeta.FindStatusCondition(obj.Status.Conditions, meta.ReadyCondition)
		if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != busUnavailableReason {
			return fmt.Errorf("Ready %+v", ready)
		}
		if obj.Status.LastHandledReconcileAt != token {
			return fmt.Errorf("lastHandledReconcileAt %q, want %q", obj.Status.LastHandledReconcileAt, token)
		}
		return nil
	})
	for _, want := range []struct {
		typ            string
		status, reason string
	}{
		{sourcev1.FetchFailedCondition, "True", busUnavailableReason},
		{meta.ReconcilingCondition, "True", meta.ProgressingWithRetryReason},
		{sourcev1.ArtifactInStorageCondition, "True", meta.SucceededReason},
	} {
		c := apimeta.FindStatusCondition(obj.Status.Conditions, want.typ)
		if c == nil || string(c.Status) != want.status || c.Reason != want.reason {
			t.Errorf("%s = %+v, want %s %s", want.typ, c, want.status, want.reason)
		}
	}
	msg := apimeta.FindStatusCondition(obj.Status.Conditions, meta.ReadyCondition).Message
	for _, part := range []string{"NATS JetStream", events.FetchStream, "revision '" + revision(commit1) + "'", "/jsz"} {
		if !strings.Contains(msg, part) {
			t.Errorf("Ready message %q does not say %q", msg, part)
		}
	}
	if a := obj.Status.Artifact; a == nil || a.Digest != before.Digest || a.Revision != before.Revision || a.URL != before.URL {
		t.Errorf("artifact while the bus is down %+v, want the one before %+v", a, before)
	}
	// Consumers read status.artifact: it is still served, whole.
	if got := sha256Digest(download(t, before.URL)); got != before.Digest {
		t.Errorf("artifact %s served with digest %s while the bus is down, want %s", before.URL, got, before.Digest)
	}
	ev := e.waitEvent(t, name, corev1.EventTypeWarning, busUnavailableReason)
	if !strings.Contains(ev.Message, events.FetchStream) {
		t.Errorf("Event message %q does not name the stream %s", ev.Message, events.FetchStream)
	}

	if err := e.StartNATS(); err != nil {
		t.Fatal(err)
	}
	stopped = false
	back := time.Now()
	after := e.waitArtifact(t, name, revision(commit2))
	t.Logf("Ready at the new commit %s after NATS started again (retries every 5 s)", time.Since(back).Round(100*time.Millisecond))
	for _, typ := range []string{sourcev1.FetchFailedCondition, meta.ReconcilingCondition} {
		if c := apimeta.FindStatusCondition(after.Status.Conditions, typ); c != nil {
			t.Errorf("%s = %+v once the bus is back, want none", typ, c)
		}
	}
	if got := sha256Digest(download(t, after.Status.Artifact.URL)); got != after.Status.Artifact.Digest {
		t.Errorf("new artifact served with digest %s, status says %s", got, after.Status.Artifact.Digest)
	}
	// One Warning for the whole outage, however often the job was retried.
	if n := e.eventCount(t, name, busUnavailableReason); n != 1 {
		t.Errorf("%d %s Events, want 1 for the outage", n, busUnavailableReason)
	}
}

// waitEvent waits for a Kubernetes Event of type and reason about the
// GitRepository name of the private Env.
func (e *privateEnv) waitEvent(t *testing.T, name, eventType, reason string) corev1.Event {
	t.Helper()
	var found corev1.Event
	eventually(t, fmt.Sprintf("%s Event %s for %s", eventType, reason, name), func() error {
		for _, ev := range e.events(t, name) {
			if ev.Type == eventType && ev.Reason == reason {
				found = ev
				return nil
			}
		}
		return fmt.Errorf("no %s Event %s", eventType, reason)
	})
	return found
}

// eventCount counts the Kubernetes Events of reason about the
// GitRepository name of the private Env, repetitions included.
func (e *privateEnv) eventCount(t *testing.T, name, reason string) int {
	t.Helper()
	n := 0
	for _, ev := range e.events(t, name) {
		if ev.Reason == reason {
			n += max(int(ev.Count), 1)
		}
	}
	return n
}

// events lists the Kubernetes Events about the GitRepository name of the
// private Env.
func (e *privateEnv) events(t *testing.T, name string) []corev1.Event {
	t.Helper()
	var list corev1.EventList
	if err := e.Client.List(t.Context(), &list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range list.Items {
		if ev.InvolvedObject.Kind == kind && ev.InvolvedObject.Name == name {
			out = append(out, ev)
		}
	}
	return out
}
