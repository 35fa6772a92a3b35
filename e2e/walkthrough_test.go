package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
)

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// TestWalkthrough is the Flux GitRepository walkthrough of the issue, checked
// field by field: apply, Ready with an artifact, download it, a CloudEvent
// and a Kubernetes Event; a new commit plus requestedAt gives a new
// artifact; requestedAt with nothing new keeps the artifact and says so.
func TestWalkthrough(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "podinfo"
	repo, commit1 := newRepo(t, name, sampleFiles(t))
	createSource(t, name, env.Git.RepoURL(name), branch)

	obj := waitArtifact(t, name, revision(commit1))
	checkStored(t, obj, commit1)

	t.Run("finalizer and defaults", func(t *testing.T) {
		if !slices.Contains(obj.Finalizers, sourcev1.SourceFinalizer) {
			t.Errorf("finalizers %v, want %s", obj.Finalizers, sourcev1.SourceFinalizer)
		}
		if obj.Spec.Timeout == nil || obj.Spec.Timeout.Duration != 60*time.Second {
			t.Errorf("spec.timeout %v, want 60s", obj.Spec.Timeout)
		}
	})

	t.Run("kubectl get gitrepository", func(t *testing.T) {
		out, err := env.Kubectl(t.Context(), "get", "gitrepository", name, "-n", namespace)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("kubectl get gitrepository %s:\n%s", name, out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			t.Fatalf("kubectl get printed %d lines, want a header and one row:\n%s", len(lines), out)
		}
		if got, want := strings.Fields(lines[0]), []string{"NAME", "URL", "AGE", "READY", "STATUS"}; !slices.Equal(got, want) {
			t.Errorf("columns %v, want %v", got, want)
		}
		row := strings.Fields(lines[1])
		if len(row) < 5 || row[0] != name || row[1] != env.Git.RepoURL(name) || row[3] != "True" {
			t.Errorf("row %q, want name %s, url %s, ready True", lines[1], name, env.Git.RepoURL(name))
		}
		if want := storedMessage(commit1); !strings.HasSuffix(lines[1], want) {
			t.Errorf("row %q, want status %q", lines[1], want)
		}
	})

	t.Run("artifact download", func(t *testing.T) {
		body := download(t, obj.Status.Artifact.URL)
		t.Logf("downloaded %s: %d bytes, %s", obj.Status.Artifact.URL, len(body), sha256Digest(body))
		if got := sha256Digest(body); got != obj.Status.Artifact.Digest {
			t.Errorf("downloaded artifact has digest %s, status says %s", got, obj.Status.Artifact.Digest)
		}
		if obj.Status.Artifact.Size != nil && int64(len(body)) != *obj.Status.Artifact.Size {
			t.Errorf("downloaded %d bytes, status says size %d", len(body), *obj.Status.Artifact.Size)
		}
		if d := diffTrees(untarArtifact(t, body), treeAt(t, repo, commit1)); d != "" {
			t.Errorf("artifact is not the tree at %s: %s", commit1, d)
		}
		latest := download(t, env.ArtifactURL("gitrepository/default/podinfo/latest.tar.gz"))
		if sha256Digest(latest) != obj.Status.Artifact.Digest {
			t.Errorf("latest.tar.gz has digest %s, want %s", sha256Digest(latest), obj.Status.Artifact.Digest)
		}
	})

	t.Run("CloudEvent on NATS", func(t *testing.T) {
		e := recorder.wait(t, name, events.TypeArtifactStored, func(o *events.Outcome) bool {
			return o.Artifact != nil && o.Artifact.Digest == obj.Status.Artifact.Digest
		})
		o := e.outcome()
		if e.msg.Event.Subject() != "gitrepository/default/podinfo" {
			t.Errorf("CloudEvent subject %q, want gitrepository/default/podinfo", e.msg.Event.Subject())
		}
		if o.Artifact.URL != obj.Status.Artifact.URL || o.Artifact.Revision != obj.Status.Artifact.Revision || o.Revision != obj.Status.Artifact.Revision {
			t.Errorf("CloudEvent artifact url %s revision %s (outcome revision %s), want %s %s",
				o.Artifact.URL, o.Artifact.Revision, o.Revision, obj.Status.Artifact.URL, obj.Status.Artifact.Revision)
		}
	})

	t.Run("Kubernetes Event NewArtifact", func(t *testing.T) {
		e := waitKubeEvent(t, name, "Normal", "NewArtifact", nil)
		t.Logf("Event %s %s: %s", e.Type, e.Reason, e.Message)
	})

	// A new commit and a reconcile request: a new artifact.
	files := map[string]string{
		"README.md":                "# podinfo\n\nNow with a ConfigMap.\n",
		"kustomize/configmap.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: podinfo\ndata:\n  color: blue\n",
	}
	commit2 := commit(t, repo, files, "Add a ConfigMap")
	token := requestReconcile(t, name)
	obj2 := waitArtifact(t, name, revision(commit2))

	t.Run("new commit", func(t *testing.T) {
		checkStored(t, obj2, commit2)
		if obj2.Status.LastHandledReconcileAt != token {
			t.Errorf("lastHandledReconcileAt %q, want %q", obj2.Status.LastHandledReconcileAt, token)
		}
		if obj2.Status.Artifact.Digest == obj.Status.Artifact.Digest {
			t.Errorf("new commit kept digest %s", obj.Status.Artifact.Digest)
		}
		body := download(t, obj2.Status.Artifact.URL)
		if got := sha256Digest(body); got != obj2.Status.Artifact.Digest {
			t.Errorf("downloaded artifact has digest %s, status says %s", got, obj2.Status.Artifact.Digest)
		}
		if d := diffTrees(untarArtifact(t, body), treeAt(t, repo, commit2)); d != "" {
			t.Errorf("artifact is not the tree at %s: %s", commit2, d)
		}
		latest := download(t, env.ArtifactURL("gitrepository/default/podinfo/latest.tar.gz"))
		if sha256Digest(latest) != obj2.Status.Artifact.Digest {
			t.Errorf("latest.tar.gz has digest %s, want %s", sha256Digest(latest), obj2.Status.Artifact.Digest)
		}
		recorder.wait(t, name, events.TypeArtifactStored, func(o *events.Outcome) bool {
			return o.Artifact != nil && o.Artifact.Digest == obj2.Status.Artifact.Digest && o.Artifact.URL == obj2.Status.Artifact.URL
		})
		// Flux's NewArtifact message names the commit: "stored artifact for commit 'Add a ConfigMap'".
		waitKubeEvent(t, name, "Normal", "NewArtifact", func(msg string) bool { return strings.Contains(msg, "Add a ConfigMap") })
	})

	// A reconcile request with nothing new: the same artifact, nothing stored.
	t.Run("nothing new", func(t *testing.T) {
		before := storedFiles(t, name)
		newArtifactEvents := kubeEventCount(t, name, "NewArtifact")
		token := requestReconcile(t, name)
		var obj3 *sourcev1.GitRepository
		eventually(t, "lastHandledReconcileAt "+token, func() error {
			obj3 = get(t, name)
			if obj3.Status.LastHandledReconcileAt != token {
				return fmt.Errorf("lastHandledReconcileAt %q", obj3.Status.LastHandledReconcileAt)
			}
			return nil
		})
		a, prev := obj3.Status.Artifact, obj2.Status.Artifact
		if a == nil || a.Digest != prev.Digest || a.Revision != prev.Revision || a.Path != prev.Path || !a.LastUpdateTime.Equal(&prev.LastUpdateTime) {
			t.Errorf("artifact changed on a reconcile with nothing new:\n got %+v\nwant %+v", a, prev)
		}
		ready := condition(t, obj3, meta.ReadyCondition)
		if ready.Status != metav1.ConditionTrue || ready.Message != storedMessage(commit2) {
			t.Errorf("Ready=%s %q, want True %q", ready.Status, ready.Message, storedMessage(commit2))
		}
		recorder.wait(t, name, events.TypeArtifactUnchanged, func(o *events.Outcome) bool {
			return o.Job.ReconcileToken == token
		})
		if after := storedFiles(t, name); !mapsEqualTimes(before, after) {
			t.Errorf("storage changed on a reconcile with nothing new: before %v, after %v", before, after)
		}
		if n := kubeEventCount(t, name, "NewArtifact"); n != newArtifactEvents {
			t.Errorf("%d NewArtifact Events after a reconcile with nothing new, want %d as before", n, newArtifactEvents)
		}
	})
}

// checkStored checks everything Flux shows for a GitRepository that stored
// an artifact for commit.
func checkStored(t *testing.T, obj *sourcev1.GitRepository, commit string) {
	t.Helper()
	a := obj.Status.Artifact
	path := fmt.Sprintf("gitrepository/%s/%s/%s.tar.gz", obj.Namespace, obj.Name, commit)
	if !digestPattern.MatchString(a.Digest) {
		t.Errorf("artifact digest %q, want sha256:<hex>", a.Digest)
	}
	if a.LastUpdateTime.IsZero() {
		t.Error("artifact lastUpdateTime is not set")
	}
	if a.Path != path {
		t.Errorf("artifact path %q, want %q", a.Path, path)
	}
	if a.Revision != revision(commit) {
		t.Errorf("artifact revision %q, want %q", a.Revision, revision(commit))
	}
	if a.Size == nil || *a.Size <= 0 {
		t.Errorf("artifact size %v, want the size in bytes", a.Size)
	}
	if want := "http://" + env.ArtifactAddr + "/" + path; a.URL != want {
		t.Errorf("artifact url %q, want %q", a.URL, want)
	}
	for _, typ := range []string{meta.ReadyCondition, sourcev1.ArtifactInStorageCondition} {
		c := condition(t, obj, typ)
		if c.Status != metav1.ConditionTrue || c.Reason != meta.SucceededReason || c.Message != storedMessage(commit) {
			t.Errorf("%s=%s %s %q, want True %s %q", typ, c.Status, c.Reason, c.Message, meta.SucceededReason, storedMessage(commit))
		}
		if c.ObservedGeneration != obj.Generation {
			t.Errorf("%s observedGeneration %d, want %d", typ, c.ObservedGeneration, obj.Generation)
		}
	}
	if obj.Status.ObservedGeneration != obj.Generation {
		t.Errorf("status.observedGeneration %d, want %d", obj.Status.ObservedGeneration, obj.Generation)
	}
}

// storedMessage is Flux's Ready message for a stored artifact.
func storedMessage(commit string) string {
	return fmt.Sprintf("stored artifact for revision '%s'", revision(commit))
}

func mapsEqualTimes(a, b map[string]time.Time) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !w.Equal(v) {
			return false
		}
	}
	return true
}
