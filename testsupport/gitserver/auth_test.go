package gitserver_test

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// gitWith runs the system git like git does, with extra environment.
func gitWith(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Env = append(os.Environ(),
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=", "SSH_ASKPASS=",
	)
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stderr.String(), err
	}
	return strings.TrimSpace(stdout.String()), nil
}

// committedRepo creates root/name.git with one commit on main and returns
// the commit.
func committedRepo(t *testing.T, root, name string) string {
	t.Helper()
	repo, err := gitserver.NewRepo(root, name, filepath.Join(t.TempDir(), "work"), "main")
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Write(map[string]string{"README.md": "# " + name + "\n"}); err != nil {
		t.Fatal(err)
	}
	c, err := repo.Commit("Initial")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSSHServer(t *testing.T) {
	key, pub, err := gitserver.NewSSHKey("")
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := gitserver.NewSSHKey("")
	if err != nil {
		t.Fatal(err)
	}
	// A repository next to the root must stay out of reach.
	dir := t.TempDir()
	committedRepo(t, dir, "outside")
	srv := &gitserver.SSHServer{Root: filepath.Join(dir, "root"), AuthorizedKeys: []gossh.PublicKey{pub}}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	c := committedRepo(t, srv.Root, "podinfo")
	if want := "ssh://git@" + srv.Addr() + "/podinfo.git"; srv.RepoURL("podinfo") != want {
		t.Errorf("RepoURL %q, want %q", srv.RepoURL("podinfo"), want)
	}
	if !strings.HasPrefix(srv.KnownHosts(), "[127.0.0.1]:") || !strings.Contains(srv.KnownHosts(), " ssh-ed25519 ") {
		t.Errorf("KnownHosts %q, want a [127.0.0.1]:port ssh-ed25519 line", srv.KnownHosts())
	}
	knownHosts := writeFile(t, "known_hosts", []byte(srv.KnownHosts()))
	port := srv.Addr()[strings.LastIndex(srv.Addr(), ":")+1:]
	// A different host key for the same address.
	impostor := &gitserver.SSHServer{Root: t.TempDir()}
	if err := impostor.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = impostor.Stop() })
	_, impostorKey, _ := strings.Cut(impostor.KnownHosts(), " ")
	wrongHosts := writeFile(t, "wrong_known_hosts", []byte("[127.0.0.1]:"+port+" "+impostorKey))

	sshEnv := func(identity []byte, hosts string, extra ...string) []string {
		return []string{"GIT_SSH_COMMAND=ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes" +
			" -o UserKnownHostsFile=" + hosts + " -i " + writeFile(t, "id", identity) + " " + strings.Join(extra, " ")}
	}
	tests := []struct {
		name  string
		env   []string
		url   string
		ok    bool
		inErr string
	}{
		{name: "authorized key", env: sshEnv(key, knownHosts), url: srv.RepoURL("podinfo"), ok: true},
		// scp-like syntax sends the path without a leading slash.
		{name: "relative path", env: sshEnv(key, knownHosts, "-p", port), url: "git@127.0.0.1:podinfo.git", ok: true},
		{name: "unauthorized key", env: sshEnv(other, knownHosts), url: srv.RepoURL("podinfo"), inErr: "Permission denied"},
		{name: "unknown host key", env: sshEnv(key, wrongHosts), url: srv.RepoURL("podinfo"), inErr: "Host key verification failed"},
		{name: "missing repository", env: sshEnv(key, knownHosts), url: srv.RepoURL("missing"), inErr: "does not appear to be a git repository"},
		{name: "path outside the root", env: sshEnv(key, knownHosts), url: "ssh://git@" + srv.Addr() + "/../outside.git", inErr: "does not appear to be a git repository"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := gitWith(t, tc.env, "ls-remote", tc.url)
			if !tc.ok {
				if err == nil {
					t.Fatalf("ls-remote succeeded: %s", out)
				}
				if !strings.Contains(out, tc.inErr) {
					t.Errorf("ls-remote failed with %q, want %q", out, tc.inErr)
				}
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

	// A clone and a push work end to end.
	dest := filepath.Join(t.TempDir(), "clone")
	env := sshEnv(key, knownHosts)
	if out, err := gitWith(t, env, "clone", "--quiet", srv.RepoURL("podinfo"), dest); err != nil {
		t.Fatalf("clone: %v: %s", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "README.md")); err != nil || string(b) != "# podinfo\n" {
		t.Errorf("README.md %q, %v", b, err)
	}
	if out, err := gitWith(t, env, "-C", dest, "-c", "user.name=t", "-c", "user.email=t@example.com",
		"commit", "--quiet", "--allow-empty", "-m", "over ssh"); err != nil {
		t.Fatalf("commit: %v: %s", err, out)
	}
	if out, err := gitWith(t, env, "-C", dest, "push", "--quiet", "origin", "main"); err != nil {
		t.Fatalf("push: %v: %s", err, out)
	}
	pushed, err := gitWith(t, nil, "--git-dir", filepath.Join(srv.Root, "podinfo.git"), "log", "-1", "--format=%s", "main")
	if err != nil || pushed != "over ssh" {
		t.Errorf("pushed commit %q, %v", pushed, err)
	}

	// An encrypted key parses with its passphrase.
	enc, encPub, err := gitserver.NewSSHKey("p4ss")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gossh.ParsePrivateKey(enc); err == nil {
		t.Error("encrypted key parses without a passphrase")
	}
	signer, err := gossh.ParsePrivateKeyWithPassphrase(enc, []byte("p4ss"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(signer.PublicKey().Marshal(), encPub.Marshal()) {
		t.Error("encrypted key does not match its public key")
	}
}

func TestTLSServer(t *testing.T) {
	srv := &gitserver.TLSServer{Server: gitserver.Server{Root: t.TempDir(), Username: "flux", Password: "s3cr3t"}}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	c := committedRepo(t, srv.Root, "private")
	if !strings.HasPrefix(srv.RepoURL("private"), "https://127.0.0.1:") {
		t.Errorf("RepoURL %q", srv.RepoURL("private"))
	}
	ca, err := srv.CACert()
	if err != nil {
		t.Fatal(err)
	}
	caFile := writeFile(t, "ca.crt", ca)
	withCreds := strings.Replace(srv.RepoURL("private"), "https://", "https://flux:s3cr3t@", 1)

	// GIT_SSL_CAINFO, not http.sslCAInfo: the environment may set it.
	trust := []string{"GIT_SSL_CAINFO=" + caFile}
	tests := []struct {
		name  string
		env   []string
		url   string
		ok    bool
		inErr string
	}{
		{name: "trusted CA and credentials", env: trust, url: withCreds, ok: true},
		{name: "untrusted certificate", url: withCreds, inErr: "certificate"},
		{name: "no credentials", env: trust, url: srv.RepoURL("private"), inErr: "could not read Username"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := gitWith(t, tc.env, "ls-remote", tc.url)
			if !tc.ok {
				if err == nil || !strings.Contains(out, tc.inErr) {
					t.Errorf("ls-remote: %v: %q, want a failure with %q", err, out, tc.inErr)
				}
				return
			}
			if err != nil || !strings.Contains(out, c+"\trefs/heads/main") {
				t.Errorf("ls-remote: %v:\n%s", err, out)
			}
		})
	}
}

func TestTLSServerClientCert(t *testing.T) {
	srv := &gitserver.TLSServer{Server: gitserver.Server{Root: t.TempDir()}, RequireClientCert: true}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	c := committedRepo(t, srv.Root, "mtls")
	ca, err := srv.CACert()
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := srv.ClientCert("flux")
	if err != nil {
		t.Fatal(err)
	}
	caFile, certFile, keyFile := writeFile(t, "ca.crt", ca), writeFile(t, "tls.crt", cert), writeFile(t, "tls.key", key)

	trust := []string{"GIT_SSL_CAINFO=" + caFile}
	out, err := gitWith(t, trust, "-c", "http.sslCert="+certFile, "-c", "http.sslKey="+keyFile, "ls-remote", srv.RepoURL("mtls"))
	if err != nil || !strings.Contains(out, c+"\trefs/heads/main") {
		t.Errorf("ls-remote with a client certificate: %v:\n%s", err, out)
	}
	if out, err := gitWith(t, trust, "ls-remote", srv.RepoURL("mtls")); err == nil {
		t.Errorf("ls-remote without a client certificate succeeded: %s", out)
	}
}

func TestBearerToken(t *testing.T) {
	srv := &gitserver.Server{BearerToken: "t0ken"}
	start(t, srv)
	c := committedRepo(t, srv.Root, "token")
	for _, tc := range []struct {
		header string
		ok     bool
	}{
		{"Authorization: Bearer t0ken", true},
		{"Authorization: Bearer wrong", false},
		{"X-Nothing: here", false},
	} {
		out, err := gitWith(t, nil, "-c", "http.extraHeader="+tc.header, "ls-remote", srv.RepoURL("token"))
		if tc.ok != (err == nil) {
			t.Errorf("%s: ls-remote: %v: %s", tc.header, err, out)
		}
		if tc.ok && !strings.Contains(out, c+"\trefs/heads/main") {
			t.Errorf("%s: ls-remote:\n%s", tc.header, out)
		}
	}
	resp, err := http.Get(srv.RepoURL("token") + "/info/refs?service=git-upload-pack")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("anonymous request: %s, want 401", resp.Status)
	}
}

func TestProxy(t *testing.T) {
	plain := &gitserver.Server{}
	start(t, plain)
	c := committedRepo(t, plain.Root, "plain")
	secure := &gitserver.TLSServer{Server: gitserver.Server{Root: t.TempDir()}}
	if err := secure.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = secure.Stop() })
	cs := committedRepo(t, secure.Root, "secure")
	ca, err := secure.CACert()
	if err != nil {
		t.Fatal(err)
	}
	trust := []string{"GIT_SSL_CAINFO=" + writeFile(t, "ca.crt", ca)}

	p := &gitserver.Proxy{Username: "proxy", Password: "pr0xy"}
	if err := p.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	through := strings.Replace(p.URL(), "http://", "http://proxy:pr0xy@", 1)

	out, err := gitWith(t, nil, "-c", "http.proxy="+through, "ls-remote", plain.RepoURL("plain"))
	if err != nil || !strings.Contains(out, c+"\trefs/heads/main") {
		t.Fatalf("ls-remote over http through the proxy: %v:\n%s", err, out)
	}
	out, err = gitWith(t, trust, "-c", "http.proxy="+through, "ls-remote", secure.RepoURL("secure"))
	if err != nil || !strings.Contains(out, cs+"\trefs/heads/main") {
		t.Fatalf("ls-remote over https through the proxy: %v:\n%s", err, out)
	}
	reqs := p.Requests()
	if len(reqs) < 2 || !strings.HasPrefix(reqs[0], "GET "+plain.RepoURL("plain")+"/info/refs") ||
		reqs[len(reqs)-1] != "CONNECT "+strings.TrimPrefix(secure.URL(), "https://") {
		t.Errorf("proxy requests %q", reqs)
	}
	if out, err := gitWith(t, nil, "-c", "http.proxy="+p.URL(), "ls-remote", plain.RepoURL("plain")); err == nil {
		t.Errorf("ls-remote through the proxy without credentials succeeded: %s", out)
	}
	if p.Refused() == 0 {
		t.Error("no request refused for want of Proxy-Authorization")
	}
}

func TestSOCKS5Proxy(t *testing.T) {
	srv := &gitserver.Server{}
	start(t, srv)
	c := committedRepo(t, srv.Root, "socks")
	p := &gitserver.SOCKS5Proxy{Username: "proxy", Password: "pr0xy"}
	if err := p.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	if !strings.HasPrefix(p.URL(), "socks5://127.0.0.1:") {
		t.Errorf("URL %q", p.URL())
	}
	through := strings.Replace(p.URL(), "socks5://", "socks5://proxy:pr0xy@", 1)
	out, err := gitWith(t, nil, "-c", "http.proxy="+through, "ls-remote", srv.RepoURL("socks"))
	if err != nil || !strings.Contains(out, c+"\trefs/heads/main") {
		t.Fatalf("ls-remote through the socks5 proxy: %v:\n%s", err, out)
	}
	if want := "CONNECT " + strings.TrimPrefix(srv.URL(), "http://"); len(p.Requests()) == 0 || p.Requests()[0] != want {
		t.Errorf("proxy requests %q, want %q first", p.Requests(), want)
	}
	wrong := strings.Replace(p.URL(), "socks5://", "socks5://proxy:guess@", 1)
	if out, err := gitWith(t, nil, "-c", "http.proxy="+wrong, "ls-remote", srv.RepoURL("socks")); err == nil {
		t.Errorf("ls-remote with wrong proxy credentials succeeded: %s", out)
	}
}
