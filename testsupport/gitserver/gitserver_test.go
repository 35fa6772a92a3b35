package gitserver_test

import (
	"bytes"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// git runs the system git as a client would, with no user configuration and
// no way to prompt for credentials.
func git(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=", "SSH_ASKPASS=",
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stderr.String(), err
	}
	return strings.TrimSpace(stdout.String()), nil
}

func mustGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := git(t, dir, args...)
	if err != nil {
		t.Fatalf("git %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out
}

func start(t *testing.T, s *gitserver.Server) {
	t.Helper()
	if s.Root == "" {
		s.Root = t.TempDir()
	}
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
}

var commitHash = regexp.MustCompile(`^[0-9a-f]{40}$`)

func TestCloneOverHTTP(t *testing.T) {
	srv := &gitserver.Server{}
	start(t, srv)
	if !strings.HasPrefix(srv.URL(), "http://127.0.0.1:") {
		t.Errorf("URL %q", srv.URL())
	}
	if got, want := srv.RepoURL("podinfo"), srv.URL()+"/podinfo.git"; got != want {
		t.Errorf("RepoURL %q, want %q", got, want)
	}

	repo, err := gitserver.NewRepo(srv.Root, "podinfo", filepath.Join(t.TempDir(), "work"), "main")
	if err != nil {
		t.Fatal(err)
	}
	if repo.Bare != filepath.Join(srv.Root, "podinfo.git") {
		t.Errorf("Bare %q", repo.Bare)
	}
	first := map[string]string{
		"README.md":             "# podinfo\n",
		"deploy/app/deploy.yml": "kind: Deployment\n",
	}
	if err := repo.Write(first); err != nil {
		t.Fatal(err)
	}
	c1, err := repo.Commit("Add README")
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Tag("v1.0.0", ""); err != nil {
		t.Fatal(err)
	}
	if err := repo.Write(map[string]string{"README.md": "# podinfo v2\n", "NOTES": "notes\n"}); err != nil {
		t.Fatal(err)
	}
	c2, err := repo.Commit("Second release")
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Tag("v2.0.0", "Release 2.0.0"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{c1, c2} {
		if !commitHash.MatchString(c) {
			t.Fatalf("commit hash %q", c)
		}
	}
	if c1 == c2 {
		t.Fatal("two commits, one hash")
	}

	if l, f := srv.Counts(); l != 0 || f != 0 {
		t.Errorf("before any request: %d listings, %d fetches", l, f)
	}
	mustGit(t, "", "ls-remote", srv.RepoURL("podinfo"))
	if l, f := srv.Counts(); l != 1 || f != 0 {
		t.Errorf("after ls-remote: %d listings, %d fetches, want 1 and 0", l, f)
	}
	dest := filepath.Join(t.TempDir(), "clone")
	mustGit(t, "", "clone", "--quiet", srv.RepoURL("podinfo"), dest)
	if l, f := srv.Counts(); l != 2 || f < 1 {
		t.Errorf("after ls-remote and clone: %d listings, %d fetches, want 2 and at least 1", l, f)
	}
	if n, other := srv.ListingsOf("podinfo"), srv.ListingsOf("other"); n != 2 || other != 0 {
		t.Errorf("listings of podinfo %d, of other %d; want 2 and 0", n, other)
	}
	if _, f := srv.Counts(); srv.FetchesOf("podinfo") != f || srv.FetchesOf("other") != 0 {
		t.Errorf("fetches of podinfo %d, of other %d; want %d and 0", srv.FetchesOf("podinfo"), srv.FetchesOf("other"), f)
	}
	if got := mustGit(t, dest, "rev-parse", "HEAD"); got != c2 {
		t.Errorf("cloned HEAD %s, want %s", got, c2)
	}
	if got := mustGit(t, dest, "rev-parse", "--abbrev-ref", "HEAD"); got != "main" {
		t.Errorf("cloned branch %q, want main", got)
	}
	want := map[string]string{
		"README.md":             "# podinfo v2\n",
		"deploy/app/deploy.yml": "kind: Deployment\n",
		"NOTES":                 "notes\n",
	}
	for p, content := range want {
		b, err := os.ReadFile(filepath.Join(dest, filepath.FromSlash(p)))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if string(b) != content {
			t.Errorf("%s: %q, want %q", p, b, content)
		}
	}
	if got := mustGit(t, dest, "log", "--format=%s|%an <%ae>"); got != "Second release|Headwater <headwater@example.com>\nAdd README|Headwater <headwater@example.com>" {
		t.Errorf("log:\n%s", got)
	}
	if got := mustGit(t, dest, "rev-parse", "v1.0.0^{commit}"); got != c1 {
		t.Errorf("v1.0.0 is %s, want %s", got, c1)
	}
	if got := mustGit(t, dest, "rev-parse", "v2.0.0^{commit}"); got != c2 {
		t.Errorf("v2.0.0 is %s, want %s", got, c2)
	}
	if got := mustGit(t, dest, "cat-file", "-t", "v1.0.0"); got != "commit" {
		t.Errorf("v1.0.0 is a %s, want a lightweight tag", got)
	}
	if got := mustGit(t, dest, "cat-file", "-t", "v2.0.0"); got != "tag" {
		t.Errorf("v2.0.0 is a %s, want an annotated tag", got)
	}
	if got := mustGit(t, dest, "tag", "-l", "--format=%(contents:subject)", "v2.0.0"); got != "Release 2.0.0" {
		t.Errorf("v2.0.0 message %q", got)
	}

	// ls-remote sees the advertised refs.
	refs := mustGit(t, "", "ls-remote", srv.RepoURL("podinfo"))
	for _, line := range []string{c2 + "\trefs/heads/main", c1 + "\trefs/tags/v1.0.0", c2 + "\trefs/tags/v2.0.0^{}"} {
		if !slices.Contains(strings.Split(refs, "\n"), line) {
			t.Errorf("ls-remote lacks %q:\n%s", line, refs)
		}
	}

	// A second branch is pushed too; an empty commit still makes a commit.
	if err := repo.Git("checkout", "--quiet", "-b", "dev"); err != nil {
		t.Fatal(err)
	}
	c3, err := repo.Commit("Empty on dev")
	if err != nil {
		t.Fatal(err)
	}
	if c3 == c2 || !commitHash.MatchString(c3) {
		t.Fatalf("empty commit hash %q", c3)
	}
	if out, err := repo.Output("rev-parse", "HEAD~1"); err != nil || out != c2 {
		t.Errorf("Output(rev-parse HEAD~1) = %q, %v; want %s", out, err, c2)
	}
	dev := filepath.Join(t.TempDir(), "dev")
	mustGit(t, "", "clone", "--quiet", "--branch", "dev", srv.RepoURL("podinfo"), dev)
	if got := mustGit(t, dev, "rev-parse", "HEAD"); got != c3 {
		t.Errorf("dev HEAD %s, want %s", got, c3)
	}

	// Shallow clones (what fetchers do) work over smart HTTP.
	shallow := filepath.Join(t.TempDir(), "shallow")
	mustGit(t, "", "clone", "--quiet", "--depth", "1", "--branch", "v1.0.0", srv.RepoURL("podinfo"), shallow)
	if got := mustGit(t, shallow, "rev-parse", "HEAD"); got != c1 {
		t.Errorf("shallow clone at v1.0.0: HEAD %s, want %s", got, c1)
	}

	if out, err := git(t, "", "ls-remote", srv.RepoURL("missing")); err == nil {
		t.Errorf("a missing repository was listed: %s", out)
	}
}

func TestRepoErrors(t *testing.T) {
	r := &gitserver.Repo{Dir: t.TempDir()}
	err := r.Git("log")
	if err == nil || !strings.Contains(err.Error(), "git log") || !strings.Contains(err.Error(), "not a git repository") {
		t.Errorf("git in a non-repository: error %v, want one naming the command and git's reason", err)
	}
	if _, err := r.Output("rev-parse", "HEAD"); err == nil {
		t.Error("Output in a non-repository: no error")
	}
	if _, err := r.Commit("nothing"); err == nil {
		t.Error("Commit in a non-repository: no error")
	}
	if _, err := gitserver.NewRepo(filepath.Join(t.TempDir(), "file"), "r", t.TempDir(), "main"); err != nil {
		// A root that does not exist yet is created by git init.
		t.Errorf("NewRepo with a new root: %v", err)
	}
}

func TestBasicAuth(t *testing.T) {
	srv := &gitserver.Server{Username: "flux", Password: "s3cr3t"}
	start(t, srv)
	repo, err := gitserver.NewRepo(srv.Root, "private", filepath.Join(t.TempDir(), "work"), "main")
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Write(map[string]string{"secret.txt": "classified\n"}); err != nil {
		t.Fatal(err)
	}
	c, err := repo.Commit("Private")
	if err != nil {
		t.Fatal(err)
	}

	withCreds := func(user, pass string) string {
		u, err := url.Parse(srv.RepoURL("private"))
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(user, pass)
		return u.String()
	}

	tests := []struct {
		name string
		url  string
		ok   bool
	}{
		{"anonymous", srv.RepoURL("private"), false},
		{"wrong password", withCreds("flux", "wrong"), false},
		{"wrong user", withCreds("other", "s3cr3t"), false},
		{"right credentials", withCreds("flux", "s3cr3t"), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := git(t, "", "ls-remote", tc.url)
			if !tc.ok {
				if err == nil {
					t.Fatalf("ls-remote succeeded: %s", out)
				}
				// Refused for want of credentials, not for another reason.
				if !strings.Contains(out, "Authentication failed") && !strings.Contains(out, "could not read Username") {
					t.Errorf("ls-remote failed, but not on authentication: %s", out)
				}
				t.Log(strings.TrimSpace(out))
				return
			}
			if err != nil {
				t.Fatalf("ls-remote: %v: %s", err, out)
			}
			if !strings.Contains(out, c+"\trefs/heads/main") {
				t.Errorf("ls-remote:\n%s", out)
			}
		})
	}

	dest := filepath.Join(t.TempDir(), "clone")
	mustGit(t, "", "clone", "--quiet", withCreds("flux", "s3cr3t"), dest)
	if b, err := os.ReadFile(filepath.Join(dest, "secret.txt")); err != nil || string(b) != "classified\n" {
		t.Errorf("secret.txt: %q, %v", b, err)
	}

	// The challenge is a plain 401 with a Basic challenge, as real servers send.
	resp, err := http.Get(srv.RepoURL("private") + "/info/refs?service=git-upload-pack")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic") {
		t.Errorf("anonymous request: %s, WWW-Authenticate %q", resp.Status, resp.Header.Get("WWW-Authenticate"))
	}
	req, err := http.NewRequest(http.MethodGet, srv.RepoURL("private")+"/info/refs?service=git-upload-pack", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("flux", "s3cr3t")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-git-upload-pack-advertisement" {
		t.Errorf("authenticated request: %s, Content-Type %q", resp.Status, resp.Header.Get("Content-Type"))
	}
}

func TestStop(t *testing.T) {
	var never gitserver.Server
	if err := never.Stop(); err != nil {
		t.Errorf("Stop before Start: %v", err)
	}
	srv := &gitserver.Server{Root: t.TempDir()}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.Get(srv.URL() + "/x.git/info/refs"); err == nil {
		resp.Body.Close()
		t.Error("the server still answers after Stop")
	}
	if err := (&gitserver.Server{Root: t.TempDir()}).Start("256.0.0.1:0"); err == nil {
		t.Error("Start on an invalid address: no error")
	}
}
