package e2e

import (
	"fmt"
	"reflect"
	"slices"
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
