// Package gitserver serves git repositories over smart HTTP with the real
// `git http-backend`, for tests and for the sample repository of `make run`.
// It also creates and commits to repositories with the git command line, so
// what a fetcher sees is exactly what a real server would serve.
package gitserver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server serves every bare repository under Root at http://<addr>/<name>.git.
type Server struct {
	// Root holds the bare repositories, <name>.git.
	Root string
	// Username and Password, when set, require HTTP basic auth.
	Username, Password string
	// BearerToken, when set, requires an "Authorization: Bearer" header
	// with it (basic auth is then accepted as well if Username is set).
	BearerToken string
	// Authorize, when set, decides which requests are let in, instead of
	// Username, Password and BearerToken: say, only those carrying a
	// token a token server issued and that has not expired.
	Authorize func(*http.Request) bool

	srv *http.Server
	url string

	listings, fetches atomic.Int64
	// byRepo counts the listings of each repository, by name, and
	// fetchesByRepo its fetches of objects.
	byRepo, fetchesByRepo sync.Map // string -> *atomic.Int64
}

// Counts reports how many reference listings (GET .../info/refs, what
// `git ls-remote` and the start of every clone or fetch ask for) and how
// many fetches of objects (a POST .../git-upload-pack that is not protocol
// v2's ls-refs command: a clone or a pull) the server has answered since
// it started.
func (s *Server) Counts() (listings, fetches int64) {
	return s.listings.Load(), s.fetches.Load()
}

// ListingsOf reports how many reference listings of the repository name
// the server has answered since it started.
func (s *Server) ListingsOf(name string) int64 {
	if n, ok := s.byRepo.Load(name); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// FetchesOf reports how many fetches of objects (as Counts counts them)
// of the repository name the server has answered since it started.
func (s *Server) FetchesOf(name string) int64 {
	if n, ok := s.fetchesByRepo.Load(name); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// lsRefs is how a protocol v2 request listing references starts.
var lsRefs = []byte("command=ls-refs")

// count counts r among the listings or fetches. It peeks at the start of
// an upload-pack request's body, which it replaces with a reader that
// still returns every byte.
func (s *Server) count(r *http.Request) {
	switch {
	case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/info/refs"):
		s.listings.Add(1)
		name := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/"), "/info/refs"), ".git")
		n, _ := s.byRepo.LoadOrStore(name, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack"):
		body := bufio.NewReader(r.Body)
		head, _ := body.Peek(4 + len(lsRefs)) // a pkt-line's length, then the command
		r.Body = struct {
			io.Reader
			io.Closer
		}{body, r.Body}
		if r.Header.Get("Content-Encoding") == "" && bytes.HasPrefix(head[min(4, len(head)):], lsRefs) {
			return
		}
		s.fetches.Add(1)
		name := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/"), "/git-upload-pack"), ".git")
		n, _ := s.fetchesByRepo.LoadOrStore(name, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	}
}

// Start serves Root on addr ("127.0.0.1:0" picks a free port) until Stop.
func (s *Server) Start(addr string) error {
	handler, err := s.handler()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("git server: %w", err)
	}
	s.url = "http://" + ln.Addr().String()
	s.srv = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return nil
}

// handler is `git http-backend` behind the configured authentication.
func (s *Server) handler() (http.Handler, error) {
	gitPath, err := exec.LookPath("git")
	if err != nil {
		return nil, fmt.Errorf("git server: %w", err)
	}
	backend := &cgi.Handler{
		Path: gitPath,
		Args: []string{"http-backend"},
		Env:  []string{"GIT_PROJECT_ROOT=" + s.Root, "GIT_HTTP_EXPORT_ALL=1"},
		// http-backend reports a missing repository on stderr as well as
		// with a 404; the status is what clients see.
		Stderr: io.Discard,
	}
	if s.Username == "" && s.BearerToken == "" && s.Authorize == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.count(r)
			backend.ServeHTTP(w, r)
		}), nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.authorized(r) {
			s.count(r)
			backend.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
	}), nil
}

// authorized reports whether r carries the configured credentials.
func (s *Server) authorized(r *http.Request) bool {
	if s.Authorize != nil {
		return s.Authorize(r)
	}
	if s.BearerToken != "" && r.Header.Get("Authorization") == "Bearer "+s.BearerToken {
		return true
	}
	u, p, ok := r.BasicAuth()
	return s.Username != "" && ok && u == s.Username && p == s.Password
}

// URL is the base URL of the server, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return s.url }

// RepoURL is the clone URL of a repository.
func (s *Server) RepoURL(name string) string { return s.url + "/" + name + ".git" }

// Stop stops serving.
func (s *Server) Stop() error {
	if s.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}

// Repo is a repository with a work tree (Dir) whose commits are pushed to a
// bare repository under a Server's root.
type Repo struct {
	// Dir is the work tree.
	Dir string
	// Bare is the served bare repository.
	Bare string
}

// NewRepo creates the bare repository <root>/<name>.git and a work tree in
// workDir on branch, with no commits yet.
func NewRepo(root, name, workDir, branch string) (*Repo, error) {
	r := &Repo{Dir: workDir, Bare: filepath.Join(root, name+".git")}
	if err := run("", "init", "--quiet", "--bare", "--initial-branch="+branch, r.Bare); err != nil {
		return nil, err
	}
	if err := run("", "init", "--quiet", "--initial-branch="+branch, workDir); err != nil {
		return nil, err
	}
	if err := r.Git("remote", "add", "origin", r.Bare); err != nil {
		return nil, err
	}
	return r, nil
}

// Write writes files (path relative to the work tree -> content).
func (r *Repo) Write(files map[string]string) error {
	for p, content := range files {
		full := filepath.Join(r.Dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Commit stages everything, commits with message, pushes the current branch
// and returns the new commit's hash.
func (r *Repo) Commit(message string) (string, error) {
	if err := r.Git("add", "--all"); err != nil {
		return "", err
	}
	if err := r.Git("commit", "--quiet", "--allow-empty", "-m", message); err != nil {
		return "", err
	}
	if err := r.Git("push", "--quiet", "--all", "origin"); err != nil {
		return "", err
	}
	return r.Output("rev-parse", "HEAD")
}

// Tag creates a lightweight tag (or an annotated one when message is not
// empty) at HEAD and pushes it.
func (r *Repo) Tag(name, message string) error {
	args := []string{"tag", name}
	if message != "" {
		args = []string{"tag", "-a", name, "-m", message}
	}
	if err := r.Git(args...); err != nil {
		return err
	}
	return r.Git("push", "--quiet", "origin", "refs/tags/"+name)
}

// Git runs a git command in the work tree.
func (r *Repo) Git(args ...string) error { return run(r.Dir, args...) }

// Output runs a git command in the work tree and returns its trimmed output.
func (r *Repo) Output(args ...string) (string, error) {
	out, err := command(r.Dir, args...).Output()
	if err != nil {
		return "", gitError(args, err, nil)
	}
	return strings.TrimSpace(string(out)), nil
}

func run(dir string, args ...string) error {
	var stderr bytes.Buffer
	cmd := command(dir, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return gitError(args, err, stderr.Bytes())
	}
	return nil
}

func command(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	// A fixed identity and no user or system config, so commits work on a
	// bare machine and do not depend on who runs them.
	cmd.Env = append(os.Environ(),
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=Headwater", "GIT_AUTHOR_EMAIL=headwater@example.com",
		"GIT_COMMITTER_NAME=Headwater", "GIT_COMMITTER_EMAIL=headwater@example.com",
	)
	return cmd
}

func gitError(args []string, err error, stderr []byte) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(stderr) == 0 {
		stderr = ee.Stderr
	}
	return fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(stderr)))
}
