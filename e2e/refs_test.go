package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRefs checks spec.ref field by field on one repository with branches
// and tags, one GitRepository per case: the revision in Flux's format, the
// Ready message, the NewArtifact Event and the artifact's content at the
// commit the reference resolves to. A reference that names nothing gives
// Ready=False with Flux's reason and words, and a Warning Event.
//
// The repository's history:
//
//	c1  master, tag v1.0.0 (lightweight)
//	├── cf  feature
//	c2  tag v1.1.0 (annotated)
//	c3  master (tip), tags v1.2.0-rc.1 and v2.0.0 (lightweight)
//
// and the served repository's HEAD names feature, not master, so a source
// without ref shows which default it uses.
func TestRefs(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const repoName = "refs"
	repo, err := env.NewRepo(repoName, branch)
	if err != nil {
		t.Fatal(err)
	}
	c1 := commit(t, repo, map[string]string{"app.yaml": "version: 1.0.0\n"}, "Release 1.0.0")
	mustGit(t, repo.Tag("v1.0.0", ""))
	mustGit(t, repo.Git("checkout", "--quiet", "-b", "feature"))
	cf := commit(t, repo, map[string]string{"app.yaml": "version: feature\n", "feature.yaml": "kind: Feature\n"}, "Start a feature")
	mustGit(t, repo.Git("checkout", "--quiet", branch))
	c2 := commit(t, repo, map[string]string{"app.yaml": "version: 1.1.0\n"}, "Release 1.1.0")
	mustGit(t, repo.Tag("v1.1.0", "Release 1.1.0, annotated"))
	c3 := commit(t, repo, map[string]string{"app.yaml": "version: 2.0.0\n", "v2.yaml": "kind: Two\n"}, "Release 2.0.0")
	mustGit(t, repo.Tag("v1.2.0-rc.1", ""))
	mustGit(t, repo.Tag("v2.0.0", ""))
	mustGit(t, repo.Git("--git-dir", repo.Bare, "symbolic-ref", "HEAD", "refs/heads/feature"))
	url := env.Git.RepoURL(repoName)
	subjects := map[string]string{c1: "Release 1.0.0", cf: "Start a feature", c2: "Release 1.1.0", c3: "Release 2.0.0"}

	tests := []struct {
		name string
		ref  *sourcev1.GitRepositoryRef
		// rev is the artifact revision; commit the commit whose tree the
		// artifact holds.
		rev, commit string
	}{
		{name: "branch", ref: &sourcev1.GitRepositoryRef{Branch: "feature"}, rev: "feature@sha1:" + cf, commit: cf},
		{name: "tag-lightweight", ref: &sourcev1.GitRepositoryRef{Tag: "v1.0.0"}, rev: "v1.0.0@sha1:" + c1, commit: c1},
		// The peeled commit, not the tag object.
		{name: "tag-annotated", ref: &sourcev1.GitRepositoryRef{Tag: "v1.1.0"}, rev: "v1.1.0@sha1:" + c2, commit: c2},
		// The highest matching tag; 1.x leaves out v1.2.0-rc.1, a prerelease.
		{name: "semver-1x", ref: &sourcev1.GitRepositoryRef{SemVer: "1.x"}, rev: "v1.1.0@sha1:" + c2, commit: c2},
		{name: "semver-ge", ref: &sourcev1.GitRepositoryRef{SemVer: ">=1.0.0"}, rev: "v2.0.0@sha1:" + c3, commit: c3},
		{name: "name-branch", ref: &sourcev1.GitRepositoryRef{Name: "refs/heads/feature"}, rev: "refs/heads/feature@sha1:" + cf, commit: cf},
		{name: "name-tag", ref: &sourcev1.GitRepositoryRef{Name: "refs/tags/v1.0.0"}, rev: "refs/tags/v1.0.0@sha1:" + c1, commit: c1},
		{name: "name-annotated-tag", ref: &sourcev1.GitRepositoryRef{Name: "refs/tags/v1.1.0"}, rev: "refs/tags/v1.1.0@sha1:" + c2, commit: c2},
		{name: "commit", ref: &sourcev1.GitRepositoryRef{Commit: c2}, rev: "sha1:" + c2, commit: c2},
		// The commit wins over the branch's tip; the branch names the revision.
		{name: "commit-on-branch", ref: &sourcev1.GitRepositoryRef{Branch: "feature", Commit: c1}, rev: "feature@sha1:" + c1, commit: c1},
		// Flux's default is the master branch, whatever the remote's HEAD.
		{name: "no-ref", ref: nil, rev: "master@sha1:" + c3, commit: c3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			name := "refs-" + tt.name
			createSource(t, name, url, "", func(o *sourcev1.GitRepository) { o.Spec.Reference = tt.ref })
			obj := waitArtifact(t, name, tt.rev)
			a := obj.Status.Artifact
			if want := fmt.Sprintf("gitrepository/%s/%s/%s.tar.gz", namespace, name, tt.commit); a.Path != want {
				t.Errorf("artifact path %q, want %q", a.Path, want)
			}
			msg := fmt.Sprintf("stored artifact for revision '%s'", tt.rev)
			for _, typ := range []string{meta.ReadyCondition, sourcev1.ArtifactInStorageCondition} {
				if c := condition(t, obj, typ); c.Status != metav1.ConditionTrue || c.Reason != meta.SucceededReason || c.Message != msg {
					t.Errorf("%s=%s %s %q, want True %s %q", typ, c.Status, c.Reason, c.Message, meta.SucceededReason, msg)
				}
			}
			if d := diffTrees(artifactFiles(t, obj), treeAt(t, repo, tt.commit)); d != "" {
				t.Errorf("artifact is not the tree at %s: %s", tt.commit, d)
			}
			// Flux's NewArtifact message names the commit it stored.
			want := fmt.Sprintf("stored artifact for commit '%s'", subjects[tt.commit])
			waitKubeEvent(t, name, "Normal", "NewArtifact", func(m string) bool { return m == want })
		})
	}

	badInput := []struct {
		name  string
		ref   *sourcev1.GitRepositoryRef
		inMsg string // what the message must name
		flux  string // and Flux's words for the problem
	}{
		{name: "semver-no-match", ref: &sourcev1.GitRepositoryRef{SemVer: "9.x"}, inMsg: "9.x", flux: "no match found for semver: 9.x"},
		{name: "missing-commit", ref: &sourcev1.GitRepositoryRef{Commit: strings.Repeat("0badc0de", 5)},
			inMsg: strings.Repeat("0badc0de", 5), flux: "unable to resolve commit object for '" + strings.Repeat("0badc0de", 5) + "'"},
		{name: "missing-tag", ref: &sourcev1.GitRepositoryRef{Tag: "v9.9.9"}, inMsg: "refs/tags/v9.9.9", flux: "couldn't find remote ref"},
	}
	for _, tt := range badInput {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			name := "refs-" + tt.name
			createSource(t, name, url, "", func(o *sourcev1.GitRepository) { o.Spec.Reference = tt.ref })
			obj := waitCondition(t, name, sourcev1.FetchFailedCondition, metav1.ConditionTrue, sourcev1.GitOperationFailedReason)
			checkFetchFailed(t, obj, tt.inMsg)
			if c := condition(t, obj, sourcev1.FetchFailedCondition); !strings.Contains(c.Message, tt.flux) {
				t.Errorf("FetchFailed message %q, want Flux's %q in it", c.Message, tt.flux)
			}
			if obj.Status.Artifact != nil {
				t.Errorf("a source whose ref names nothing has artifact %+v", obj.Status.Artifact)
			}
		})
	}
	t.Cleanup(func() { requireServicesRunning(t) })
}

// mustGit fails the test on a git error while building the repository.
func mustGit(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
