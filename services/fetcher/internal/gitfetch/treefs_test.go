package gitfetch

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// stagedBytes is the tar the fetcher stages for content.
func stagedBytes(t *testing.T, content *source.Content) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := archive.WriteTarFS(context.Background(), &buf, content.Tree(), archive.TarOptions{Exclude: content.Exclude}); err != nil {
		t.Fatalf("archive: %v", err)
	}
	return buf.Bytes()
}

// TestPlainTreeArchivesAsCheckout: a tree archived straight from the
// packfile gives the bytes its checkout gives (so the same commit has the
// same digest either way): names that git and a file system order
// differently, an executable, nested directories, ignore rules from a
// .sourceignore below the root and from the spec, and the default
// exclusions. A tree that needs a checkout (a symbolic link) is checked
// out.
func TestPlainTreeArchivesAsCheckout(t *testing.T) {
	srv := newServer(t, "", "")
	repo := newRepo(t, srv, "plain")
	commitFiles(t, repo, map[string]string{
		"a.b":                 "file before the directory in git's order",
		"a/x.yaml":            "in a directory",
		"a-b/y.yaml":          "dash",
		"deep/er/still/z.txt": "deep",
		"deep/.sourceignore":  "*.log\n",
		"deep/er/debug.log":   "ignored below deep",
		"top.log":             "kept: the .sourceignore is scoped to deep",
		"ci/.github/x.yml":    "excluded by default? no: .sourceignore exists",
		"script.sh":           "#!/bin/sh\n",
	})
	must(t, os.Chmod(filepath.Join(repo.Dir, "script.sh"), 0o755))
	_, err := repo.Commit("executable")
	must(t, err)

	ignore := "/a-b/\n"
	for _, mutate := range []func(*sourcev1.GitRepositorySpec){
		nil,
		func(s *sourcev1.GitRepositorySpec) { s.Ignore = &ignore },
	} {
		plain, err := fetchSpec(t, srv.RepoURL("plain"), mutate)
		must(t, err)
		if plain.FS == nil || plain.Root != "" {
			t.Fatalf("a plain tree was checked out (FS %v, Root %q)", plain.FS, plain.Root)
		}
		// recurseSubmodules without submodules changes nothing but the
		// path: the tree is checked out.
		checkedOut, err := fetchSpec(t, srv.RepoURL("plain"), func(s *sourcev1.GitRepositorySpec) {
			if mutate != nil {
				mutate(s)
			}
			s.RecurseSubmodules = true
		})
		must(t, err)
		if checkedOut.FS != nil {
			t.Fatal("recurseSubmodules did not check the tree out")
		}
		if a, b := stagedBytes(t, plain), stagedBytes(t, checkedOut); !bytes.Equal(a, b) {
			files, dirs := archived(t, plain)
			wantFiles, wantDirs := archived(t, checkedOut)
			t.Errorf("from the packfile: %v %v\nchecked out: %v %v", sortedKeys(files), dirs, sortedKeys(wantFiles), wantDirs)
		}
		if plain.Revision != checkedOut.Revision || plain.EventMessage != checkedOut.EventMessage {
			t.Errorf("revision %q / %q, message %q / %q", plain.Revision, checkedOut.Revision, plain.EventMessage, checkedOut.EventMessage)
		}
	}
	plain, err := fetchSpec(t, srv.RepoURL("plain"), nil)
	must(t, err)
	files, _ := archived(t, plain)
	for name, kept := range map[string]bool{"a.b": true, "top.log": true, "deep/er/debug.log": false, "script.sh": true} {
		if _, ok := files[name]; ok != kept {
			t.Errorf("%s archived: %v, want %v", name, ok, kept)
		}
	}
	info, err := fs.Stat(plain.Tree(), "script.sh")
	must(t, err)
	if info.Mode().Perm() != 0o755 {
		t.Errorf("script.sh mode %v, want 0755", info.Mode())
	}

	must(t, os.Symlink("a.b", filepath.Join(repo.Dir, "link")))
	_, err = repo.Commit("a link")
	must(t, err)
	linked, err := fetchSpec(t, srv.RepoURL("plain"), nil)
	must(t, err)
	if linked.FS != nil || linked.Root == "" {
		t.Error("a tree with a symbolic link was not checked out")
	}
}

// TestPlainName: names a checkout must judge are not taken as they are.
func TestPlainName(t *testing.T) {
	for name, want := range map[string]bool{
		"README.md": true, ".sourceignore": true, ".gitignore": true, "a-b_c+d@e=f,g%h#i~j": true,
		"": false, ".": false, "..": false, ".git": false, ".GIT": false, "git~1": false, "trailing.": false,
		"a b": false, `a\b`: false, "a:b": false, "a/b": false, "caf\u00e9": false, "tab\t": false,
	} {
		if got := plainName(name); got != want {
			t.Errorf("plainName(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestUnsafeTreePath: a commit whose tree holds an entry no checkout may
// write (pushed by a client that skips git's checks) fails with
// ErrUnsafeTreePath naming the entry, as a Final GitOperationFailed, with
// or without a checkout.
func TestUnsafeTreePath(t *testing.T) {
	tests := []struct {
		name string
		// root is the root tree's one entry, given the id of a tree
		// holding a file "evil".
		root func(t *testing.T, dir, evil string) (mode, name, id string)
		path string
	}{
		{name: "dotdot", path: "'..'", root: func(_ *testing.T, _, evil string) (string, string, string) { return "40000", "..", evil }},
		{name: "dotgit", path: "'.GIT'", root: func(_ *testing.T, _, evil string) (string, string, string) { return "40000", ".GIT", evil }},
		{name: "nested", path: "'sub/..'", root: func(t *testing.T, dir, evil string) (string, string, string) {
			return "40000", "sub", hashObject(t, dir, "tree", treeBytes(t, "40000", "..", evil))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newServer(t, "", "")
			repo := newRepo(t, srv, "hostile")
			evil := hashObject(t, repo.Dir, "tree", treeBytes(t, "100644", "evil", hashObject(t, repo.Dir, "blob", []byte("x"))))
			mode, name, id := tt.root(t, repo.Dir, evil)
			tree := hashObject(t, repo.Dir, "tree", treeBytes(t, mode, name, id))
			c, err := repo.Output("commit-tree", tree, "-m", "hostile")
			must(t, err)
			must(t, repo.Git("push", "--quiet", "origin", c+":refs/heads/master"))
			for _, submodules := range []bool{false, true} {
				_, err := fetchSpec(t, srv.RepoURL("hostile"), func(s *sourcev1.GitRepositorySpec) { s.RecurseSubmodules = submodules })
				f := failure.As(err)
				if !errors.Is(err, ErrUnsafeTreePath) || f == nil || f.Handling != failure.Final || f.Reason != sourcev1.GitOperationFailedReason ||
					!strings.Contains(err.Error(), tt.path) {
					t.Errorf("submodules %v: %v (%+v), want a Final GitOperationFailed naming %s", submodules, err, f, tt.path)
				}
			}
		})
	}
}

// hashObject writes an object into the repository at dir without git's
// checks and returns its id.
func hashObject(t *testing.T, dir, typ string, content []byte) string {
	t.Helper()
	cmd := exec.Command("git", "hash-object", "--literally", "-w", "-t", typ, "--stdin")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	cmd.Stdin = bytes.NewReader(content)
	out, err := cmd.Output()
	must(t, err)
	return strings.TrimSpace(string(out))
}

// treeBytes is a tree object of one entry.
func treeBytes(t *testing.T, mode, name, id string) []byte {
	t.Helper()
	bin, err := hex.DecodeString(id)
	must(t, err)
	return append([]byte(mode+" "+name+"\x00"), bin...)
}
