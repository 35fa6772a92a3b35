package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// TestDeletion deletes a Ready source: the finalizer goes (the object is
// gone) and so do its artifacts, from storage and from the artifact-server.
func TestDeletion(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "deleted"
	_, commit := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	obj := waitArtifact(t, name, revision(commit))
	if len(storedFiles(t, name)) == 0 {
		t.Fatal("storage holds no file for the Ready source")
	}

	if err := env.Client.Delete(t.Context(), obj); err != nil {
		t.Fatal(err)
	}
	eventually(t, "gitrepository "+name+" gone", func() error {
		var o sourcev1.GitRepository
		err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, &o)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		}
		return fmt.Errorf("still there: deletionTimestamp %v, finalizers %v", o.DeletionTimestamp, o.Finalizers)
	})
	eventually(t, "artifacts of "+name+" removed from storage", func() error {
		if files := storedFiles(t, name); len(files) > 0 {
			return fmt.Errorf("storage still holds %v", files)
		}
		return nil
	})
	if status, _ := httpGet(t, obj.Status.Artifact.URL); status != http.StatusNotFound {
		t.Errorf("GET %s after deletion: %d, want 404", obj.Status.Artifact.URL, status)
	}
	recorder.wait(t, name, events.TypeArtifactDeleted, nil)
	// Flux's Event for the collected artifacts, about the deleted object.
	waitKubeEvent(t, name, "Normal", "GarbageCollectionSucceeded", func(msg string) bool {
		return msg == "garbage collected artifacts for deleted resource"
	})
}

// TestNoChangeEvent requests a reconcile of a Ready GitRepository whose
// branch did not move: as Flux, a Normal GitOperationSucceeded Event says
// so, and nothing else changes.
func TestNoChangeEvent(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "no-change"
	_, commit := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	ready := waitArtifact(t, name, revision(commit))

	token := requestReconcile(t, name)
	eventually(t, "the reconcile request handled", func() error {
		if got := get(t, name).Status.LastHandledReconcileAt; got != token {
			return fmt.Errorf("lastHandledReconcileAt %q, want %q", got, token)
		}
		return nil
	})
	want := "no changes since last reconciliation: observed revision '" + revision(commit) + "'"
	waitKubeEvent(t, name, "Normal", sourcev1.GitOperationSucceedReason, func(msg string) bool { return msg == want })
	if a := get(t, name).Status.Artifact; a == nil || a.Digest != ready.Status.Artifact.Digest {
		t.Errorf("artifact after a no-change reconcile %+v, want %+v", a, ready.Status.Artifact)
	}
}

// TestSuspend suspends a Ready source: a new commit and a reconcile request
// change nothing until it is resumed.
func TestSuspend(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "suspended"
	repo, commit1 := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	ready := waitArtifact(t, name, revision(commit1))

	patch(t, name, func(o *sourcev1.GitRepository) { o.Spec.Suspend = true })
	eventsBefore := len(recorder.forSource(name))
	commit2 := commit(t, repo, map[string]string{"README.md": "# changed while suspended\n"}, "Change while suspended")
	token := requestReconcile(t, name)

	// Absence cannot be awaited; watch for a while that nothing happens.
	consistently(t, "suspended source unchanged", 5*time.Second, func() error {
		obj := get(t, name)
		if a := obj.Status.Artifact; a == nil || a.Digest != ready.Status.Artifact.Digest {
			return fmt.Errorf("artifact changed while suspended: %+v", a)
		}
		if obj.Status.LastHandledReconcileAt == token {
			return errors.New("a suspended source handled a reconcile request")
		}
		if n := len(recorder.forSource(name)); n != eventsBefore {
			return fmt.Errorf("%d CloudEvents while suspended", n-eventsBefore)
		}
		return nil
	})

	patch(t, name, func(o *sourcev1.GitRepository) { o.Spec.Suspend = false })
	waitArtifact(t, name, revision(commit2))
}
