package e2e

import (
	"fmt"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestStorageOutage stops the S3 server (MinIO) under a Ready
// GitRepository, pushes a commit and requests a reconcile: the source keeps
// its artifact in status and says why it is not fresh (Flux's
// StorageOperationFailed, Ready=False with its reason) with a Warning
// Event; with S3 back on the same address and data, the source is Ready at
// the new commit by itself, every service still running.
func TestStorageOutage(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	e := startS3Env(t)
	const name = "s3-outage"
	repo, commit1 := e.newRepo(t, name, sampleFiles(t))
	e.createSource(t, name, e.Git.RepoURL(name))
	before := e.waitArtifact(t, name, revision(commit1)).Status.Artifact

	if err := e.minio.Halt(); err != nil {
		t.Fatal(err)
	}
	halted := true
	t.Cleanup(func() {
		if halted {
			_ = e.minio.Resume()
		}
	})
	commit2 := commit(t, repo, map[string]string{"CHANGELOG.md": "# Changes\n\nwhile S3 is down\n"}, "Change while S3 is down")
	e.requestReconcile(t, name)

	var failed *metav1.Condition
	eventually(t, "the source says its artifact cannot be stored", func() error {
		obj := e.get(t, name)
		failed = apimeta.FindStatusCondition(obj.Status.Conditions, sourcev1.StorageOperationFailedCondition)
		ready := apimeta.FindStatusCondition(obj.Status.Conditions, meta.ReadyCondition)
		switch {
		case failed == nil || failed.Status != metav1.ConditionTrue:
			return fmt.Errorf("StorageOperationFailed %+v, Ready %+v", failed, ready)
		case ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != failed.Reason:
			return fmt.Errorf("Ready %+v, want False %s", ready, failed.Reason)
		}
		if a := obj.Status.Artifact; a == nil || a.Digest != before.Digest || a.Revision != before.Revision {
			t.Errorf("artifact while S3 is down %+v, want the one before %+v", a, before)
		}
		return nil
	})
	t.Logf("S3 down: StorageOperationFailed %s: %s", failed.Reason, failed.Message)
	e.waitEvent(t, name, corev1.EventTypeWarning, failed.Reason)

	if err := e.minio.Resume(); err != nil {
		t.Fatal(err)
	}
	halted = false
	after := e.waitArtifact(t, name, revision(commit2))
	if c := apimeta.FindStatusCondition(after.Status.Conditions, sourcev1.StorageOperationFailedCondition); c != nil {
		t.Errorf("StorageOperationFailed = %+v once S3 is back, want none", c)
	}
	e.checkStored(t, after, commit2, treeAt(t, repo, commit2))
}
