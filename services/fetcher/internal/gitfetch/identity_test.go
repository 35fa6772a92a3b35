package gitfetch

import (
	"context"
	"crypto/rand"
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

func TestContentIdentity(t *testing.T) {
	ignore, empty := "*.md\n", ""
	base := func() *resolved {
		return &resolved{url: "https://git.example.com/org/repo.git", creds: &credentials{fingerprint: "digest-of-creds"}}
	}
	identity := func(t *testing.T, r *resolved) []string {
		t.Helper()
		parts, ok := r.ContentIdentity()
		if !ok {
			t.Fatal("not shareable")
		}
		return parts
	}
	want := identity(t, base())

	same := map[string]func(*resolved){
		"credentials in the URL":               func(r *resolved) { r.url = "https://user:s3cr3t@git.example.com/org/repo.git" },
		"other credentials without submodules": func(r *resolved) { r.creds = &credentials{fingerprint: "digest-of-other"} },
	}
	for name, mutate := range same {
		r := base()
		mutate(r)
		got := identity(t, r)
		if !slices.Equal(got, want) {
			t.Errorf("%s: identity %q, want %q", name, got, want)
		}
		if strings.Contains(strings.Join(got, " "), "s3cr3t") {
			t.Errorf("%s: identity %q holds the password", name, got)
		}
	}
	differ := map[string]func(*resolved){
		"another URL":         func(r *resolved) { r.url = "https://git.example.com/org/other.git" },
		"ignore rules":        func(r *resolved) { r.ignore = &ignore },
		"empty ignore rules":  func(r *resolved) { r.ignore = &empty },
		"sparse checkout":     func(r *resolved) { r.sparse = []string{"deploy/"} },
		"recursed submodules": func(r *resolved) { r.submodules = true },
	}
	seen := map[string]string{strings.Join(want, "\x00"): "base"}
	for name, mutate := range differ {
		r := base()
		mutate(r)
		k := strings.Join(identity(t, r), "\x00")
		if prev, dup := seen[k]; dup {
			t.Errorf("%s: same identity as %s", name, prev)
		}
		seen[k] = name
	}
	// Submodules are shared only between sources with the same
	// credentials, by content: a Secret whose key was rotated (same name,
	// other data) is another identity.
	a, b := base(), base()
	a.submodules, b.submodules, b.creds = true, true, &credentials{fingerprint: "digest-of-the-rotated-secret"}
	if slices.Equal(identity(t, a), identity(t, b)) {
		t.Error("sources with submodules and different credentials share content")
	}
	// Sparse directories in any order are the same checkout.
	a, b = base(), base()
	a.sparse, b.sparse = []string{"a/", "b/"}, []string{"b/", "a/"}
	if !slices.Equal(identity(t, a), identity(t, b)) {
		t.Error("the order of sparse directories changed the identity")
	}
	// A verified source shares nothing.
	r := base()
	r.verify = &verification{mode: sourcev1.ModeGitHEAD}
	if _, ok := r.ContentIdentity(); ok {
		t.Error("a verified source is shareable")
	}
}

// TestProveAccess checks that a source naming a commit, which resolves
// without asking the remote, lists it before reusing content, with its
// own credentials.
func TestProveAccess(t *testing.T) {
	f := newFixture(t, "git", "right")
	src := &Source{Secrets: fakeSecrets(t, map[string]map[string]string{
		"good": {"username": "git", "password": "right"},
		"bad":  {"username": "git", "password": "wrong"},
	})}
	for _, tc := range []struct {
		secret string
		ok     bool
	}{{"good", true}, {"bad", false}} {
		req := request(f.url, &sourcev1.GitRepositoryRef{Commit: f.c1})
		req.GitRepository.SecretRef = &meta.LocalObjectReference{Name: tc.secret}
		res, err := src.Resolve(context.Background(), req)
		if err != nil {
			t.Fatalf("%s: resolving a commit: %v", tc.secret, err)
		}
		err = res.(*resolved).ProveAccess(context.Background())
		if (err == nil) != tc.ok {
			t.Errorf("%s: ProveAccess = %v, want success %v", tc.secret, err, tc.ok)
		}
	}
}

// TestDownloadLargeFiles checks out files over the size go-git streams
// instead of reading whole.
func TestDownloadLargeFiles(t *testing.T) {
	root := t.TempDir()
	repo, err := gitserver.NewRepo(root, "big", t.TempDir(), "master")
	must(t, err)
	big := make([]byte, 3*largeObjectThreshold+17)
	_, _ = rand.Read(big)
	must(t, repo.Write(map[string]string{"big.bin": string(big), "small.txt": "small"}))
	_, err = repo.Commit("large file")
	must(t, err)
	srv := &gitserver.Server{Root: root}
	must(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = srv.Stop() })

	res, err := (&Source{}).Resolve(context.Background(), request(srv.RepoURL("big"), nil))
	must(t, err)
	content, err := res.Download(context.Background(), t.TempDir())
	must(t, err)
	got, err := fs.ReadFile(content.Tree(), "big.bin")
	must(t, err)
	if string(got) != string(big) {
		t.Fatalf("big.bin: %d bytes checked out, want the %d committed", len(got), len(big))
	}
}
