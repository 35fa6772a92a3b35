package e2e

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// includes sets spec.include.
func includes(incs ...sourcev1.GitRepositoryInclude) func(*sourcev1.GitRepository) {
	return func(o *sourcev1.GitRepository) { o.Spec.Include = incs }
}

// include is an entry of spec.include.
func include(name, from, to string) sourcev1.GitRepositoryInclude {
	return sourcev1.GitRepositoryInclude{GitRepositoryRef: meta.LocalObjectReference{Name: name}, FromPath: from, ToPath: to}
}

// under returns files renamed to dir/<path>.
func under(dir string, files map[string]string) map[string]string {
	out := map[string]string{}
	for p, c := range files {
		out[dir+"/"+p] = c
	}
	return out
}

// includeArtifactFiles downloads the artifact of obj and returns its files.
func includeArtifactFiles(t *testing.T, obj *sourcev1.GitRepository) map[string]string {
	t.Helper()
	body := download(t, obj.Status.Artifact.URL)
	if got := sha256Digest(body); got != obj.Status.Artifact.Digest {
		t.Fatalf("downloaded artifact has digest %s, status says %s", got, obj.Status.Artifact.Digest)
	}
	return untarArtifact(t, body)
}

// TestInclude has GitRepository incl-b include incl-a at toPath "a": B's
// artifact holds A's files under a/, status.includedArtifacts records A's
// artifact, and a new commit of A rebuilds B without anyone touching B.
func TestInclude(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const a, b = "incl-a", "incl-b"
	aFiles := map[string]string{"README.md": "# A\n", "deploy/app.yaml": "kind: Deployment # v1\n"}
	bFiles := map[string]string{"README.md": "# B\n", "kustomization.yaml": "resources: [a/deploy]\n"}
	repoA, commitA := newRepo(t, a, aFiles)
	_, commitB := newRepo(t, b, bFiles)
	createSource(t, a, env.Git.RepoURL(a), branch)
	createSource(t, b, env.Git.RepoURL(b), branch, includes(include(a, "", "a")))

	objA := waitArtifact(t, a, revision(commitA))
	objB := waitIncluded(t, b, revision(commitB), objA.Status.Artifact.Digest)
	want := maps.Clone(bFiles)
	maps.Copy(want, under("a", aFiles))
	if d := diffTrees(includeArtifactFiles(t, objB), want); d != "" {
		t.Errorf("artifact of %s: %s", b, d)
	}
	if got := objB.Status.ObservedInclude; len(got) != 1 || got[0].GitRepositoryRef.Name != a || got[0].ToPath != "a" {
		t.Errorf("observedInclude = %+v, want the spec's", got)
	}
	waitKubeEvent(t, b, corev1.EventTypeNormal, "NewArtifact", nil)

	// A new commit of A, and a reconcile request on A only.
	aFiles2 := map[string]string{"README.md": "# A\n", "deploy/app.yaml": "kind: Deployment # v2\n", "deploy/svc.yaml": "kind: Service\n"}
	commitA2 := commit(t, repoA, aFiles2, "Change A")
	requestReconcile(t, a)
	objA = waitArtifact(t, a, revision(commitA2))
	objB2 := waitIncluded(t, b, revision(commitB), objA.Status.Artifact.Digest)
	if objB2.Status.Artifact.Digest == objB.Status.Artifact.Digest {
		t.Errorf("%s rebuilt with the same digest %s", b, objB.Status.Artifact.Digest)
	}
	want = maps.Clone(bFiles)
	maps.Copy(want, under("a", aFiles2))
	if d := diffTrees(includeArtifactFiles(t, objB2), want); d != "" {
		t.Errorf("artifact of %s after A changed: %s", b, d)
	}
	requireServicesRunning(t)
}

// waitIncluded waits until the GitRepository name is Ready with revision
// and an artifact built from the included artifact of digest, and returns
// it.
func waitIncluded(t *testing.T, name, rev, includedDigest string) *sourcev1.GitRepository {
	t.Helper()
	var obj *sourcev1.GitRepository
	eventually(t, fmt.Sprintf("gitrepository %s built with the included artifact %s", name, includedDigest), func() error {
		obj = get(t, name)
		ready := apimeta.FindStatusCondition(obj.Status.Conditions, meta.ReadyCondition)
		switch {
		case ready == nil || ready.Status != metav1.ConditionTrue:
			return fmt.Errorf("not Ready: %+v", ready)
		case obj.Status.Artifact == nil || obj.Status.Artifact.Revision != rev:
			return fmt.Errorf("artifact %+v, want revision %s", obj.Status.Artifact, rev)
		case len(obj.Status.IncludedArtifacts) != 1 || obj.Status.IncludedArtifacts[0] == nil:
			return fmt.Errorf("includedArtifacts = %+v, want one", obj.Status.IncludedArtifacts)
		case obj.Status.IncludedArtifacts[0].Digest != includedDigest:
			return fmt.Errorf("included artifact digest %s, want %s", obj.Status.IncludedArtifacts[0].Digest, includedDigest)
		}
		return nil
	})
	return obj
}

// TestIncludeUnavailable has a GitRepository include one that does not
// exist: IncludeUnavailable=True and Ready=False with Flux's NotFound, and a
// Warning Event. Once the included source exists and has an artifact, the
// includer stops waiting and is built with it.
func TestIncludeUnavailable(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name, missing = "incl-waiting", "incl-late"
	files := map[string]string{"README.md": "# waiting\n"}
	_, c := newRepo(t, name, files)
	createSource(t, name, env.Git.RepoURL(name), branch, includes(include(missing, "", "")))

	obj := waitCondition(t, name, sourcev1.IncludeUnavailableCondition, metav1.ConditionTrue, "NotFound")
	wantMsg := fmt.Sprintf("could not get resource for include '%s'", missing)
	if c := condition(t, obj, sourcev1.IncludeUnavailableCondition); !strings.HasPrefix(c.Message, wantMsg) {
		t.Errorf("IncludeUnavailable message %q, want it to start with %q", c.Message, wantMsg)
	}
	if r := condition(t, obj, meta.ReadyCondition); r.Status != metav1.ConditionFalse || r.Reason != "NotFound" {
		t.Errorf("Ready = %s %s, want False NotFound", r.Status, r.Reason)
	}
	if obj.Status.Artifact != nil {
		t.Errorf("artifact %+v while the include is unavailable", obj.Status.Artifact)
	}
	waitKubeEvent(t, name, corev1.EventTypeNormal, "NotFound", func(msg string) bool { return strings.HasPrefix(msg, wantMsg) })

	// The included source appears; toPath defaults to its name.
	lateFiles := map[string]string{"late.yaml": "late: true\n"}
	_, lc := newRepo(t, missing, lateFiles)
	createSource(t, missing, env.Git.RepoURL(missing), branch)
	late := waitArtifact(t, missing, revision(lc))
	obj = waitIncluded(t, name, revision(c), late.Status.Artifact.Digest)
	if apimeta.FindStatusCondition(obj.Status.Conditions, sourcev1.IncludeUnavailableCondition) != nil {
		t.Errorf("IncludeUnavailable still set on a Ready source: %+v", obj.Status.Conditions)
	}
	want := maps.Clone(files)
	maps.Copy(want, under(missing, lateFiles))
	if d := diffTrees(includeArtifactFiles(t, obj), want); d != "" {
		t.Errorf("artifact: %s", d)
	}
}

// TestIncludeCycle has two GitRepositories include each other: both fail
// clearly (IncludeUnavailable, Ready=False, Stalled), nothing crashes.
func TestIncludeCycle(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const one, two = "incl-cycle-one", "incl-cycle-two"
	for _, n := range []string{one, two} {
		newRepo(t, n, map[string]string{"README.md": "# " + n + "\n"})
	}
	createSource(t, one, env.Git.RepoURL(one), branch, includes(include(two, "", "")))
	createSource(t, two, env.Git.RepoURL(two), branch, includes(include(one, "", "")))

	for _, n := range []string{one, two} {
		obj := waitCondition(t, n, sourcev1.IncludeUnavailableCondition, metav1.ConditionTrue, "IncludeCycle")
		if msg := condition(t, obj, sourcev1.IncludeUnavailableCondition).Message; !strings.Contains(msg, "include cycle") ||
			!strings.Contains(msg, one) || !strings.Contains(msg, two) {
			t.Errorf("%s: IncludeUnavailable message %q, want the cycle named", n, msg)
		}
		if r := condition(t, obj, meta.ReadyCondition); r.Status != metav1.ConditionFalse {
			t.Errorf("%s: Ready = %s, want False", n, r.Status)
		}
		if s := condition(t, obj, meta.StalledCondition); s.Status != metav1.ConditionTrue {
			t.Errorf("%s: Stalled = %s, want True", n, s.Status)
		}
		if obj.Status.Artifact != nil {
			t.Errorf("%s has an artifact in a cycle: %+v", n, obj.Status.Artifact)
		}
	}
	requireServicesRunning(t)
}

// TestIncludeHostilePath has an include whose toPath climbs out of the
// artifact: a stalled IllegalPath failure, nothing written outside.
func TestIncludeHostilePath(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name, dep = "incl-hostile", "incl-hostile-dep"
	_, dc := newRepo(t, dep, map[string]string{"evil.txt": "evil\n"})
	createSource(t, dep, env.Git.RepoURL(dep), branch)
	waitArtifact(t, dep, revision(dc))
	newRepo(t, name, map[string]string{"README.md": "# hostile\n"})
	createSource(t, name, env.Git.RepoURL(name), branch, includes(include(dep, "", "../../escape")))

	obj := waitCondition(t, name, sourcev1.IncludeUnavailableCondition, metav1.ConditionTrue, "IllegalPath")
	if msg := condition(t, obj, sourcev1.IncludeUnavailableCondition).Message; !strings.HasPrefix(msg, "path calculation for include '"+dep+"' failed") {
		t.Errorf("message %q", msg)
	}
	if s := condition(t, obj, meta.StalledCondition); s.Status != metav1.ConditionTrue {
		t.Errorf("Stalled = %s, want True", s.Status)
	}
	if obj.Status.Artifact != nil {
		t.Errorf("artifact %+v for a hostile include", obj.Status.Artifact)
	}
	if len(storedFiles(t, name)) != 0 {
		t.Errorf("storage holds %v for a hostile include", storedFiles(t, name))
	}
	requireServicesRunning(t)
}
