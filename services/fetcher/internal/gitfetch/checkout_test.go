package gitfetch

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// newServer starts a git server on a fresh root, with basic auth when
// username is set.
func newServer(t *testing.T, username, password string) *gitserver.Server {
	t.Helper()
	srv := &gitserver.Server{Root: t.TempDir(), Username: username, Password: password}
	must(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = srv.Stop() })
	return srv
}

// newRepo creates a served repository on branch master.
func newRepo(t *testing.T, srv *gitserver.Server, name string) *gitserver.Repo {
	t.Helper()
	repo, err := gitserver.NewRepo(srv.Root, name, t.TempDir(), "master")
	must(t, err)
	return repo
}

// commitFiles writes files into repo and commits them.
func commitFiles(t *testing.T, repo *gitserver.Repo, files map[string]string) string {
	t.Helper()
	must(t, repo.Write(files))
	c, err := repo.Commit("commit")
	must(t, err)
	return c
}

// addSubmodule adds the repository at cloneURL as a submodule at path with
// the system git, and records recorded (e.g. a relative URL) as its URL in
// .gitmodules. It does not commit.
func addSubmodule(t *testing.T, repo *gitserver.Repo, cloneURL, path, recorded string) {
	t.Helper()
	must(t, repo.Git("submodule", "add", "--quiet", cloneURL, path))
	if recorded != cloneURL {
		must(t, repo.Git("config", "-f", ".gitmodules", "submodule."+path+".url", recorded))
	}
}

// fetchSpec resolves and downloads the master branch of url with the spec
// changed by mutate.
func fetchSpec(t *testing.T, url string, mutate func(*sourcev1.GitRepositorySpec)) (*source.Content, error) {
	t.Helper()
	req := request(url, &sourcev1.GitRepositoryRef{Branch: "master"})
	if mutate != nil {
		mutate(req.GitRepository)
	}
	res, err := (&Source{}).Resolve(context.Background(), req)
	if err != nil {
		return nil, err
	}
	return res.Download(context.Background(), t.TempDir())
}

// archived writes content as the fetcher stages it and returns the
// regular files (name -> content) and the directories (with a trailing
// slash) of the tar.
func archived(t *testing.T, content *source.Content) (map[string]string, []string) {
	t.Helper()
	var buf bytes.Buffer
	if _, err := archive.WriteTarFS(context.Background(), &buf, content.Tree(), archive.TarOptions{Exclude: content.Exclude}); err != nil {
		t.Fatalf("archive: %v", err)
	}
	files := map[string]string{}
	var dirs []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		must(t, err)
		if h.Typeflag == tar.TypeDir {
			dirs = append(dirs, h.Name)
			continue
		}
		b, err := io.ReadAll(tr)
		must(t, err)
		files[h.Name] = string(b)
	}
	return files, dirs
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestSubmodules fetches a repository with a submodule at a relative URL
// (which has a nested submodule of its own) and one at an absolute URL.
func TestSubmodules(t *testing.T) {
	srv := newServer(t, "", "")
	nested := newRepo(t, srv, "nested")
	commitFiles(t, nested, map[string]string{"nested.txt": "nested"})
	lib := newRepo(t, srv, "lib")
	must(t, lib.Write(map[string]string{"lib.txt": "lib"}))
	addSubmodule(t, lib, srv.RepoURL("nested"), "deps/nested", "../nested.git")
	_, err := lib.Commit("lib with a nested submodule")
	must(t, err)
	other := newRepo(t, srv, "other")
	commitFiles(t, other, map[string]string{"other.txt": "other"})
	// A later commit of other that the parent does not point at.
	commitFiles(t, other, map[string]string{"other.txt": "newer"})
	otherFirst, err := other.Output("rev-parse", "HEAD~1")
	must(t, err)

	parent := newRepo(t, srv, "parent")
	must(t, parent.Write(map[string]string{"README.md": "parent"}))
	addSubmodule(t, parent, srv.RepoURL("lib"), "libs/lib", "../lib.git")
	addSubmodule(t, parent, srv.RepoURL("other"), "other", srv.RepoURL("other"))
	must(t, parent.Git("-C", "other", "checkout", "--quiet", otherFirst))
	_, err = parent.Commit("parent with submodules")
	must(t, err)

	cases := []struct {
		name    string
		recurse bool
		files   []string
		dirs    []string
	}{
		{name: "recursive", recurse: true,
			files: []string{"README.md", "libs/lib/deps/nested/nested.txt", "libs/lib/lib.txt", "other/other.txt"}},
		{name: "not recursive leaves empty directories", recurse: false,
			files: []string{"README.md"}, dirs: []string{"libs/", "libs/lib/", "other/"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			content, err := fetchSpec(t, srv.RepoURL("parent"), func(s *sourcev1.GitRepositorySpec) { s.RecurseSubmodules = tc.recurse })
			if err != nil {
				t.Fatalf("fetch: %v", err)
			}
			files, dirs := archived(t, content)
			if got := sortedKeys(files); !reflect.DeepEqual(got, tc.files) {
				t.Errorf("archived files = %v, want %v", got, tc.files)
			}
			if tc.recurse && files["other/other.txt"] != "other" {
				t.Errorf("other/other.txt = %q, want the recorded commit's %q", files["other/other.txt"], "other")
			}
			if tc.dirs != nil && !reflect.DeepEqual(dirs, tc.dirs) {
				t.Errorf("archived directories = %v, want %v", dirs, tc.dirs)
			}
			for _, d := range dirs {
				if strings.Contains(d, ".git") {
					t.Errorf("archive holds git metadata %q", d)
				}
			}
		})
	}
}

// TestSubmoduleCredentials checks that the source's credentials go to
// submodules on the same server only.
func TestSubmoduleCredentials(t *testing.T) {
	srv := newServer(t, "flux", "s3cr3t")
	elsewhere := newServer(t, "flux", "s3cr3t")
	withAuth := func(u string) string { return strings.Replace(u, "http://", "http://flux:s3cr3t@", 1) }

	lib := newRepo(t, srv, "lib")
	commitFiles(t, lib, map[string]string{"lib.txt": "lib"})
	far := newRepo(t, elsewhere, "far")
	commitFiles(t, far, map[string]string{"far.txt": "far"})

	same := newRepo(t, srv, "same")
	must(t, same.Write(map[string]string{"README.md": "same"}))
	addSubmodule(t, same, withAuth(srv.RepoURL("lib")), "lib", "../lib.git")
	_, err := same.Commit("same server")
	must(t, err)

	other := newRepo(t, srv, "other")
	must(t, other.Write(map[string]string{"README.md": "other"}))
	addSubmodule(t, other, withAuth(elsewhere.RepoURL("far")), "far", elsewhere.RepoURL("far"))
	_, err = other.Commit("other server")
	must(t, err)

	recurse := func(s *sourcev1.GitRepositorySpec) { s.RecurseSubmodules = true }
	content, err := fetchSpec(t, withAuth(srv.RepoURL("same")), recurse)
	if err != nil {
		t.Fatalf("fetch with a submodule on the same server: %v", err)
	}
	if files, _ := archived(t, content); files["lib/lib.txt"] != "lib" {
		t.Errorf("lib/lib.txt = %q, want %q", files["lib/lib.txt"], "lib")
	}

	_, err = fetchSpec(t, withAuth(srv.RepoURL("other")), recurse)
	checkFailure(t, err, sourcev1.AuthenticationFailedReason, false,
		"failed to checkout and determine revision: unable to clone submodule 'far' from '"+elsewhere.RepoURL("far")+"': authentication required")
}

// TestSubmoduleFailures checks the failures a repository's submodules can
// cause.
func TestSubmoduleFailures(t *testing.T) {
	srv := newServer(t, "", "")
	lib := newRepo(t, srv, "lib")
	commitFiles(t, lib, map[string]string{"lib.txt": "lib"})
	cases := []struct {
		name     string
		recorded string
		reason   string
		message  string
		final    bool
	}{
		{name: "local path", recorded: lib.Bare, final: true,
			message: "unable to update submodule 'lib': URL 'file://" + lib.Bare + "' is not allowed: submodules are fetched over http, https or ssh only"},
		{name: "file URL", recorded: "file://" + lib.Bare, final: true,
			message: "is not allowed: submodules are fetched over http, https or ssh only"},
		{name: "missing repository", recorded: "../missing.git",
			message: "unable to clone submodule 'lib' from '" + srv.RepoURL("missing") + "': repository not found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ReplaceAll(tc.name, " ", "-")
			repo := newRepo(t, srv, name)
			must(t, repo.Write(map[string]string{"README.md": name}))
			addSubmodule(t, repo, srv.RepoURL("lib"), "lib", tc.recorded)
			_, err := repo.Commit("submodule")
			must(t, err)
			_, err = fetchSpec(t, srv.RepoURL(name), func(s *sourcev1.GitRepositorySpec) { s.RecurseSubmodules = true })
			checkFailure(t, err, sourcev1.GitOperationFailedReason, false, tc.message)
			var ferr *failure.Error
			if errors.As(err, &ferr) && (ferr.Handling == failure.Final) != tc.final {
				t.Errorf("handling = %v, want final %v", ferr.Handling, tc.final)
			}
			// Without recursion the submodule is not looked at.
			if _, err := fetchSpec(t, srv.RepoURL(name), nil); err != nil {
				t.Errorf("fetch without recursion: %v", err)
			}
		})
	}
}

// TestSparseCheckout checks that only the listed directories are checked
// out, with or without submodules elsewhere in the tree.
func TestSparseCheckout(t *testing.T) {
	srv := newServer(t, "", "")
	lib := newRepo(t, srv, "lib")
	commitFiles(t, lib, map[string]string{"lib.txt": "lib"})
	repo := newRepo(t, srv, "mono")
	must(t, repo.Write(map[string]string{
		"README.md": "mono", ".sourceignore": "*.md\n",
		"deploy/app.yaml": "app", "deploy/base/kustomization.yaml": "base",
		"deploy-staging/app.yaml": "staging", "deployment.yaml": "sibling",
		"apps/a.yaml": "a",
	}))
	addSubmodule(t, repo, srv.RepoURL("lib"), "apps/lib", "../lib.git")
	// A submodule that cannot be fetched: only checked out if its
	// directory is.
	addSubmodule(t, repo, srv.RepoURL("lib"), "vendor/broken", "../missing.git")
	commit, err := repo.Commit("monorepo")
	must(t, err)

	deploy := []string{"deploy/app.yaml", "deploy/base/kustomization.yaml"}
	cases := []struct {
		name    string
		sparse  []string
		ref     *sourcev1.GitRepositoryRef
		recurse bool
		files   []string
	}{
		{name: "one directory", sparse: []string{"deploy"}, files: deploy},
		{name: "leading ./ and trailing slash", sparse: []string{"./deploy/"}, files: deploy},
		{name: "nested directory", sparse: []string{"deploy/base"}, files: []string{"deploy/base/kustomization.yaml"}},
		{name: "two directories with a submodule", sparse: []string{"apps", "deploy"}, recurse: true,
			files: append([]string{"apps/a.yaml", "apps/lib/lib.txt"}, deploy...)},
		{name: "at a commit", sparse: []string{"deploy"}, ref: &sourcev1.GitRepositoryRef{Commit: commit}, files: deploy},
		{name: "missing directory", sparse: []string{"nope"}, files: []string{}},
		{name: "root is everything", sparse: []string{"."},
			files: []string{".sourceignore", "apps/a.yaml", "deploy-staging/app.yaml", "deploy/app.yaml", "deploy/base/kustomization.yaml", "deployment.yaml"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			content, err := fetchSpec(t, srv.RepoURL("mono"), func(s *sourcev1.GitRepositorySpec) {
				s.SparseCheckout = tc.sparse
				s.RecurseSubmodules = tc.recurse
				if tc.ref != nil {
					s.Reference = tc.ref
				}
			})
			if err != nil {
				t.Fatalf("fetch: %v", err)
			}
			files, _ := archived(t, content)
			if got := sortedKeys(files); !reflect.DeepEqual(got, tc.files) {
				t.Errorf("archived files = %v, want %v", got, tc.files)
			}
		})
	}

	// Without a sparse checkout, the broken submodule is fetched and fails.
	_, err = fetchSpec(t, srv.RepoURL("mono"), func(s *sourcev1.GitRepositorySpec) { s.RecurseSubmodules = true })
	checkFailure(t, err, sourcev1.GitOperationFailedReason, false, "unable to clone submodule 'vendor/broken'")
}

func TestSparseDirs(t *testing.T) {
	cases := []struct {
		in   []string
		want []string
	}{
		{in: nil, want: nil},
		{in: []string{}, want: nil},
		{in: []string{"deploy"}, want: []string{"deploy/"}},
		{in: []string{"./deploy/", "/apps//base/"}, want: []string{"deploy/", "apps/base/"}},
		{in: []string{"../up"}, want: []string{"up/"}},
		{in: []string{"deploy", "."}, want: nil},
		{in: []string{"./"}, want: nil},
	}
	for _, tc := range cases {
		if got := sparseDirs(tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("sparseDirs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestSymlinks checks that links inside the tree become copies and that
// links leading outside it are dropped before anything reads them: an
// outside .sourceignore is not read, an outside file or directory is not
// archived.
func TestSymlinks(t *testing.T) {
	outside := t.TempDir()
	must(t, os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("secret"), 0o644))
	// Read as a .sourceignore, it would leave deploy/ out and bring the
	// default exclusions (logo.png) back in.
	must(t, os.WriteFile(filepath.Join(outside, "ignore"), []byte("deploy/\n"), 0o644))

	srv := newServer(t, "", "")
	repo := newRepo(t, srv, "links")
	must(t, repo.Write(map[string]string{"README.md": "readme", "deploy/app.yaml": "app", "logo.png": "png"}))
	links := map[string]string{
		"alias.md":      "README.md",
		"conf":          "deploy",
		".sourceignore": filepath.Join(outside, "ignore"),
		"secret.txt":    filepath.Join(outside, "secret.txt"),
		"outside":       outside,
		"gitconfig":     "../git/config", // the fetcher's object store beside the tree
		"up/escape":     "../../../../../../../../../../etc/hostname",
		"dangling":      "nope",
		"loop":          ".",
	}
	for name, target := range links {
		p := filepath.Join(repo.Dir, filepath.FromSlash(name))
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.Symlink(target, p))
	}
	_, err := repo.Commit("links")
	must(t, err)

	content, err := fetchSpec(t, srv.RepoURL("links"), nil)
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	err = filepath.WalkDir(content.Root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSymlink != 0 {
			t.Errorf("symbolic link %s left in the tree", p)
		}
		return err
	})
	must(t, err)
	files, dirs := archived(t, content)
	want := map[string]string{"README.md": "readme", "alias.md": "readme", "conf/app.yaml": "app", "deploy/app.yaml": "app"}
	if !reflect.DeepEqual(files, want) {
		t.Errorf("archived files = %v, want %v", files, want)
	}
	if want := []string{"conf/", "deploy/", "up/"}; !reflect.DeepEqual(dirs, want) {
		t.Errorf("archived directories = %v, want %v", dirs, want)
	}
}

// TestSymlinkFarmIsBounded builds a link farm whose size doubles with every
// level (each level links twice to the one below): resolving it stops at
// the bound instead of filling the disk, and says why.
func TestSymlinkFarmIsBounded(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	const levels = 12 // 16 KiB * 2^12 = 64 MiB unbounded
	// Level i is named so that it is resolved before level i+1 (links are
	// resolved in reverse walk order), as an attacker would name them.
	level := func(i int) string {
		if i == 0 {
			return "base"
		}
		return fmt.Sprintf("l%02d", levels-i)
	}
	must(os.MkdirAll(filepath.Join(root, level(0)), 0o755))
	must(os.WriteFile(filepath.Join(root, level(0), "blob"), make([]byte, 16<<10), 0o644))
	for i := 1; i <= levels; i++ {
		dir := filepath.Join(root, level(i))
		must(os.MkdirAll(dir, 0o755))
		for _, name := range []string{"a", "b"} {
			must(os.Symlink("../"+level(i-1), filepath.Join(dir, name)))
		}
	}
	const maxBytes = 1 << 20
	err := resolveSymlinksWithin(context.Background(), root, maxBytes, MaxLinkCopyFiles)
	if !errors.Is(err, ErrLinksTooLarge) {
		t.Fatalf("resolving the farm: %v, want ErrLinksTooLarge", err)
	}
	var total int64
	must(filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			fi, err := d.Info()
			if err == nil {
				total += fi.Size()
			}
		}
		return err
	}))
	if total > maxBytes+16<<10 {
		t.Errorf("the farm grew the tree to %d bytes, over the bound of %d", total, maxBytes)
	}

	// A cancelled fetch stops resolving at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := resolveSymlinks(ctx, t.TempDir()); err != nil {
		t.Errorf("a tree without links: %v", err)
	}
	farm := t.TempDir()
	must(os.MkdirAll(filepath.Join(farm, "d"), 0o755))
	must(os.WriteFile(filepath.Join(farm, "d", "f"), []byte("x"), 0o644))
	must(os.Symlink("d", filepath.Join(farm, "link")))
	if err := resolveSymlinks(ctx, farm); !errors.Is(err, context.Canceled) {
		t.Errorf("resolving after cancellation: %v, want context.Canceled", err)
	}
}
