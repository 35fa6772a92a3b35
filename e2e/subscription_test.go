package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// sink is an HTTP endpoint as a subscriber writes one: it checks each
// request's HMAC signature, reads the CloudEvent with sdk-go and answers
// with status.
type sink struct {
	t      *testing.T
	key    []byte
	status int

	mu       sync.Mutex
	received []cloudevents.Event
	attempts int
}

func newSink(t *testing.T, key []byte, status int) (*sink, string) {
	s := &sink{t: t, key: key, status: status}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv.URL
}

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.attempts++
	s.mu.Unlock()
	if s.status != http.StatusOK {
		w.WriteHeader(s.status)
		return
	}
	// What a receiver does: recompute the HMAC of the body and compare.
	// A Subscription without a Secret sends no signature.
	want := ""
	if s.key != nil {
		mac := hmac.New(sha256.New, s.key)
		mac.Write(body)
		want = "sha256=" + hex.EncodeToString(mac.Sum(nil))
	}
	if got := r.Header.Get(v1alpha1.SignatureHeader); !hmac.Equal([]byte(got), []byte(want)) {
		s.t.Errorf("signature %q, want %q", got, want)
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	e, err := binding.ToEvent(r.Context(), cehttp.NewMessageFromHttpRequest(r))
	if err != nil {
		s.t.Errorf("not a CloudEvent: %v", err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := e.Validate(); err != nil {
		s.t.Errorf("invalid CloudEvent: %v", err)
	}
	s.mu.Lock()
	s.received = append(s.received, *e)
	s.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
}

// events returns the events received so far.
func (s *sink) events() []cloudevents.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.received)
}

// of returns the events received about the GitRepository name.
func (s *sink) of(name string) []cloudevents.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []cloudevents.Event
	for _, e := range s.received {
		if e.Subject() == "gitrepository/"+namespace+"/"+name {
			out = append(out, e)
		}
	}
	return out
}

// waitStored waits for the sink to receive the artifact.stored event of
// name for revision rev.
func (s *sink) waitStored(t *testing.T, name, rev string) {
	t.Helper()
	eventually(t, "artifact.stored of "+name+" at the sink", func() error {
		for _, e := range s.of(name) {
			var out events.Outcome
			if err := e.DataAs(&out); err != nil {
				return err
			}
			if e.Type() == events.TypeArtifactStored && out.Artifact != nil && out.Artifact.Revision == rev {
				return nil
			}
		}
		return fmt.Errorf("received %d events of %s", len(s.of(name)), name)
	})
}

// createSubscription creates sub and waits for the watcher to report it
// Ready (the dispatcher's first report: its consumer exists, so no event
// published from then on is missed).
func createSubscription(t *testing.T, sub *v1alpha1.Subscription) {
	t.Helper()
	sub.Namespace = namespace
	createObject(t, sub)
	waitSubscription(t, sub.Name, metav1.ConditionTrue, v1alpha1.SucceededReason)
}

func waitSubscription(t *testing.T, name string, status metav1.ConditionStatus, reason string) *v1alpha1.Subscription {
	t.Helper()
	var sub *v1alpha1.Subscription
	eventually(t, "subscription "+name+" Ready="+string(status)+" "+reason, func() error {
		sub = getObject(t, name, &v1alpha1.Subscription{})
		c := apimeta.FindStatusCondition(sub.Status.Conditions, v1alpha1.ReadyCondition)
		if c == nil || c.Status != status || c.Reason != reason {
			return fmt.Errorf("ready %+v", c)
		}
		return nil
	})
	return sub
}

// TestSubscriptionHTTP: a Subscription selecting sources by label receives
// artifact.stored of a matching source, signed, in the CloudEvents HTTP
// binding, and nothing of a source without the label.
func TestSubscriptionHTTP(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name, other = "sub-http", "sub-http-other"
	key := []byte("e2e-hmac-key-of-sub-http")
	createObject(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-hmac", Namespace: namespace},
		Data: map[string][]byte{v1alpha1.HMACKey: key}})
	s, url := newSink(t, key, http.StatusOK)
	createSubscription(t, &v1alpha1.Subscription{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.SubscriptionSpec{
			Sources: v1alpha1.SourceSelector{
				Namespaces:    []string{namespace},
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"e2e.headwater.dev/team": name}},
			},
			Types: []string{events.TypeArtifactStored},
			HTTP:  &v1alpha1.HTTPSink{URL: url, SecretRef: &meta.LocalObjectReference{Name: name + "-hmac"}},
		},
	})

	// The other source's event comes first on the stream: by the time the
	// matching one arrives, the other's has been looked at and skipped.
	_, otherCommit := newRepo(t, other, map[string]string{"README.md": "# " + other + "\n"})
	createSource(t, other, env.Git.RepoURL(other), branch)
	waitArtifact(t, other, revision(otherCommit))
	_, c := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch, func(g *sourcev1.GitRepository) {
		g.Labels = map[string]string{"e2e.headwater.dev/team": name}
	})
	waitArtifact(t, name, revision(c))
	s.waitStored(t, name, revision(c))
	if got := s.of(other); len(got) != 0 {
		t.Errorf("the sink received %d events of %s, which has no matching label", len(got), other)
	}
	eventually(t, "the delivery in the subscription's status", func() error {
		st := getObject(t, name, &v1alpha1.Subscription{}).Status
		if st.Delivered < 1 || st.LastDeliveredTime == nil {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
}

// TestSubscriptionDeadLetter: a sink that answers 500 forever ends in a
// dead letter, visible in the Subscription's status and the dispatcher's
// metrics, while a second Subscription's healthy sink receives the same
// events.
func TestSubscriptionDeadLetter(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "sub-dead"
	dead, deadURL := newSink(t, nil, http.StatusInternalServerError)
	healthy, healthyURL := newSink(t, nil, http.StatusOK)
	sources := v1alpha1.SourceSelector{Kinds: []string{sourcev1.GitRepositoryKind}, Namespaces: []string{namespace}, Names: []string{name}}
	createSubscription(t, &v1alpha1.Subscription{ObjectMeta: metav1.ObjectMeta{Name: name + "-broken"},
		Spec: v1alpha1.SubscriptionSpec{Sources: sources, HTTP: &v1alpha1.HTTPSink{URL: deadURL, MaxAttempts: 2}}})
	createSubscription(t, &v1alpha1.Subscription{ObjectMeta: metav1.ObjectMeta{Name: name + "-healthy"},
		Spec: v1alpha1.SubscriptionSpec{Sources: sources, HTTP: &v1alpha1.HTTPSink{URL: healthyURL, MaxAttempts: 2}}})

	_, c := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	waitArtifact(t, name, revision(c))
	healthy.waitStored(t, name, revision(c))

	sub := waitSubscription(t, name+"-broken", metav1.ConditionFalse, v1alpha1.DeliveryFailedReason)
	dl := sub.Status.LastDeadLetter
	if sub.Status.DeadLetters < 1 || dl == nil || dl.EventType != events.TypeArtifactStored ||
		dl.Subject != "gitrepository/"+namespace+"/"+name || dl.Attempts != 2 || !strings.Contains(dl.Error, "500") {
		t.Errorf("dead letter in status: %d, %+v", sub.Status.DeadLetters, dl)
	}
	if sub.Status.FailedAttempts < 2 {
		t.Errorf("failed attempts %d, want at least 2", sub.Status.FailedAttempts)
	}
	dead.mu.Lock()
	if dead.attempts < 2 {
		t.Errorf("the broken sink saw %d attempts, want at least 2", dead.attempts)
	}
	dead.mu.Unlock()
	waitSubscription(t, name+"-healthy", metav1.ConditionTrue, v1alpha1.SucceededReason)

	metric := fmt.Sprintf(`headwater_subscription_dead_letters_total{namespace=%q,subscription=%q}`, namespace, name+"-broken")
	eventually(t, "the dead letter in the dispatcher's metrics", func() error {
		code, body := httpGet(t, "http://"+env.Service(harness.Dispatcher).TelemetryAddr+"/metrics")
		if code != http.StatusOK {
			return fmt.Errorf("metrics: HTTP %d", code)
		}
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, metric+" ") && !strings.HasSuffix(l, " 0") {
				return nil
			}
		}
		return fmt.Errorf("no %s in the metrics", metric)
	})
}

// TestSubscriptionNATS: a `nats` Subscription's durable consumer holds the
// events of the sources it selects, for the subscriber identity to pull.
func TestSubscriptionNATS(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "sub-nats"
	consumer := "e2e-" + name
	createSubscription(t, &v1alpha1.Subscription{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.SubscriptionSpec{
			Sources: v1alpha1.SourceSelector{Names: []string{name}},
			NATS:    &v1alpha1.NATSSink{Consumer: consumer},
		}})
	_, c := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	waitArtifact(t, name, revision(c))

	nc, err := nats.Connect(env.NATSURL, subscriberAuth(env), nats.CustomInboxPrefix(events.InboxPrefix(events.SubscriberIdentity)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cons, err := js.Consumer(ctx, events.SubscriptionStream, consumer)
	if err != nil {
		t.Fatalf("the subscriber looks up its consumer: %v", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err == nil {
			m, derr := events.Decode(msg.Data())
			if derr != nil {
				t.Fatalf("decode: %v", derr)
			}
			if err := msg.Ack(); err != nil {
				t.Errorf("the subscriber acknowledges: %v", err)
			}
			o := m.Data.(*events.Outcome)
			if o.Job.Object.Name != name {
				t.Fatalf("the consumer holds an event of %s, which the subscription does not select", o.Job.Object.Name)
			}
			if m.Event.Type() == events.TypeArtifactStored && o.Artifact != nil && o.Artifact.Revision == revision(c) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no artifact.stored of %s in consumer %s: %v", name, consumer, err)
		}
	}
}

// TestSubscriptionProblems: what keeps the dispatcher from serving a
// Subscription shows in its Ready condition, and fixing it makes it Ready.
func TestSubscriptionProblems(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "sub-problems"
	key := []byte("k")
	// Once served, it receives every public event, signed.
	_, url := newSink(t, key, http.StatusOK)
	sub := &v1alpha1.Subscription{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: v1alpha1.SubscriptionSpec{HTTP: &v1alpha1.HTTPSink{URL: url, SecretRef: &meta.LocalObjectReference{Name: name + "-hmac"}}}}
	createObject(t, sub)
	got := waitSubscription(t, name, metav1.ConditionFalse, v1alpha1.SecretNotFoundReason)
	if c := apimeta.FindStatusCondition(got.Status.Conditions, v1alpha1.ReadyCondition); !strings.Contains(c.Message, name+"-hmac") {
		t.Errorf("Ready message %q does not name the Secret", c.Message)
	}

	createObject(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-hmac", Namespace: namespace},
		Data: map[string][]byte{v1alpha1.HMACKey: key}})
	patchObject(t, getObject(t, name, &v1alpha1.Subscription{}), func(s *v1alpha1.Subscription) {
		s.Spec.Types = []string{events.TypeFetchRequested} // not a public type
	})
	waitSubscription(t, name, metav1.ConditionFalse, v1alpha1.InvalidSpecReason)

	patchObject(t, getObject(t, name, &v1alpha1.Subscription{}), func(s *v1alpha1.Subscription) {
		s.Spec.Types = nil
	})
	got = waitSubscription(t, name, metav1.ConditionTrue, v1alpha1.SucceededReason)
	if got.Status.ObservedGeneration != got.Generation {
		t.Errorf("observed generation %d, want %d", got.Status.ObservedGeneration, got.Generation)
	}
}
