package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	eventv1 "github.com/fluxcd/pkg/apis/event/v1beta1"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// notificationReceiver stands in for Flux's notification-controller: the
// watcher's -events-addr points at it for the whole run. It decodes every
// request into Flux's own event type, refusing unknown fields, as the
// notification-controller's receiver does.
type notificationReceiver struct {
	*httptest.Server
	mu       sync.Mutex
	received []eventv1.Event
	// invalid lists the requests that did not decode.
	invalid []string
}

func startNotificationReceiver() *notificationReceiver {
	r := &notificationReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var ev eventv1.Event
		dec := json.NewDecoder(req.Body)
		dec.DisallowUnknownFields()
		err := dec.Decode(&ev)
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil || req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json" {
			r.invalid = append(r.invalid, fmt.Sprintf("%s %s: %v", req.Method, req.Header.Get("Content-Type"), err))
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		r.received = append(r.received, ev)
		w.WriteHeader(http.StatusAccepted)
	}))
	return r
}

// about returns the Events received about the object of kind and name, in
// the order they arrived, and fails the test on any request that did not
// decode as Flux's Event.
func (r *notificationReceiver) about(t *testing.T, kind, name string) []eventv1.Event {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.invalid) > 0 {
		t.Fatalf("requests that are not Flux events: %v", r.invalid)
	}
	var out []eventv1.Event
	for _, ev := range r.received {
		if ev.InvolvedObject.Kind == kind && ev.InvolvedObject.Namespace == namespace && ev.InvolvedObject.Name == name {
			out = append(out, ev)
		}
	}
	return out
}

// waitNotification waits for an Event of reason about the GitRepository
// name that match accepts, and returns it.
func (r *notificationReceiver) waitNotification(t *testing.T, name, reason string, match func(eventv1.Event) bool) eventv1.Event {
	t.Helper()
	var found eventv1.Event
	eventually(t, fmt.Sprintf("%s notification for gitrepository %s", reason, name), func() error {
		var seen []string
		for _, ev := range r.about(t, sourcev1.GitRepositoryKind, name) {
			if ev.Reason == reason && (match == nil || match(ev)) {
				found = ev
				return nil
			}
			seen = append(seen, ev.Severity+" "+ev.Reason+" "+ev.Message)
		}
		return fmt.Errorf("notifications seen: %v", seen)
	})
	return found
}

// reasons lists the reasons of evs.
func reasons(evs []eventv1.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Reason
	}
	return out
}

// TestFluxNotifications follows a GitRepository through its life with the
// watcher's -events-addr set, as Flux's source-controller's would be: what
// Flux posts to its notification-controller is posted, in Flux's format
// (decoded here with Flux's own type), and what Flux only records (its
// traces) is recorded as a Kubernetes Event but not posted.
func TestFluxNotifications(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "notify"
	repo, first := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	obj := waitArtifact(t, name, revision(first))

	// A new artifact: NewArtifact, info, with the artifact's revision and
	// digest as Flux's metadata, reported as source-controller.
	ev := notifications.waitNotification(t, name, "NewArtifact", nil)
	want := "stored artifact for commit 'Initial commit of " + name + "'"
	if ev.Message != want || ev.Severity != eventv1.EventSeverityInfo {
		t.Errorf("NewArtifact %s %q, want info %q", ev.Severity, ev.Message, want)
	}
	if ev.ReportingController != "source-controller" || ev.ReportingInstance == "" {
		t.Errorf("reported by %q (instance %q), want source-controller and the pod's host name", ev.ReportingController, ev.ReportingInstance)
	}
	io := ev.InvolvedObject
	if io.APIVersion != sourcev1.GroupVersion.String() || io.UID != obj.UID {
		t.Errorf("involvedObject %+v, want %s with UID %s", io, sourcev1.GroupVersion, obj.UID)
	}
	wantMeta := map[string]string{
		"source.toolkit.fluxcd.io/revision": obj.Status.Artifact.Revision,
		"source.toolkit.fluxcd.io/digest":   obj.Status.Artifact.Digest,
	}
	if len(ev.Metadata) != len(wantMeta) || !ev.HasMetadata("source.toolkit.fluxcd.io/revision", wantMeta["source.toolkit.fluxcd.io/revision"]) ||
		!ev.HasMetadata("source.toolkit.fluxcd.io/digest", wantMeta["source.toolkit.fluxcd.io/digest"]) {
		t.Errorf("metadata %v, want %v", ev.Metadata, wantMeta)
	}
	if ev.Metadata["source.toolkit.fluxcd.io/revision"] != revision(first) {
		t.Errorf("revision metadata %q, want %q", ev.Metadata["source.toolkit.fluxcd.io/revision"], revision(first))
	}
	waitKubeEvent(t, name, "Normal", "NewArtifact", func(msg string) bool { return msg == want })

	// Nothing new upstream: Flux's trace GitOperationSucceeded, a Normal
	// Kubernetes Event, not posted.
	token := requestReconcile(t, name)
	eventually(t, "the reconcile request handled", func() error {
		if got := get(t, name).Status.LastHandledReconcileAt; got != token {
			return fmt.Errorf("lastHandledReconcileAt %q, want %q", got, token)
		}
		return nil
	})
	noChange := "no changes since last reconciliation: observed revision '" + revision(first) + "'"
	waitKubeEvent(t, name, "Normal", sourcev1.GitOperationSucceedReason, func(msg string) bool { return msg == noChange })

	// A new commit: its NewArtifact is posted after anything the watcher
	// recorded before it (one queue, posted in order), so the no-change
	// trace would be among the notifications by then.
	second := commit(t, repo, map[string]string{"app.yaml": "replicas: 2\n"}, "Scale up")
	requestReconcile(t, name)
	notifications.waitNotification(t, name, "NewArtifact", func(ev eventv1.Event) bool {
		return ev.HasMetadata("source.toolkit.fluxcd.io/revision", revision(second))
	})
	if got := reasons(notifications.about(t, sourcev1.GitRepositoryKind, name)); strings.Join(got, ",") != "NewArtifact,NewArtifact" {
		t.Errorf("notifications %v, want the two NewArtifact only (Flux does not post its traces)", got)
	}

	// Deleted: GarbageCollectionSucceeded, a trace too.
	if err := env.Client.Delete(t.Context(), get(t, name)); err != nil {
		t.Fatal(err)
	}
	waitKubeEvent(t, name, "Normal", "GarbageCollectionSucceeded", func(msg string) bool {
		return msg == "garbage collected artifacts for deleted resource"
	})

	// A source that fails: a Warning, posted with severity error; once it
	// is posted, so is everything recorded before it.
	const failing = "notify-failing"
	createSource(t, failing, env.Git.RepoURL("notify-missing"), branch)
	ev = notifications.waitNotification(t, failing, sourcev1.GitOperationFailedReason, nil)
	if ev.Severity != eventv1.EventSeverityError || ev.Metadata != nil {
		t.Errorf("failure posted as %s with metadata %v, want error without metadata", ev.Severity, ev.Metadata)
	}
	if got := reasons(notifications.about(t, sourcev1.GitRepositoryKind, name)); strings.Join(got, ",") != "NewArtifact,NewArtifact" {
		t.Errorf("notifications %v after the deletion, want the two NewArtifact only", got)
	}
	deleteSource(t, failing)
}

// deleteSource deletes the GitRepository name, if it is still there.
func deleteSource(t *testing.T, name string) {
	t.Helper()
	var obj sourcev1.GitRepository
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, &obj); err != nil {
		return
	}
	if err := env.Client.Delete(t.Context(), &obj); client.IgnoreNotFound(err) != nil {
		t.Error(err)
	}
}
