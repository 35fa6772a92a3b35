package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestReceiverTokenRotation rotates a Receiver's token as an operator does
// after a leak: the receiver service holds each named Secret's token from
// a watch (no read per request, no time-to-live), so the leaked token is
// refused as soon as the Secret changes, with no restart, while the
// Receiver's path is still the old one; once the Receiver is reconciled
// (`flux reconcile receiver`, or its interval) its path follows the new
// token, the old path is gone (404), and a push signed with the new token
// moves its source.
func TestReceiverTokenRotation(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name, receiver, secret = "rotation", "rotation-github", "rotation-token"
	oldToken, newToken := urlCredential(receiver+"-old"), urlCredential(receiver+"-new")
	repo, commitA := newRepo(t, name, map[string]string{"app.yaml": "version: a\n"})
	url := env.Git.RepoURL(name)
	createSource(t, name, url, branch, func(o *sourcev1.GitRepository) { o.Spec.Interval = metav1.Duration{Duration: time.Hour} })
	waitArtifact(t, name, revision(commitA))

	tokenSecret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: namespace},
		StringData: map[string]string{"token": oldToken},
	}
	createObject(t, tokenSecret)
	rcv := &notificationv1.Receiver{
		ObjectMeta: metav1.ObjectMeta{Name: receiver, Namespace: namespace},
		Spec: notificationv1.ReceiverSpec{
			Type:      notificationv1.GitHubReceiver,
			Events:    []string{"ping", "push"},
			SecretRef: &meta.LocalObjectReference{Name: secret},
			Resources: []notificationv1.ReceiverResource{
				{CrossNamespaceObjectReference: notificationv1.CrossNamespaceObjectReference{Kind: sourcev1.GitRepositoryKind, Name: name}},
			},
		},
	}
	createObject(t, rcv)
	oldPath, newPath := rcv.GetWebhookPath(oldToken), rcv.GetWebhookPath(newToken)
	waitReceiverPath(t, receiver, oldPath)
	oldURL, newURL := "http://"+env.ReceiverAddr+oldPath, "http://"+env.ReceiverAddr+newPath
	ping := []byte(`{"zen":"Rotate early.","hook_id":1}`)
	if code := postHook(t, oldURL, "ping", ping, oldToken); code != http.StatusOK {
		t.Fatalf("ping with the token before the rotation: status %d, want 200", code)
	}

	// The rotation: the leaked token is refused at once on the path it
	// still has; the new one is accepted there.
	patchObject(t, tokenSecret, func(s *corev1.Secret) { s.StringData = map[string]string{"token": newToken} })
	eventually(t, "the leaked token refused after the rotation", func() error {
		if code := postHook(t, oldURL, "ping", ping, oldToken); code != http.StatusBadRequest {
			return fmt.Errorf("ping signed with the leaked token: status %d, want 400", code)
		}
		return nil
	})
	if code := postHook(t, oldURL, "ping", ping, newToken); code != http.StatusOK {
		t.Errorf("ping signed with the new token on the path not yet moved: status %d, want 200", code)
	}

	// The Receiver reconciled: its path follows the token.
	requestReconcileOf(t, getObject(t, receiver, &notificationv1.Receiver{}))
	waitReceiverPath(t, receiver, newPath)
	if code := postHook(t, oldURL, "ping", ping, newToken); code != http.StatusNotFound {
		t.Errorf("the old path after the Receiver moved: status %d, want 404", code)
	}
	commitB := commit(t, repo, map[string]string{"app.yaml": "version: b\n"}, "Release b")
	if code := postHook(t, newURL, "push", githubPush(t, url, commitA, commitB), newToken); code != http.StatusOK {
		t.Fatalf("push signed with the new token: status %d, want 200", code)
	}
	waitArtifact(t, name, revision(commitB))
}

// waitReceiverPath waits until the Receiver is Ready with webhook path
// path.
func waitReceiverPath(t *testing.T, name, path string) {
	t.Helper()
	eventually(t, "Receiver "+name+" Ready at "+path, func() error {
		got := getObject(t, name, &notificationv1.Receiver{})
		if c := readyOf(got); c.Status != metav1.ConditionTrue || got.Status.WebhookPath != path {
			return fmt.Errorf("Ready %s %s %q, webhookPath %q", c.Status, c.Reason, c.Message, got.Status.WebhookPath)
		}
		return nil
	})
}
