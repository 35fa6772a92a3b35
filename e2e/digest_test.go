package e2e

import (
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"regexp"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/events"
)

var sha512Pattern = regexp.MustCompile(`^sha512:[0-9a-f]{128}$`)

// startDigestEnv starts a second Env, with directory storage of its own,
// whose packager digests artifacts with sha512; it stops when the test
// ends. The private Env's helpers (newRepo, createSource, waitArtifact, ...)
// work on it: they touch only the Env and its recorder.
func startDigestEnv(t *testing.T) *privateEnv {
	t.Helper()
	return startPrivateEnv(t, "sha512", func(cfg *harness.Config) {
		cfg.ExtraArgs[harness.Packager] = append(cfg.ExtraArgs[harness.Packager], "-artifact-digest-algo", "sha512")
	})
}

// TestArtifactDigestAlgo checks the packager's -artifact-digest-algo
// sha512: status.artifact.digest is "sha512:<hex>", the sha512 of the
// downloaded file, and a reconcile with nothing new verifies the stored
// artifact against it without finding fault.
func TestArtifactDigestAlgo(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	e := startDigestEnv(t)
	const name = "digest-sha512"
	repo, c := e.newRepo(t, name, map[string]string{"deploy/app.yaml": "kind: App\n"})
	e.createSource(t, name, e.Git.RepoURL(name))
	obj := e.waitArtifact(t, name, revision(c))

	a := obj.Status.Artifact
	if !sha512Pattern.MatchString(a.Digest) {
		t.Fatalf("artifact digest %q, want sha512:<hex>", a.Digest)
	}
	body := download(t, a.URL)
	sum := sha512.Sum512(body)
	if got := "sha512:" + hex.EncodeToString(sum[:]); got != a.Digest {
		t.Errorf("downloaded artifact has digest %s, status says %s", got, a.Digest)
	}
	if d := diffTrees(untarArtifact(t, body), treeAt(t, repo, c)); d != "" {
		t.Errorf("artifact is not the tree at %s: %s", c, d)
	}
	stored := e.waitCloudEvent(t, name, events.TypeArtifactStored, nil)
	if got := stored.outcome().Artifact; got == nil || got.Digest != a.Digest {
		t.Errorf("CloudEvent artifact %+v, want digest %s", got, a.Digest)
	}

	// Nothing new: the stored artifact verifies against its sha512 digest.
	token := e.requestReconcile(t, name)
	e.waitCloudEvent(t, name, events.TypeArtifactUnchanged, func(o *events.Outcome) bool {
		return o.Job.ReconcileToken == token && o.Artifact != nil && o.Artifact.Digest == a.Digest
	})
	eventually(t, "lastHandledReconcileAt "+token, func() error {
		if got := e.get(t, name).Status.LastHandledReconcileAt; got != token {
			return fmt.Errorf("lastHandledReconcileAt %q", got)
		}
		return nil
	})
	now := e.get(t, name)
	if got := now.Status.Artifact; got.Digest != a.Digest || !got.LastUpdateTime.Equal(&a.LastUpdateTime) {
		t.Errorf("artifact after a reconcile with nothing new %+v, want %+v", got, a)
	}
	var list corev1.EventList
	if err := e.Client.List(t.Context(), &list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	for _, ev := range list.Items {
		if ev.InvolvedObject.Name == name && ev.Type == corev1.EventTypeWarning {
			t.Errorf("Warning Event %s: %s", ev.Reason, ev.Message)
		}
	}
	if c := apimeta.FindStatusCondition(now.Status.Conditions, meta.ReadyCondition); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Ready condition %+v, want True", c)
	}
}
