package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// artifactFiles downloads the artifact of obj and returns its regular files.
func artifactFiles(t *testing.T, obj *sourcev1.GitRepository) map[string]string {
	t.Helper()
	a := obj.Status.Artifact
	body := download(t, a.URL)
	if got := sha256Digest(body); got != a.Digest {
		t.Fatalf("artifact %s downloads with digest %s, want %s", a.URL, got, a.Digest)
	}
	return untarArtifact(t, body)
}

// fileNames are the sorted paths of files.
func fileNames(files map[string]string) []string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// waitRebuilt waits until the GitRepository name is Ready for its current
// generation with an artifact of rev whose digest is not old's, and
// returns it.
func waitRebuilt(t *testing.T, name, rev, old string) *sourcev1.GitRepository {
	t.Helper()
	var obj *sourcev1.GitRepository
	eventually(t, fmt.Sprintf("gitrepository %s rebuilt at %s", name, rev), func() error {
		obj = get(t, name)
		ready := apimeta.FindStatusCondition(obj.Status.Conditions, meta.ReadyCondition)
		a := obj.Status.Artifact
		switch {
		case ready == nil || ready.Status != metav1.ConditionTrue:
			return fmt.Errorf("not Ready: %+v", ready)
		case obj.Status.ObservedGeneration != obj.Generation:
			return fmt.Errorf("observedGeneration %d, generation %d", obj.Status.ObservedGeneration, obj.Generation)
		case a == nil || a.Revision != rev:
			return fmt.Errorf("artifact %+v", a)
		case a.Digest == old:
			return fmt.Errorf("artifact digest still %s", old)
		}
		return nil
	})
	return obj
}

// TestRecurseSubmodules checks spec.recurseSubmodules: with it, the
// artifact holds the submodule's files (at a URL relative to the parent's);
// without it, only the parent's; turning it on for the same commit rebuilds
// the artifact.
func TestRecurseSubmodules(t *testing.T) {
	requireEnv(t)
	t.Parallel()

	newRepo(t, "checkout-sub-lib", map[string]string{"lib.yaml": "kind: Lib\n"})
	parent, err := env.NewRepo("checkout-sub-parent", branch)
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Write(map[string]string{"app.yaml": "kind: App\n"}); err != nil {
		t.Fatal(err)
	}
	addSubmodule(t, parent, env.Git.RepoURL("checkout-sub-lib"), "vendor/lib", "../checkout-sub-lib.git")
	c, err := parent.Commit("app with a submodule")
	if err != nil {
		t.Fatal(err)
	}
	url := env.Git.RepoURL("checkout-sub-parent")

	createSource(t, "checkout-submodules-on", url, branch, func(o *sourcev1.GitRepository) { o.Spec.RecurseSubmodules = true })
	createSource(t, "checkout-submodules-off", url, branch)

	on := waitArtifact(t, "checkout-submodules-on", revision(c))
	want := map[string]string{"app.yaml": "kind: App\n", "vendor/lib/lib.yaml": "kind: Lib\n"}
	if d := diffTrees(artifactFiles(t, on), want); d != "" {
		t.Errorf("artifact with recurseSubmodules: %s", d)
	}
	if !on.Status.ObservedRecurseSubmodules {
		t.Errorf("status.observedRecurseSubmodules = false, want true")
	}

	off := waitArtifact(t, "checkout-submodules-off", revision(c))
	if d := diffTrees(artifactFiles(t, off), map[string]string{"app.yaml": "kind: App\n"}); d != "" {
		t.Errorf("artifact without recurseSubmodules: %s", d)
	}
	if off.Status.ObservedRecurseSubmodules {
		t.Errorf("status.observedRecurseSubmodules = true, want false")
	}

	// The same commit, now with its submodules: a new artifact.
	patch(t, "checkout-submodules-off", func(o *sourcev1.GitRepository) { o.Spec.RecurseSubmodules = true })
	rebuilt := waitRebuilt(t, "checkout-submodules-off", revision(c), off.Status.Artifact.Digest)
	if d := diffTrees(artifactFiles(t, rebuilt), want); d != "" {
		t.Errorf("artifact after turning recurseSubmodules on: %s", d)
	}
	if !rebuilt.Status.ObservedRecurseSubmodules {
		t.Errorf("status.observedRecurseSubmodules = false after the rebuild, want true")
	}
	t.Cleanup(func() { requireServicesRunning(t) })
}

// TestSparseCheckout checks spec.sparseCheckout: only the listed
// directories are in the artifact, and changing the list rebuilds the
// artifact of the same commit.
func TestSparseCheckout(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "checkout-sparse"
	files := map[string]string{
		"README.md":          "# mono\n",
		"deploy/app.yaml":    "kind: App\n",
		"deploy/base/k.yaml": "kind: Kustomization\n",
		"deployment.yaml":    "kind: Sibling\n",
		"infra/db.yaml":      "kind: DB\n",
	}
	_, c := newRepo(t, name, files)
	createSource(t, name, env.Git.RepoURL(name), branch, func(o *sourcev1.GitRepository) {
		o.Spec.SparseCheckout = []string{"deploy"}
	})

	obj := waitArtifact(t, name, revision(c))
	if got, want := fileNames(artifactFiles(t, obj)), []string{"deploy/app.yaml", "deploy/base/k.yaml"}; !reflect.DeepEqual(got, want) {
		t.Errorf("artifact of sparseCheckout [deploy] holds %v, want %v", got, want)
	}
	if got := obj.Status.ObservedSparseCheckout; !reflect.DeepEqual(got, []string{"deploy"}) {
		t.Errorf("status.observedSparseCheckout = %v, want [deploy]", got)
	}

	patch(t, name, func(o *sourcev1.GitRepository) { o.Spec.SparseCheckout = []string{"./infra"} })
	obj = waitRebuilt(t, name, revision(c), obj.Status.Artifact.Digest)
	if got, want := fileNames(artifactFiles(t, obj)), []string{"infra/db.yaml"}; !reflect.DeepEqual(got, want) {
		t.Errorf("artifact of sparseCheckout [./infra] holds %v, want %v", got, want)
	}
	if got := obj.Status.ObservedSparseCheckout; !reflect.DeepEqual(got, []string{"./infra"}) {
		t.Errorf("status.observedSparseCheckout = %v, want [./infra]", got)
	}

	// No sparse checkout: everything.
	patch(t, name, func(o *sourcev1.GitRepository) { o.Spec.SparseCheckout = nil })
	obj = waitRebuilt(t, name, revision(c), obj.Status.Artifact.Digest)
	if d := diffTrees(artifactFiles(t, obj), files); d != "" {
		t.Errorf("artifact without sparseCheckout: %s", d)
	}
	if got := obj.Status.ObservedSparseCheckout; len(got) != 0 {
		t.Errorf("status.observedSparseCheckout = %v, want none", got)
	}
	t.Cleanup(func() { requireServicesRunning(t) })
}

// TestSymlinkOutside checks that a repository with symbolic links pointing
// outside its tree gives a Ready artifact without them (and without
// reading what they point at), while links inside the tree become copies.
func TestSymlinkOutside(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "checkout-symlinks"
	repo, err := env.NewRepo(name, branch)
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Write(map[string]string{"deploy/app.yaml": "kind: App\n", "logo.png": "png"}); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("deploy/\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		"passwd":           "/etc/passwd",
		"etc":              "/etc",
		"up":               "../../../../../../../../..",
		".sourceignore":    secret, // read, it would drop deploy/ and keep logo.png
		"deploy/copy.yaml": "app.yaml",
	}
	for link, target := range links {
		if err := os.Symlink(target, filepath.Join(repo.Dir, filepath.FromSlash(link))); err != nil {
			t.Fatal(err)
		}
	}
	c, err := repo.Commit("links everywhere")
	if err != nil {
		t.Fatal(err)
	}
	createSource(t, name, env.Git.RepoURL(name), branch)
	obj := waitArtifact(t, name, revision(c))
	want := map[string]string{"deploy/app.yaml": "kind: App\n", "deploy/copy.yaml": "kind: App\n"}
	if d := diffTrees(artifactFiles(t, obj), want); d != "" {
		t.Errorf("artifact of a repository with symlinks: %s", d)
	}
	t.Cleanup(func() { requireServicesRunning(t) })
}

// TestFileTooLarge checks that a commit with a file over the fetcher's
// -max-file-size fails with a clear message and a Warning Event, and that
// the last good artifact stays served.
func TestFileTooLarge(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "checkout-too-large"
	repo, c1 := newRepo(t, name, map[string]string{"deploy/app.yaml": "kind: App\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	good := waitArtifact(t, name, revision(c1))

	commit(t, repo, map[string]string{"deploy/huge.yaml": strings.Repeat("x", e2eMaxFileSize+1)}, "a huge file")
	requestReconcile(t, name)
	obj := waitCondition(t, name, meta.ReadyCondition, metav1.ConditionFalse, sourcev1.ArchiveOperationFailedReason)
	ready := condition(t, obj, meta.ReadyCondition)
	t.Logf("Ready: %s", ready.Message)
	for _, part := range []string{"file too large", "deploy/huge.yaml", "over the limit"} {
		if !strings.Contains(ready.Message, part) {
			t.Errorf("Ready message %q does not say %q", ready.Message, part)
		}
	}
	if strings.Contains(ready.Message, "/tmp") || strings.Contains(ready.Message, "fetch-") {
		t.Errorf("Ready message %q names a temporary directory", ready.Message)
	}
	failed := condition(t, obj, sourcev1.StorageOperationFailedCondition)
	if failed.Status != metav1.ConditionTrue || failed.Message != ready.Message {
		t.Errorf("StorageOperationFailed = %s %q, want True with the Ready message", failed.Status, failed.Message)
	}
	if c := condition(t, obj, meta.ReadyCondition); c.Reason != sourcev1.ArchiveOperationFailedReason {
		t.Errorf("Ready reason %s", c.Reason)
	}
	if apimeta.IsStatusConditionTrue(obj.Status.Conditions, meta.StalledCondition) {
		t.Errorf("a file too large stalls the source; a new commit can fix it")
	}
	waitKubeEvent(t, name, "Warning", sourcev1.ArchiveOperationFailedReason, func(msg string) bool {
		return strings.Contains(msg, "deploy/huge.yaml")
	})
	if a := obj.Status.Artifact; a == nil || a.Revision != good.Status.Artifact.Revision || a.Digest != good.Status.Artifact.Digest {
		t.Fatalf("artifact after the failure %+v, want the last good one %+v", a, good.Status.Artifact)
	}
	if d := diffTrees(artifactFiles(t, obj), map[string]string{"deploy/app.yaml": "kind: App\n"}); d != "" {
		t.Errorf("last good artifact: %s", d)
	}
	t.Cleanup(func() { requireServicesRunning(t) })
}

// addSubmodule adds the repository at cloneURL as a submodule at path and
// records recorded as its URL in .gitmodules; it does not commit.
func addSubmodule(t *testing.T, repo *gitserver.Repo, cloneURL, path, recorded string) {
	t.Helper()
	if err := repo.Git("submodule", "add", "--quiet", cloneURL, path); err != nil {
		t.Fatal(err)
	}
	if err := repo.Git("config", "-f", ".gitmodules", "submodule."+path+".url", recorded); err != nil {
		t.Fatal(err)
	}
}
