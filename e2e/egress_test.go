package e2e

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/apis/acl"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// refusedByPolicy is the end of every message of an egress refusal: it
// names neither the address dialled nor what answered there.
const refusedByPolicy = "destination refused by the egress policy (-allowed-destinations)"

// TestEgressRefused is written as a tenant scanning through Headwater: an
// HTTPSource pointed at another tenant's artifact on the artifact-server,
// at the NATS server and at the metadata endpoint stalls with
// AccessDenied and a message that tells nothing of the destination; a
// Subscription whose sink is the metadata endpoint or the artifact-server
// gets nothing delivered and says so (DeliveryFailed, a dead letter at
// the first attempt); a Receiver whose Secret has an empty token is not
// made Ready (TokenNotFound, a Warning Event) rather than served
// unchecked. The victim's source stays Ready with the same artifact, and
// an HTTPSource of the attacker's own server beside them is served.
func TestEgressRefused(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const victim, team = "egress-victim", "e2e.headwater.dev/team"
	_, c := newRepo(t, victim, map[string]string{"secret.yaml": "kind: Secret # the victim's\n"})
	createSource(t, victim, env.Git.RepoURL(victim), branch)
	before := waitArtifact(t, victim, revision(c)).Status.Artifact.DeepCopy()

	// HTTPSources at Headwater's internals and the metadata endpoint.
	natsURL, err := url.Parse(env.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]string{
		"egress-artifact": before.URL,
		"egress-nats":     "http://" + natsURL.Host + "/connz",
		"egress-metadata": "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
	}
	for name, target := range targets {
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(httpSourceGVK)
		obj.SetNamespace(namespace)
		obj.SetName(name)
		obj.Object["spec"] = map[string]any{"url": target, "interval": "1h"}
		createObject(t, obj)
	}
	for name, target := range targets {
		u, _ := url.Parse(target)
		want := "failed to fetch " + u.Scheme + "://" + u.Host + u.Path + ": " + refusedByPolicy
		st := waitPlugin(t, httpSourceGVK, name, "refused", hasCondition(meta.ReadyCondition, metav1.ConditionFalse, acl.AccessDeniedReason))
		if c := apimeta.FindStatusCondition(st.Conditions, meta.ReadyCondition); c.Message != want {
			t.Errorf("%s: Ready message %q, want %q", name, c.Message, want)
		}
		if st.Artifact != nil {
			t.Errorf("%s: an artifact %+v from a refused destination", name, st.Artifact)
		}
		waitKindEvent(t, "HTTPSource", name, corev1.EventTypeWarning, acl.AccessDeniedReason, func(msg string) bool { return strings.HasSuffix(msg, refusedByPolicy) })
	}

	// Built-in sources at Headwater's internals, fetched by the fetcher
	// (whose every client of a tenant's URL dials through the policy): a
	// GitRepository at the NATS server's port, another at the victim's
	// artifact on the artifact-server, a HelmRepository at the
	// artifact-server. Each stalls at its first attempt (AccessDenied in
	// FetchFailed, Stalled, a Warning Event), not retried as a server that
	// is down, and the message ends in the policy's words.
	gitTargets := map[string]string{
		"egress-git-nats":     "http://" + natsURL.Host + "/tenant.git",
		"egress-git-artifact": before.URL,
	}
	for name, target := range gitTargets {
		createSource(t, name, target, branch)
	}
	createHelmRepository(t, "egress-helm-artifact", "http://"+env.ArtifactAddr+"/")
	for name := range gitTargets {
		got := waitCondition(t, name, meta.ReadyCondition, metav1.ConditionFalse, acl.AccessDeniedReason)
		checkRefusedConditions(t, "GitRepository "+name, got.Status.Conditions)
		if got.Status.Artifact != nil {
			t.Errorf("%s: an artifact %+v from a refused destination", name, got.Status.Artifact)
		}
		waitKubeEvent(t, name, corev1.EventTypeWarning, acl.AccessDeniedReason, func(msg string) bool { return strings.HasSuffix(msg, refusedByPolicy) })
	}
	helmRepo := waitConditionOf(t, "helmrepository egress-helm-artifact",
		func() *sourcev1.HelmRepository {
			return getObject(t, "egress-helm-artifact", &sourcev1.HelmRepository{})
		},
		meta.ReadyCondition, metav1.ConditionFalse, acl.AccessDeniedReason)
	checkRefusedConditions(t, "HelmRepository egress-helm-artifact", helmRepo.Status.Conditions)
	waitKindEvent(t, sourcev1.HelmRepositoryKind, "egress-helm-artifact", corev1.EventTypeWarning, acl.AccessDeniedReason,
		func(msg string) bool { return strings.HasSuffix(msg, refusedByPolicy) })

	// Subscriptions whose sinks are the metadata endpoint and the
	// artifact-server, selecting a source made after them.
	sinks := map[string]string{
		"egress-sink-metadata": "http://169.254.169.254/latest/meta-data/",
		"egress-sink-artifact": "http://" + env.ArtifactAddr + "/",
	}
	for name, sink := range sinks {
		createSubscription(t, &v1alpha1.Subscription{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.SubscriptionSpec{
				Sources: v1alpha1.SourceSelector{Namespaces: []string{namespace},
					LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{team: "egress-sink"}}},
				Types: []string{events.TypeArtifactStored},
				HTTP:  &v1alpha1.HTTPSink{URL: sink},
			},
		})
	}
	const trigger = "egress-sink-source"
	_, tc := newRepo(t, trigger, map[string]string{"README.md": "# " + trigger + "\n"})
	createSource(t, trigger, env.Git.RepoURL(trigger), branch, func(g *sourcev1.GitRepository) {
		g.Labels = map[string]string{team: "egress-sink"}
	})
	waitArtifact(t, trigger, revision(tc))
	for name := range sinks {
		sub := waitSubscription(t, name, metav1.ConditionFalse, v1alpha1.DeliveryFailedReason)
		dl := sub.Status.LastDeadLetter
		if dl == nil || dl.Attempts != 1 || !strings.HasSuffix(dl.Error, refusedByPolicy) {
			t.Errorf("%s: last dead letter %+v, want one attempt refused by the policy", name, dl)
		}
		if sub.Status.Delivered != 0 {
			t.Errorf("%s: %d delivered", name, sub.Status.Delivered)
		}
	}

	// A Receiver whose token is empty.
	createObject(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "egress-empty-token", Namespace: namespace},
		Data: map[string][]byte{"token": {}}})
	createObject(t, &notificationv1.Receiver{
		ObjectMeta: metav1.ObjectMeta{Name: "egress-empty-token", Namespace: namespace},
		Spec: notificationv1.ReceiverSpec{Type: notificationv1.GenericReceiver,
			SecretRef: &meta.LocalObjectReference{Name: "egress-empty-token"},
			Resources: []notificationv1.ReceiverResource{{CrossNamespaceObjectReference: notificationv1.CrossNamespaceObjectReference{Kind: sourcev1.GitRepositoryKind, Name: victim}}}},
	})
	wantMsg := fmt.Sprintf("invalid '%s/egress-empty-token' secret data: field 'token' is empty", namespace)
	eventually(t, "the Receiver with an empty token refused", func() error {
		got := getObject(t, "egress-empty-token", &notificationv1.Receiver{})
		c := readyOf(got)
		if c.Status != metav1.ConditionFalse || c.Reason != notificationv1.TokenNotFoundReason || c.Message != wantMsg || got.Status.WebhookPath != "" {
			return fmt.Errorf("Ready %s %s %q, webhookPath %q", c.Status, c.Reason, c.Message, got.Status.WebhookPath)
		}
		return nil
	})
	waitKindEvent(t, "Receiver", "egress-empty-token", corev1.EventTypeWarning, notificationv1.TokenNotFoundReason, func(msg string) bool { return msg == wantMsg })

	// The victim is untouched.
	now := getObject(t, victim, &sourcev1.GitRepository{})
	if !apimeta.IsStatusConditionTrue(now.Status.Conditions, meta.ReadyCondition) ||
		now.Status.Artifact.Digest != before.Digest || now.Status.Artifact.Revision != before.Revision {
		t.Errorf("victim after the attempts: %+v, want Ready with %s", now.Status, before.Digest)
	}
}

// checkRefusedConditions checks the conditions of a built-in source whose
// fetch the egress policy refused: FetchFailed and Stalled True and Ready
// False, each with reason AccessDenied and a message that ends in the
// policy's words and names nothing of what listens at the destination.
func checkRefusedConditions(t *testing.T, what string, conds []metav1.Condition) {
	t.Helper()
	for typ, status := range map[string]metav1.ConditionStatus{
		sourcev1.FetchFailedCondition: metav1.ConditionTrue,
		meta.StalledCondition:         metav1.ConditionTrue,
		meta.ReadyCondition:           metav1.ConditionFalse,
	} {
		c := apimeta.FindStatusCondition(conds, typ)
		if c == nil || c.Status != status || c.Reason != acl.AccessDeniedReason || !strings.HasSuffix(c.Message, refusedByPolicy) {
			t.Errorf("%s: %s %+v, want %s, AccessDenied, ending in the refusal", what, typ, c, status)
			continue
		}
		for _, told := range []string{"connection refused", "not found", "nats"} {
			if strings.Contains(strings.ToLower(c.Message), strings.ToLower(told)) {
				t.Errorf("%s: %s tells what answered (%q): %s", what, typ, told, c.Message)
			}
		}
	}
}
