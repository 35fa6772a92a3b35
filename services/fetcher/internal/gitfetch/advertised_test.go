package gitfetch

import (
	"context"
	"io/fs"
	"testing"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// TestFetchOverHTTPListsOnce resolves and downloads branches and tags over
// HTTP and counts what the server answered: one listing and one fetch each,
// the fetch reusing what the listing advertised.
func TestFetchOverHTTPListsOnce(t *testing.T) {
	f := newFixture(t, "", "")
	src := &Source{}
	for _, ref := range []*sourcev1.GitRepositoryRef{{Branch: "dev"}, {Tag: "v1.1.0"}, {SemVer: "1.0.x"}} {
		listings, fetches := f.srv.Counts()
		ctx := context.Background()
		res, err := src.Resolve(ctx, request(f.url, ref))
		must(t, err)
		content, err := res.Download(ctx, t.TempDir())
		must(t, err)
		if content.Revision != res.Revision() {
			t.Errorf("%+v: downloaded %q, resolved %q", ref, content.Revision, res.Revision())
		}
		must(t, res.(*resolved).Close())
		l, fe := f.srv.Counts()
		if l-listings != 1 || fe-fetches != 1 {
			t.Errorf("%+v: %d listings and %d fetches, want 1 of each", ref, l-listings, fe-fetches)
		}
	}
}

// TestFetchAfterForcePush rewrites the branch between resolving and
// downloading, so the listed commit is no longer reachable on the server:
// the download starts again from a listing and gets the branch's new tip.
func TestFetchAfterForcePush(t *testing.T) {
	root := t.TempDir()
	repo, err := gitserver.NewRepo(root, "repo", t.TempDir(), "main")
	must(t, err)
	must(t, repo.Write(map[string]string{"README.md": "old"}))
	_, err = repo.Commit("old history")
	must(t, err)
	srv := &gitserver.Server{Root: root}
	must(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = srv.Stop() })

	ctx := context.Background()
	res, err := (&Source{}).Resolve(ctx, request(srv.RepoURL("repo"), &sourcev1.GitRepositoryRef{Branch: "main"}))
	must(t, err)

	must(t, repo.Git("checkout", "--quiet", "--orphan", "rewritten"))
	must(t, repo.Write(map[string]string{"README.md": "new"}))
	must(t, repo.Git("add", "--all"))
	must(t, repo.Git("commit", "--quiet", "-m", "new history"))
	must(t, repo.Git("push", "--quiet", "--force", "origin", "rewritten:main"))
	tip, err := repo.Output("rev-parse", "HEAD")
	must(t, err)

	content, err := res.Download(ctx, t.TempDir())
	must(t, err)
	t.Cleanup(func() { _ = res.(*resolved).Close() })
	if want := "main@sha1:" + tip; content.Revision != want {
		t.Errorf("downloaded %q, want the new tip %q", content.Revision, want)
	}
	if b, err := fs.ReadFile(content.Tree(), "README.md"); err != nil || string(b) != "new" {
		t.Errorf("README.md = %q (%v), want the new history's", b, err)
	}
}
