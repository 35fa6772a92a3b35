package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// hookFlood is more requests than the shared Env's receiver lets one
// Receiver make at once (-hook-burst, 50 by default).
const hookFlood = 400

// TestHookFlood is written as an attacker who floods the webhook path of
// a Receiver (a leaked token, or a tenant's own): past the burst the
// receiver answers 429, and a victim's Receiver, rate-limited on its own,
// still accepts its hook at once and its source fetches the pushed
// commit; every service keeps running.
func TestHookFlood(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const victim = "hookflood-victim"
	repo, c1 := newRepo(t, victim, map[string]string{"app.yaml": "version: 1\n"})
	createSource(t, victim, env.Git.RepoURL(victim), branch, func(o *sourcev1.GitRepository) {
		o.Spec.Interval = metav1.Duration{Duration: time.Hour}
	})
	waitArtifact(t, victim, revision(c1))

	// The attacker's Receiver names a source that is not there: its
	// hooks move nothing, and cost only the receiver's work.
	paths := map[string]string{}
	for name, target := range map[string]string{"hookflood-attacker": "hookflood-nothing", "hookflood-victim": victim} {
		token := "token of " + name
		createObject(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			StringData: map[string]string{"token": token}})
		rcv := &notificationv1.Receiver{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec: notificationv1.ReceiverSpec{Type: notificationv1.GenericReceiver,
				SecretRef: &meta.LocalObjectReference{Name: name},
				Resources: []notificationv1.ReceiverResource{{CrossNamespaceObjectReference: notificationv1.CrossNamespaceObjectReference{
					Kind: sourcev1.GitRepositoryKind, Name: target}}}},
		}
		createObject(t, rcv)
		paths[name] = rcv.GetWebhookPath(token)
		eventually(t, "Receiver "+name+" Ready", func() error {
			got := getObject(t, name, &notificationv1.Receiver{})
			if c := readyOf(got); c.Status != metav1.ConditionTrue || got.Status.WebhookPath != paths[name] {
				return fmt.Errorf("Ready %s %s %q, webhookPath %q", c.Status, c.Reason, c.Message, got.Status.WebhookPath)
			}
			return nil
		})
	}

	// The flood, all at once.
	codes := make(chan int, hookFlood)
	var wg sync.WaitGroup
	for range hookFlood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes <- postGeneric(t, "http://"+env.ReceiverAddr+paths["hookflood-attacker"])
		}()
	}
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for code := range codes {
		count[code]++
	}
	t.Logf("the flood's answers: %v", count)
	if count[http.StatusTooManyRequests] == 0 || count[http.StatusOK] == 0 || count[http.StatusOK] > hookFlood-count[http.StatusTooManyRequests] {
		t.Errorf("the flood's answers %v, want 200 up to the burst and 429 past it", count)
	}
	if n := count[http.StatusOK] + count[http.StatusTooManyRequests]; n != hookFlood {
		t.Errorf("the flood's answers %v: %d of %d are neither 200 nor 429", count, hookFlood-n, hookFlood)
	}

	// The victim's Receiver is not held by the attacker's limit.
	c2 := commit(t, repo, map[string]string{"app.yaml": "version: 2\n"}, "v2")
	if code := postGeneric(t, "http://"+env.ReceiverAddr+paths["hookflood-victim"]); code != http.StatusOK {
		t.Fatalf("the victim's hook during the flood: %d, want 200", code)
	}
	waitArtifact(t, victim, revision(c2))
	requireServicesRunning(t)
}

// postGeneric POSTs an empty JSON object to a generic Receiver's url and
// returns the status code.
func postGeneric(t *testing.T, url string) int {
	resp, err := http.Post(url, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Errorf("post %s: %v", url, err)
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}
