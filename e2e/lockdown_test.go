package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/apis/acl"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// lockdownUnpackLimit is the packager's -max-unpack-size in the lockdown
// Env: small, so the test's gzip bomb is a few KiB.
const lockdownUnpackLimit = 1 << 20

// startLockdownEnv starts an Env of the test's own whose watcher,
// packager and dispatcher refuse cross-namespace references, with a 1 MiB
// unpack limit.
func startLockdownEnv(t *testing.T) *privateEnv {
	t.Helper()
	return startPrivateEnv(t, "lockdown", func(cfg *harness.Config) {
		cfg.ExtraArgs[harness.Watcher] = append(cfg.ExtraArgs[harness.Watcher], "-no-cross-namespace-refs")
		cfg.ExtraArgs[harness.Packager] = append(cfg.ExtraArgs[harness.Packager],
			"-no-cross-namespace-refs", "-max-unpack-size", strconv.Itoa(lockdownUnpackLimit))
		cfg.ExtraArgs[harness.Dispatcher] = append(cfg.ExtraArgs[harness.Dispatcher], "-no-cross-namespace-refs")
	})
}

// zerosTgz is a gzip-compressed tarball holding one file of n zeros.
func zerosTgz(t *testing.T, n int) string {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(n)}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// waitGeneratorIn waits until the generator's Ready condition has status
// and reason in the Env, and returns the condition.
func (e *privateEnv) waitGeneratorIn(t *testing.T, key client.ObjectKey, status metav1.ConditionStatus, reason string) metav1.Condition {
	t.Helper()
	var ready metav1.Condition
	eventually(t, fmt.Sprintf("ArtifactGenerator %s Ready %s %s", key, status, reason), func() error {
		g := &swv1beta1.ArtifactGenerator{}
		if err := e.Client.Get(t.Context(), key, g); err != nil {
			return err
		}
		c := apimeta.FindStatusCondition(g.Status.Conditions, meta.ReadyCondition)
		if c == nil || c.Status != status || c.Reason != reason || c.ObservedGeneration != g.Generation {
			return fmt.Errorf("Ready = %+v", c)
		}
		ready = *c
		return nil
	})
	return ready
}

// TestLockdown is written as an attacker in namespace lockdown-a, with
// the lockdown on: an ArtifactGenerator naming the victim's GitRepository
// in another namespace is refused (AccessDenied, a Warning Event, no
// ExternalArtifact, nothing stored); a generator extracting a gzip bomb
// fails naming the limit; a Receiver naming the victim's source is
// refused (AccessDenied, Stalled, no webhook path, a Warning Event); a
// Subscription naming the victim's namespace is refused, and one naming
// none hears of the attacker's own source only; the victim's source
// stays Ready with the same artifact, and a plain generator of the
// victim's own namespace is served; a generator of the attacker's
// copying its own tree into many destinations fails naming the limit
// (lockdownCopies), and the victim's stay served.
func TestLockdown(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	e := startLockdownEnv(t)
	ctx := t.Context()
	const victim, attacker = "lockdown-victim", "lockdown-a"
	victimRepo, c := e.newRepo(t, victim, map[string]string{
		"apps/app/deploy.yaml": "kind: Deployment # the victim's\n",
		"bombs/zeros.tgz":      zerosTgz(t, 2*lockdownUnpackLimit),
	})
	e.createSource(t, victim, e.Git.RepoURL(victim))
	before := e.waitArtifact(t, victim, revision(c)).Status.Artifact.DeepCopy()
	if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: attacker}}); err != nil {
		t.Fatal(err)
	}

	// The cross-namespace generator.
	thief := &swv1beta1.ArtifactGenerator{
		ObjectMeta: metav1.ObjectMeta{Namespace: attacker, Name: "thief"},
		Spec: swv1beta1.ArtifactGeneratorSpec{
			Sources: []swv1beta1.SourceReference{{Alias: "b", Kind: sourcev1.GitRepositoryKind, Namespace: namespace, Name: victim}},
			OutputArtifacts: []swv1beta1.OutputArtifact{{Name: "loot",
				Copy: []swv1beta1.CopyOperation{{From: "@b/**", To: "@artifact/"}}}},
		},
	}
	if err := e.Client.Create(ctx, thief); err != nil {
		t.Fatal(err)
	}
	ready := e.waitGeneratorIn(t, client.ObjectKeyFromObject(thief), metav1.ConditionFalse, swv1beta1.AccessDeniedReason)
	if want := "cross-namespace reference to source GitRepository/" + namespace + "/" + victim + " is not allowed"; ready.Message != want {
		t.Errorf("Ready message %q, want %q", ready.Message, want)
	}
	eventually(t, "a Warning Event AccessDenied on the thief", func() error {
		var list corev1.EventList
		if err := e.Client.List(ctx, &list, client.InNamespace(attacker)); err != nil {
			return err
		}
		for _, ev := range list.Items {
			if ev.InvolvedObject.Name == "thief" && ev.Type == corev1.EventTypeWarning && ev.Reason == swv1beta1.AccessDeniedReason {
				return nil
			}
		}
		return fmt.Errorf("no such Event among %d", len(list.Items))
	})
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: attacker, Name: "loot"}, &sourcev1.ExternalArtifact{}); !apierrors.IsNotFound(err) {
		t.Errorf("ExternalArtifact loot: %v, want not found", err)
	}

	// The bomb, in the victim's own namespace: it fails naming the
	// limit, and a plain generator beside it is served.
	bomb := &swv1beta1.ArtifactGenerator{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "lockdown-bomb"},
		Spec: swv1beta1.ArtifactGeneratorSpec{
			Sources: []swv1beta1.SourceReference{{Alias: "repo", Kind: sourcev1.GitRepositoryKind, Name: victim}},
			OutputArtifacts: []swv1beta1.OutputArtifact{{Name: "lockdown-bomb-out",
				Copy: []swv1beta1.CopyOperation{{From: "@repo/bombs/zeros.tgz", To: "@artifact/", Strategy: swv1beta1.ExtractStrategy}}}},
		},
	}
	plain := &swv1beta1.ArtifactGenerator{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "lockdown-plain"},
		Spec: swv1beta1.ArtifactGeneratorSpec{
			Sources: []swv1beta1.SourceReference{{Alias: "repo", Kind: sourcev1.GitRepositoryKind, Name: victim}},
			OutputArtifacts: []swv1beta1.OutputArtifact{{Name: "lockdown-plain-out",
				Copy: []swv1beta1.CopyOperation{{From: "@repo/apps/app/**", To: "@artifact/"}}}},
		},
	}
	for _, g := range []*swv1beta1.ArtifactGenerator{bomb, plain} {
		if err := e.Client.Create(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	ready = e.waitGeneratorIn(t, client.ObjectKeyFromObject(bomb), metav1.ConditionFalse, meta.BuildFailedReason)
	if !strings.Contains(ready.Message, "extracted size exceeds the limit of 1 MiB") {
		t.Errorf("bomb: Ready message %q, want the limit named", ready.Message)
	}
	e.waitGeneratorIn(t, client.ObjectKeyFromObject(plain), metav1.ConditionTrue, meta.SucceededReason)

	// A Receiver of the attacker's naming the victim's source: refused,
	// so no hook of it moves the victim.
	if err := e.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: attacker, Name: "hook-token"},
		StringData: map[string]string{"token": "attacker's own token"}}); err != nil {
		t.Fatal(err)
	}
	hook := &notificationv1.Receiver{
		ObjectMeta: metav1.ObjectMeta{Namespace: attacker, Name: "poke"},
		Spec: notificationv1.ReceiverSpec{Type: notificationv1.GenericReceiver,
			SecretRef: &meta.LocalObjectReference{Name: "hook-token"},
			Resources: []notificationv1.ReceiverResource{{CrossNamespaceObjectReference: notificationv1.CrossNamespaceObjectReference{
				Kind: sourcev1.GitRepositoryKind, Name: victim, Namespace: namespace}}}},
	}
	if err := e.Client.Create(ctx, hook); err != nil {
		t.Fatal(err)
	}
	hookMsg := "can't access '" + sourcev1.GitRepositoryKind + "/" + namespace + "/" + victim + "', cross-namespace references are not allowed"
	eventually(t, "the cross-namespace Receiver refused", func() error {
		got := &notificationv1.Receiver{}
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(hook), got); err != nil {
			return err
		}
		ready := apimeta.FindStatusCondition(got.Status.Conditions, meta.ReadyCondition)
		if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != acl.AccessDeniedReason || ready.Message != hookMsg ||
			!apimeta.IsStatusConditionTrue(got.Status.Conditions, meta.StalledCondition) || got.Status.WebhookPath != "" {
			return fmt.Errorf("Ready %+v, Stalled %v, webhookPath %q", ready,
				apimeta.IsStatusConditionTrue(got.Status.Conditions, meta.StalledCondition), got.Status.WebhookPath)
		}
		return nil
	})
	e.waitWarning(t, attacker, hook.Name, acl.AccessDeniedReason, hookMsg)

	// Subscriptions of the attacker's: one naming the victim's namespace
	// is refused; one naming none sees the attacker's namespace only.
	listen, listenURL := newSink(t, nil, http.StatusOK)
	snoop := &v1alpha1.Subscription{
		ObjectMeta: metav1.ObjectMeta{Namespace: attacker, Name: "snoop"},
		Spec: v1alpha1.SubscriptionSpec{Sources: v1alpha1.SourceSelector{Namespaces: []string{namespace}},
			HTTP: &v1alpha1.HTTPSink{URL: listenURL}},
	}
	own := &v1alpha1.Subscription{
		ObjectMeta: metav1.ObjectMeta{Namespace: attacker, Name: "listen"},
		Spec:       v1alpha1.SubscriptionSpec{HTTP: &v1alpha1.HTTPSink{URL: listenURL}},
	}
	for _, sub := range []*v1alpha1.Subscription{snoop, own} {
		if err := e.Client.Create(ctx, sub); err != nil {
			t.Fatal(err)
		}
	}
	snoopMsg := "subscription '" + attacker + "/snoop' can't select events from namespace '" + namespace + "', cross-namespace references have been blocked"
	for sub, want := range map[*v1alpha1.Subscription][2]string{snoop: {acl.AccessDeniedReason, snoopMsg}, own: {v1alpha1.SucceededReason, ""}} {
		eventually(t, "Subscription "+sub.Name+" "+want[0], func() error {
			got := &v1alpha1.Subscription{}
			if err := e.Client.Get(ctx, client.ObjectKeyFromObject(sub), got); err != nil {
				return err
			}
			c := apimeta.FindStatusCondition(got.Status.Conditions, v1alpha1.ReadyCondition)
			if c == nil || c.Reason != want[0] || want[1] != "" && c.Message != want[1] {
				return fmt.Errorf("Ready %+v", c)
			}
			return nil
		})
	}

	// The victim is untouched.
	now := e.get(t, victim)
	if !apimeta.IsStatusConditionTrue(now.Status.Conditions, meta.ReadyCondition) ||
		now.Status.Artifact.Digest != before.Digest || now.Status.Artifact.Revision != before.Revision {
		t.Errorf("victim after the attacks: %+v, want Ready with %s", now.Status, before.Digest)
	}

	// A new commit of the victim's, then a source of the attacker's own:
	// the attacker's sink hears of its own source, never of the victim's.
	c2 := commit(t, victimRepo, map[string]string{"apps/app/deploy.yaml": "kind: Deployment # the victim's, v2\n"}, "v2")
	e.requestReconcile(t, victim)
	e.waitArtifact(t, victim, revision(c2))
	e.newRepo(t, "lockdown-a-own", map[string]string{"README.md": "# the attacker's\n"})
	mine := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Namespace: attacker, Name: "mine"},
		Spec: sourcev1.GitRepositorySpec{URL: e.Git.RepoURL("lockdown-a-own"), Interval: metav1.Duration{Duration: time.Hour},
			Reference: &sourcev1.GitRepositoryRef{Branch: branch}},
	}
	if err := e.Client.Create(ctx, mine); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the attacker's sink hears of its own source", func() error {
		for _, ev := range listen.events() {
			if ev.Subject() == "gitrepository/"+attacker+"/mine" && ev.Type() == events.TypeArtifactStored {
				return nil
			}
		}
		return fmt.Errorf("%d events received", len(listen.events()))
	})
	for _, ev := range listen.events() {
		if !strings.HasPrefix(ev.Subject(), "gitrepository/"+attacker+"/") {
			t.Errorf("the attacker's sink received %s about %s", ev.Type(), ev.Subject())
		}
	}

	lockdownCopies(t, e, attacker)
	now = e.get(t, victim)
	if !apimeta.IsStatusConditionTrue(now.Status.Conditions, meta.ReadyCondition) || now.Status.Artifact.Revision != revision(c2) {
		t.Errorf("victim after the copies: %+v, want Ready with %s", now.Status, revision(c2))
	}
	e.waitGeneratorIn(t, client.ObjectKeyFromObject(plain), metav1.ConditionTrue, meta.SucceededReason)
}

// lockdownCopies is the attacker's generator of TestLockdown that copies
// its own tree (256 KiB) into many destinations: two copies are served;
// two hundred (50 MiB if written) fail BuildFailed naming the limit and
// its flag, with a Warning Event, and the output keeps its artifact.
func lockdownCopies(t *testing.T, e *privateEnv, ns string) {
	t.Helper()
	ctx := t.Context()
	files := map[string]string{}
	for i := range 8 {
		files[fmt.Sprintf("base/f%d.yaml", i)] = strings.Repeat(fmt.Sprintf("# line %d\n", i), 32<<10/9)
	}
	e.newRepo(t, "lockdown-a-tree", files)
	tree := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tree"},
		Spec: sourcev1.GitRepositorySpec{URL: e.Git.RepoURL("lockdown-a-tree"), Interval: metav1.Duration{Duration: time.Hour},
			Reference: &sourcev1.GitRepositoryRef{Branch: branch}},
	}
	if err := e.Client.Create(ctx, tree); err != nil {
		t.Fatal(err)
	}
	copies := func(n int) []swv1beta1.CopyOperation {
		var ops []swv1beta1.CopyOperation
		for i := range n {
			ops = append(ops, swv1beta1.CopyOperation{From: "@repo/base/**", To: fmt.Sprintf("@artifact/env-%d/", i)})
		}
		return ops
	}
	copier := &swv1beta1.ArtifactGenerator{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "copier"},
		Spec: swv1beta1.ArtifactGeneratorSpec{
			Sources:         []swv1beta1.SourceReference{{Alias: "repo", Kind: sourcev1.GitRepositoryKind, Name: "tree"}},
			OutputArtifacts: []swv1beta1.OutputArtifact{{Name: "copies", Copy: copies(2)}},
		},
	}
	if err := e.Client.Create(ctx, copier); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(copier)
	e.waitGeneratorIn(t, key, metav1.ConditionTrue, meta.SucceededReason)
	out := &sourcev1.ExternalArtifact{}
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "copies"}, out); err != nil || out.Status.Artifact == nil {
		t.Fatalf("ExternalArtifact copies: %v %+v", err, out.Status)
	}
	before := out.Status.Artifact.DeepCopy()

	if err := e.Client.Get(ctx, key, copier); err != nil {
		t.Fatal(err)
	}
	copier.Spec.OutputArtifacts[0].Copy = copies(200)
	if err := e.Client.Update(ctx, copier); err != nil {
		t.Fatal(err)
	}
	const limit = "copied size exceeds the limit of 1 MiB (-max-unpack-size)"
	ready := e.waitGeneratorIn(t, key, metav1.ConditionFalse, meta.BuildFailedReason)
	if !strings.Contains(ready.Message, limit) {
		t.Errorf("copier: Ready message %q, want %q", ready.Message, limit)
	}
	e.waitWarning(t, ns, copier.Name, meta.BuildFailedReason, limit)
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "copies"}, out); err != nil {
		t.Fatal(err)
	}
	if a := out.Status.Artifact; a == nil || a.Digest != before.Digest || a.Revision != before.Revision {
		t.Errorf("ExternalArtifact copies after the failure: %+v, want %+v kept", a, before)
	}
}
