package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/signature"
)

// replayWindow is the shared Env's receiver's -signature-tolerance: short
// enough for TestReplayRefused to outwait.
const replayWindow = 15 * time.Second

// capture is an HTTP sink that keeps the first signed delivery it gets,
// as an attacker on the path would, after checking it as a receiver does
// (signature.Verify, the code path of Headwater's receiver).
type capture struct {
	t   *testing.T
	key []byte

	mu     sync.Mutex
	header http.Header
	body   []byte
}

func (c *capture) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if _, err := signature.Verify(c.key, r.Header, body, time.Now(), replayWindow); err != nil {
		c.t.Errorf("the dispatcher's delivery does not verify: %v", err)
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	c.mu.Lock()
	if c.header == nil {
		c.header, c.body = r.Header.Clone(), body
	}
	c.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
}

// captured returns the delivery kept, waiting for one.
func (c *capture) captured(t *testing.T) (http.Header, []byte) {
	t.Helper()
	eventually(t, "a signed delivery captured", func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.header == nil {
			return errors.New("none yet")
		}
		return nil
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.header.Clone(), bytes.Clone(c.body)
}

// TestReplayRefused is written as an attacker who captured one of the
// dispatcher's signed deliveries to a sink that is also a Headwater
// generic-hmac Receiver's (the same key): replayed inside the window it is
// the same hook (its ce-id the hook's ID, stored once on the bus) and
// moves nothing again; replayed after the window it is refused (400), as
// is the same request with another ce-id at once; and a receiver's own
// check (signature.Verify, the receiver's code path) refuses it the same
// way. The Receiver's source moves once, on the genuine delivery.
func TestReplayRefused(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const (
		name   = "replay"
		target = "replay-target"
		source = "replay-source"
		team   = "e2e.headwater.dev/team"
	)
	key := []byte("e2e-replay-shared-key")
	createObject(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-hmac", Namespace: namespace},
		Data: map[string][]byte{v1alpha1.HMACKey: key}})
	createObject(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-token", Namespace: namespace},
		Data: map[string][]byte{"token": key}})

	// The Receiver's source, fetched only when a hook says so.
	repo, commitA := newRepo(t, target, map[string]string{"app.yaml": "version: a\n"})
	createSource(t, target, env.Git.RepoURL(target), branch, func(o *sourcev1.GitRepository) {
		o.Spec.Interval = metav1.Duration{Duration: time.Hour}
	})
	waitArtifact(t, target, revision(commitA))
	rcv := &notificationv1.Receiver{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: notificationv1.ReceiverSpec{
			Type:      notificationv1.GenericHMACReceiver,
			SecretRef: &meta.LocalObjectReference{Name: name + "-token"},
			Resources: []notificationv1.ReceiverResource{{CrossNamespaceObjectReference: notificationv1.CrossNamespaceObjectReference{
				Kind: sourcev1.GitRepositoryKind, Name: target}}},
		},
	}
	createObject(t, rcv)
	hookPath := rcv.GetWebhookPath(string(key))
	eventually(t, "the Receiver Ready", func() error {
		got := getObject(t, name, &notificationv1.Receiver{})
		if c := readyOf(got); c.Status != metav1.ConditionTrue || got.Status.WebhookPath != hookPath {
			return fmt.Errorf("Ready %s %q, webhookPath %q", c.Status, c.Message, got.Status.WebhookPath)
		}
		return nil
	})

	// A signed delivery, captured.
	sink := &capture{t: t, key: key}
	srv := httptest.NewServer(sink)
	t.Cleanup(srv.Close)
	createSubscription(t, &v1alpha1.Subscription{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.SubscriptionSpec{
			Sources: v1alpha1.SourceSelector{Namespaces: []string{namespace},
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{team: source}}},
			Types: []string{events.TypeArtifactStored},
			HTTP:  &v1alpha1.HTTPSink{URL: srv.URL, SecretRef: &meta.LocalObjectReference{Name: name + "-hmac"}},
		},
	})
	_, sc := newRepo(t, source, map[string]string{"README.md": "# " + source + "\n"})
	createSource(t, source, env.Git.RepoURL(source), branch, func(g *sourcev1.GitRepository) {
		g.Labels = map[string]string{team: source}
	})
	waitArtifact(t, source, revision(sc))
	header, body := sink.captured(t)

	post := func(h http.Header) int {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+env.ReceiverAddr+hookPath, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = h.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("post: %v", err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}

	// The genuine delivery, forwarded at once: the hook moves the source.
	commitB := commit(t, repo, map[string]string{"app.yaml": "version: b\n"}, "b")
	if code := post(header); code != http.StatusOK {
		t.Fatalf("the delivery inside the window: %d, want 200", code)
	}
	waitArtifact(t, target, revision(commitB))

	// Another ce-id on the captured signature: refused at once.
	forged := header.Clone()
	forged.Set("Ce-Id", "forged-"+forged.Get("Ce-Id"))
	if code := post(forged); code != http.StatusBadRequest {
		t.Errorf("the delivery with another ce-id: %d, want 400", code)
	}

	// Replays: the same hook while the window lasts (200, nothing new),
	// then refused.
	commitC := commit(t, repo, map[string]string{"app.yaml": "version: c\n"}, "c")
	replays := 0
	eventually(t, "the replay refused after the window", func() error {
		replays++
		if code := post(header); code != http.StatusBadRequest {
			return fmt.Errorf("replay %d answered %d", replays, code)
		}
		return nil
	})
	if replays < 2 {
		t.Errorf("the first replay, inside the window, was refused: the window is not %s", replayWindow)
	}
	if _, err := signature.Verify(key, header, body, time.Now(), replayWindow); !errors.Is(err, signature.ErrExpired) {
		t.Errorf("a receiver's own check of the replay: %v, want %v", err, signature.ErrExpired)
	}
	// No replay acted: the source is still at B although C is pushed.
	if a := get(t, target).Status.Artifact; a == nil || a.Revision != revision(commitB) {
		t.Errorf("the Receiver's source at %v after the replays, want %s (%s pushed, never hooked)", a, revision(commitB), commitC)
	}
}
