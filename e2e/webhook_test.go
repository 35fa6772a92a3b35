package e2e

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestWebhookReceiver drives a GitHub push through the whole system: a
// Receiver (notification.toolkit.fluxcd.io/v1, as users write it for Flux)
// becomes Ready with Flux's webhook path; a push to the git server
// followed by a real GitHub push payload, signed with the token's HMAC, moves
// the GitRepository (interval 1h) and the one its `*` + matchLabels entry
// selects to the new commit (the token never on the bus); a request signed
// with another key is refused (400, as Flux) and fetches nothing, an
// unknown path is 404, and a
// Receiver whose token Secret is missing is not Ready and has no path.
func TestWebhookReceiver(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const (
		name     = "webhook"
		labeled  = "webhook-labeled"
		receiver = "webhook-github"
	)
	// The bus tap checks, at the end of the run, that the token never
	// crossed the bus.
	token := urlCredential(receiver)
	repo, commitA := newRepo(t, name, map[string]string{"app.yaml": "version: a\n"})
	url := env.Git.RepoURL(name)
	hourly := func(o *sourcev1.GitRepository) { o.Spec.Interval = metav1.Duration{Duration: time.Hour} }
	createSource(t, name, url, branch, hourly)
	createSource(t, labeled, url, branch, hourly, func(o *sourcev1.GitRepository) {
		o.Labels = map[string]string{"webhook-e2e": "yes"}
	})
	waitArtifact(t, name, revision(commitA))
	waitArtifact(t, labeled, revision(commitA))

	createObject(t, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "webhook-token", Namespace: namespace},
		StringData: map[string]string{"token": token},
	})
	rcv := &notificationv1.Receiver{
		ObjectMeta: metav1.ObjectMeta{Name: receiver, Namespace: namespace},
		Spec: notificationv1.ReceiverSpec{
			Type:      notificationv1.GitHubReceiver,
			Events:    []string{"ping", "push"},
			SecretRef: &meta.LocalObjectReference{Name: "webhook-token"},
			Resources: []notificationv1.ReceiverResource{
				{CrossNamespaceObjectReference: notificationv1.CrossNamespaceObjectReference{Kind: sourcev1.GitRepositoryKind, Name: name}},
				{CrossNamespaceObjectReference: notificationv1.CrossNamespaceObjectReference{
					Kind: sourcev1.GitRepositoryKind, Name: "*", MatchLabels: map[string]string{"webhook-e2e": "yes"}}},
			},
		},
	}
	createObject(t, rcv)
	wantPath := rcv.GetWebhookPath(token)
	eventually(t, "Receiver Ready with its webhook path", func() error {
		got := getObject(t, receiver, &notificationv1.Receiver{})
		c := readyOf(got)
		want := "Receiver initialized for path: " + wantPath
		if c.Status != metav1.ConditionTrue || c.Reason != meta.SucceededReason || c.Message != want ||
			got.Status.WebhookPath != wantPath || got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("Ready %s %s %q, webhookPath %q, observedGeneration %d of %d",
				c.Status, c.Reason, c.Message, got.Status.WebhookPath, got.Status.ObservedGeneration, got.Generation)
		}
		return nil
	})
	hookURL := "http://" + env.ReceiverAddr + wantPath

	// GitHub's ping, sent when the webhook is created, is answered.
	if code := postHook(t, hookURL, "ping", []byte(`{"zen":"Keep it logically awesome.","hook_id":1}`), token); code != http.StatusOK {
		t.Fatalf("ping: status %d, want 200", code)
	}

	commitB := commit(t, repo, map[string]string{"app.yaml": "version: b\n"}, "Release b")
	push := githubPush(t, url, commitA, commitB)
	before := len(recorder.forSource(name))

	// Signed with another key: refused, and nothing is fetched.
	if code := postHook(t, hookURL, "push", push, "not-the-token"); code != http.StatusBadRequest {
		t.Fatalf("push with a bad signature: status %d, want 400", code)
	}
	// An unknown path, with a valid signature: 404.
	if code := postHook(t, "http://"+env.ReceiverAddr+"/hook/"+strings.Repeat("ab", 32), "push", push, token); code != http.StatusNotFound {
		t.Fatalf("unknown path: status %d, want 404", code)
	}
	consistently(t, "no fetch after a refused hook", 3*time.Second, func() error {
		if n := len(recorder.forSource(name)); n != before {
			return fmt.Errorf("%d new events for %s", n-before, name)
		}
		if a := get(t, name).Status.Artifact; a == nil || a.Revision != revision(commitA) {
			return fmt.Errorf("artifact %v, want revision %s", a, revision(commitA))
		}
		return nil
	})

	// The real push: both sources move to B long before their interval.
	if code := postHook(t, hookURL, "push", push, token); code != http.StatusOK {
		t.Fatalf("push: status %d, want 200", code)
	}
	waitArtifact(t, name, revision(commitB))
	waitArtifact(t, labeled, revision(commitB))

	// A Receiver whose Secret is missing is not Ready and has no path, in
	// Flux's words.
	missing := &notificationv1.Receiver{
		ObjectMeta: metav1.ObjectMeta{Name: "webhook-no-secret", Namespace: namespace},
		Spec: notificationv1.ReceiverSpec{
			Type:      notificationv1.GenericReceiver,
			SecretRef: &meta.LocalObjectReference{Name: "webhook-missing"},
			Resources: rcv.Spec.Resources,
		},
	}
	createObject(t, missing)
	eventually(t, "Receiver without its Secret not Ready", func() error {
		got := getObject(t, missing.Name, &notificationv1.Receiver{})
		c := readyOf(got)
		if c.Status != metav1.ConditionFalse || c.Reason != notificationv1.TokenNotFoundReason ||
			!strings.Contains(c.Message, "unable to read token from secret 'default/webhook-missing'") || got.Status.WebhookPath != "" {
			return fmt.Errorf("Ready %s %s %q, webhookPath %q", c.Status, c.Reason, c.Message, got.Status.WebhookPath)
		}
		return nil
	})
}

// readyOf returns a Receiver's Ready condition (empty when it has none).
func readyOf(r *notificationv1.Receiver) metav1.Condition {
	if c := apimeta.FindStatusCondition(r.Status.Conditions, meta.ReadyCondition); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// postHook POSTs body as GitHub does: the event type, a delivery ID and the
// body's HMAC-SHA256 with key in X-Hub-Signature-256. It returns the status.
func postHook(t *testing.T, url, event string, body []byte, key string) int {
	t.Helper()
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write(body)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "GitHub-Hookshot/e2e")
	req.Header.Set("X-GitHub-Event", event)
	req.Header.Set("X-GitHub-Delivery", fmt.Sprintf("e2e-%d", time.Now().UnixNano()))
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("post hook: %v", err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// githubPush is a GitHub push event's payload for a push of after onto
// master (the fields GitHub sends that a receiver may read).
func githubPush(t *testing.T, cloneURL, before, after string) []byte {
	t.Helper()
	now := time.Now().UTC().Format(time.RFC3339)
	author := map[string]string{"name": "E2E", "email": "e2e@example.com", "username": "e2e"}
	b, err := json.Marshal(map[string]any{
		"ref":     "refs/heads/" + branch,
		"before":  before,
		"after":   after,
		"created": false, "deleted": false, "forced": false,
		"compare": cloneURL + "/compare/" + before[:12] + "..." + after[:12],
		"commits": []map[string]any{{
			"id": after, "tree_id": after, "distinct": true, "message": "Release b", "timestamp": now,
			"author": author, "committer": author, "added": []string{}, "removed": []string{}, "modified": []string{"app.yaml"},
		}},
		"head_commit": map[string]any{"id": after, "message": "Release b", "timestamp": now, "author": author},
		"repository": map[string]any{
			"id": 1, "name": "webhook", "full_name": "e2e/webhook", "private": true,
			"clone_url": cloneURL, "default_branch": branch, "master_branch": branch,
		},
		"pusher": map[string]string{"name": "e2e", "email": "e2e@example.com"},
		"sender": map[string]any{"login": "e2e", "id": 1, "type": "User"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
