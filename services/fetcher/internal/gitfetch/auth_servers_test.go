package gitfetch

import (
	"context"
	"io/fs"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/skeema/knownhosts"
	gossh "golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// The tests below fetch from real servers (SSH, HTTPS, a bearer token
// server, a forward proxy) with credentials read from Secrets.

// authCase is a fetch with the Secrets it names, and what it must give.
type authCase struct {
	name        string
	url         string
	secret      map[string]string // spec.secretRef's data; nil for no secretRef
	proxySecret map[string]string // spec.proxySecretRef's data; nil for no proxySecretRef
	// reason is the failure's reason, "" for a fetch that works.
	reason  string
	stalled bool
	message string // part of the failure's message
}

// run resolves and downloads c and checks the outcome: the master branch
// at commit with README.md "one", or the failure.
func (c authCase) run(t *testing.T, commit string) {
	t.Helper()
	var objs []*corev1.Secret
	req := request(c.url, &sourcev1.GitRepositoryRef{Branch: "master"})
	if c.secret != nil {
		objs = append(objs, newSecret("auth", c.secret))
		req.GitRepository.SecretRef = &meta.LocalObjectReference{Name: "auth"}
	}
	if c.proxySecret != nil {
		objs = append(objs, newSecret("proxy", c.proxySecret))
		req.GitRepository.ProxySecretRef = &meta.LocalObjectReference{Name: "proxy"}
	}
	src := secretSource(t, objs...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := src.Resolve(ctx, req)
	if c.reason != "" && err != nil {
		checkFailure(t, err, c.reason, c.stalled, c.message)
		return
	}
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	content, err := res.Download(ctx, t.TempDir())
	if c.reason != "" {
		checkFailure(t, err, c.reason, c.stalled, c.message)
		return
	}
	if err != nil {
		t.Fatalf("download: %v", err)
	}
	if want := "master@sha1:" + commit; content.Revision != want {
		t.Errorf("revision = %q, want %q", content.Revision, want)
	}
	if b, err := fs.ReadFile(content.Tree(), "README.md"); err != nil || string(b) != "one" {
		t.Errorf("README.md = %q (%v), want %q", b, err, "one")
	}
}

// newRepoIn creates root/name.git with README.md "one" on master and
// returns the commit.
func newRepoIn(t *testing.T, root, name string) string {
	t.Helper()
	repo, err := gitserver.NewRepo(root, name, t.TempDir(), "master")
	must(t, err)
	must(t, repo.Write(map[string]string{"README.md": "one"}))
	c, err := repo.Commit("first commit")
	must(t, err)
	return c
}

func newSecret(name string, data map[string]string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Data: bytesMap(data)}
}

// secretSource is a Source reading the given Secrets.
func secretSource(t *testing.T, objs ...*corev1.Secret) *Source {
	t.Helper()
	scheme := runtime.NewScheme()
	must(t, corev1.AddToScheme(scheme))
	b := fake.NewClientBuilder().WithScheme(scheme)
	for _, o := range objs {
		b = b.WithObjects(o)
	}
	return &Source{Secrets: secrets.NewKube(b.Build())}
}

func TestSSH(t *testing.T) {
	key, pub, err := gitserver.NewSSHKey("")
	must(t, err)
	encrypted, encryptedPub, err := gitserver.NewSSHKey("p4ss")
	must(t, err)
	stranger, _, err := gitserver.NewSSHKey("")
	must(t, err)
	srv := &gitserver.SSHServer{Root: t.TempDir(), AuthorizedKeys: []gossh.PublicKey{pub, encryptedPub}}
	must(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = srv.Stop() })
	commit := newRepoIn(t, srv.Root, "repo")
	url := srv.RepoURL("repo")

	// known_hosts naming the server's address with another key, and one
	// naming the server's key at another port.
	impostor := &gitserver.SSHServer{Root: t.TempDir()}
	must(t, impostor.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = impostor.Stop() })
	_, port, _ := net.SplitHostPort(srv.Addr())
	_, impostorKey, _ := strings.Cut(impostor.KnownHosts(), " ")
	_, serverKey, _ := strings.Cut(srv.KnownHosts(), " ")
	otherPort := "[127.0.0.1]:1 " + serverKey

	creds := func(identity []byte, knownHosts string, extra ...string) map[string]string {
		d := map[string]string{"identity": string(identity), "known_hosts": knownHosts}
		for i := 0; i+1 < len(extra); i += 2 {
			d[extra[i]] = extra[i+1]
		}
		return d
	}
	cases := []authCase{
		{name: "identity and known_hosts", url: url, secret: creds(key, srv.KnownHosts())},
		{name: "with identity.pub and a username, as flux create secret git makes them", url: url,
			secret: creds(key, srv.KnownHosts(), "identity.pub", string(gossh.MarshalAuthorizedKey(pub)), "username", "ignored")},
		{name: "encrypted identity", url: url, secret: creds(encrypted, srv.KnownHosts(), "password", "p4ss")},
		{name: "known_hosts among others", url: url, secret: creds(key, "# hosts\n"+otherPort+"\n"+srv.KnownHosts())},
		{name: "unauthorized key", url: url, secret: creds(stranger, srv.KnownHosts()),
			reason: sourcev1.AuthenticationFailedReason, message: "ssh: handshake failed: ssh: unable to authenticate"},
		{name: "another host key for the address", url: url, secret: creds(key, "[127.0.0.1]:"+port+" "+impostorKey),
			reason:  sourcev1.AuthenticationFailedReason,
			message: "host key verification failed: the host key of '[127.0.0.1]:" + port + "' (ssh-ed25519 SHA256:"},
		{name: "no host key for the address", url: url, secret: creds(key, otherPort),
			reason:  sourcev1.AuthenticationFailedReason,
			message: "host key verification failed: known_hosts has no key for '[127.0.0.1]:" + port + "', which offered ssh-ed25519 SHA256:"},
		{name: "no identity", url: url, secret: map[string]string{"known_hosts": srv.KnownHosts()},
			reason: sourcev1.AuthenticationFailedReason, stalled: true,
			message: "failed to configure authentication options: invalid 'ssh' auth option: 'identity' is required"},
		{name: "wrong passphrase", url: url, secret: creds(encrypted, srv.KnownHosts(), "password", "guess"),
			reason: sourcev1.AuthenticationFailedReason, stalled: true, message: "failed to configure authentication options: invalid 'identity': "},
		{name: "missing repository", url: srv.RepoURL("missing"), secret: creds(key, srv.KnownHosts()),
			reason: sourcev1.GitOperationFailedReason, message: "unable to clone '" + failure.RedactURL(srv.RepoURL("missing")) + "': repository not found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, commit) })
	}
}

// TestSSHSilentServer checks that a server that accepts connections and
// never answers fails the fetch at its deadline instead of holding it.
func TestSSHSilentServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		for c := range accepted {
			_ = c.Close()
		}
	})
	key, pub, err := gitserver.NewSSHKey("")
	must(t, err)
	u := "ssh://git@" + l.Addr().String() + "/repo.git"
	req := request(u, nil)
	req.GitRepository.SecretRef = &meta.LocalObjectReference{Name: "auth"}
	src := secretSource(t, newSecret("auth", map[string]string{"identity": string(key), "known_hosts": knownhosts.Line([]string{l.Addr().String()}, pub)}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := src.Resolve(ctx, req)
		done <- err
	}()
	select {
	case err := <-done:
		checkFailure(t, err, sourcev1.GitOperationFailedReason, false, "unable to clone '"+failure.RedactURL(u)+"': ssh: handshake failed: ")
	case <-time.After(time.Minute):
		t.Fatal("the fetch from a silent SSH server outlived its deadline by a minute")
	}
}

func TestHTTPS(t *testing.T) {
	srv := &gitserver.TLSServer{Server: gitserver.Server{Root: t.TempDir(), Username: "flux", Password: "s3cr3t"}}
	must(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = srv.Stop() })
	commit := newRepoIn(t, srv.Root, "repo")
	ca, err := srv.CACert()
	must(t, err)

	mtls := &gitserver.TLSServer{Server: gitserver.Server{Root: t.TempDir()}, RequireClientCert: true}
	must(t, mtls.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = mtls.Stop() })
	mtlsCommit := newRepoIn(t, mtls.Root, "repo")
	mtlsCA, err := mtls.CACert()
	must(t, err)
	cert, key, err := mtls.ClientCert("flux")
	must(t, err)
	strangerCert, strangerKey, err := srv.ClientCert("stranger") // issued by another authority
	must(t, err)

	cases := []struct {
		authCase
		commit string
	}{
		{authCase: authCase{name: "ca.crt and basic auth", url: srv.RepoURL("repo"),
			secret: map[string]string{"ca.crt": string(ca), "username": "flux", "password": "s3cr3t"}}, commit: commit},
		{authCase: authCase{name: "caFile and basic auth", url: srv.RepoURL("repo"),
			secret: map[string]string{"caFile": string(ca), "username": "flux", "password": "s3cr3t"}}, commit: commit},
		{authCase: authCase{name: "no ca.crt", url: srv.RepoURL("repo"), secret: map[string]string{"username": "flux", "password": "s3cr3t"},
			reason: sourcev1.GitOperationFailedReason, message: "x509: certificate signed by unknown authority"}},
		{authCase: authCase{name: "ca.crt and a wrong password", url: srv.RepoURL("repo"),
			secret: map[string]string{"ca.crt": string(ca), "username": "flux", "password": "guess"},
			reason: sourcev1.AuthenticationFailedReason, message: "authentication required"}},
		{authCase: authCase{name: "client certificate", url: mtls.RepoURL("repo"),
			secret: map[string]string{"ca.crt": string(mtlsCA), "tls.crt": string(cert), "tls.key": string(key)}}, commit: mtlsCommit},
		{authCase: authCase{name: "no client certificate", url: mtls.RepoURL("repo"), secret: map[string]string{"ca.crt": string(mtlsCA)},
			reason: sourcev1.GitOperationFailedReason, message: "unable to clone '" + mtls.RepoURL("repo") + "': "}},
		{authCase: authCase{name: "client certificate of another authority", url: mtls.RepoURL("repo"),
			secret: map[string]string{"ca.crt": string(mtlsCA), "tls.crt": string(strangerCert), "tls.key": string(strangerKey)},
			reason: sourcev1.GitOperationFailedReason, message: "unable to clone '" + mtls.RepoURL("repo") + "': "}},
		{authCase: authCase{name: "client certificate without its key", url: mtls.RepoURL("repo"),
			secret: map[string]string{"ca.crt": string(mtlsCA), "tls.crt": string(cert)}, reason: sourcev1.AuthenticationFailedReason, stalled: true,
			message: "failed to configure authentication options: secret contains 'tls.crt' but misses 'tls.key'"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, c.commit) })
	}
}

func TestBearerToken(t *testing.T) {
	srv := &gitserver.Server{Root: t.TempDir(), BearerToken: "t0ken"}
	must(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = srv.Stop() })
	commit := newRepoIn(t, srv.Root, "repo")
	cases := []authCase{
		{name: "bearer token", url: srv.RepoURL("repo"), secret: map[string]string{"bearerToken": "t0ken"}},
		{name: "bearer token preferred to basic auth", url: srv.RepoURL("repo"),
			secret: map[string]string{"bearerToken": "t0ken", "username": "flux", "password": "s3cr3t"}},
		{name: "wrong bearer token", url: srv.RepoURL("repo"), secret: map[string]string{"bearerToken": "guess"},
			reason: sourcev1.AuthenticationFailedReason, message: "authentication required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, commit) })
	}
}

func TestProxy(t *testing.T) {
	plain := &gitserver.Server{Root: t.TempDir(), Username: "flux", Password: "s3cr3t"}
	must(t, plain.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = plain.Stop() })
	commit := newRepoIn(t, plain.Root, "repo")
	secure := &gitserver.TLSServer{Server: gitserver.Server{Root: t.TempDir()}}
	must(t, secure.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = secure.Stop() })
	secureCommit := newRepoIn(t, secure.Root, "repo")
	ca, err := secure.CACert()
	must(t, err)

	proxy := &gitserver.Proxy{Username: "proxy", Password: "pr0xy"}
	must(t, proxy.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = proxy.Stop() })
	proxyCreds := map[string]string{"address": proxy.URL(), "username": "proxy", "password": "pr0xy"}
	basic := map[string]string{"username": "flux", "password": "s3cr3t"}

	cases := []struct {
		authCase
		commit string
		// relayed is a request the proxy must have relayed.
		relayed string
	}{
		{authCase: authCase{name: "http through the proxy", url: plain.RepoURL("repo"), secret: basic, proxySecret: proxyCreds},
			commit: commit, relayed: "POST " + plain.RepoURL("repo") + "/git-upload-pack"},
		{authCase: authCase{name: "proxy credentials in the address", url: plain.RepoURL("repo"), secret: basic,
			proxySecret: map[string]string{"address": strings.Replace(proxy.URL(), "http://", "http://proxy:pr0xy@", 1)}},
			commit: commit, relayed: "GET " + plain.RepoURL("repo") + "/info/refs?service=git-upload-pack"},
		{authCase: authCase{name: "https through the proxy", url: secure.RepoURL("repo"), secret: map[string]string{"ca.crt": string(ca)},
			proxySecret: proxyCreds}, commit: secureCommit, relayed: "CONNECT " + strings.TrimPrefix(secure.URL(), "https://")},
		{authCase: authCase{name: "wrong proxy password", url: plain.RepoURL("repo"), secret: basic,
			proxySecret: map[string]string{"address": proxy.URL(), "username": "proxy", "password": "s3cr3t"},
			reason:      sourcev1.AuthenticationFailedReason, message: "unable to clone '" + plain.RepoURL("repo") + "': "}},
		{authCase: authCase{name: "https with a wrong proxy password", url: secure.RepoURL("repo"), secret: map[string]string{"ca.crt": string(ca)},
			proxySecret: map[string]string{"address": proxy.URL()},
			reason:      sourcev1.AuthenticationFailedReason, message: "unable to clone '" + secure.RepoURL("repo") + "': "}},
		{authCase: authCase{name: "no address", url: plain.RepoURL("repo"), secret: basic,
			proxySecret: map[string]string{"username": "proxy", "password": "pr0xy"},
			reason:      sourcev1.AuthenticationFailedReason, stalled: true,
			message: "failed to configure proxy options: secret 'default/proxy': key 'address' not found"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := len(proxy.Requests())
			c.run(t, c.commit)
			if c.relayed == "" {
				return
			}
			for _, r := range proxy.Requests()[before:] {
				if r == c.relayed {
					return
				}
			}
			t.Errorf("the proxy did not relay %q; it relayed %q", c.relayed, proxy.Requests()[before:])
		})
	}
	if proxy.Refused() == 0 {
		t.Error("the proxy refused nothing, though a fetch gave it a wrong password")
	}

	// A proxySecretRef naming no Secret is a transient failure.
	req := request(plain.RepoURL("repo"), nil)
	req.GitRepository.ProxySecretRef = &meta.LocalObjectReference{Name: "absent"}
	_, err = secretSource(t).Resolve(context.Background(), req)
	checkFailure(t, err, sourcev1.AuthenticationFailedReason, false,
		`failed to configure proxy options: failed to get secret 'default/absent': secrets "absent" not found`)
}

// TestSOCKS5 fetches over SSH and over http through a SOCKS5 proxy that
// requires credentials.
func TestSOCKS5(t *testing.T) {
	key, pub, err := gitserver.NewSSHKey("")
	must(t, err)
	sshSrv := &gitserver.SSHServer{Root: t.TempDir(), AuthorizedKeys: []gossh.PublicKey{pub}}
	must(t, sshSrv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = sshSrv.Stop() })
	sshCommit := newRepoIn(t, sshSrv.Root, "repo")
	httpSrv := &gitserver.Server{Root: t.TempDir()}
	must(t, httpSrv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = httpSrv.Stop() })
	httpCommit := newRepoIn(t, httpSrv.Root, "repo")

	proxy := &gitserver.SOCKS5Proxy{Username: "proxy", Password: "pr0xy"}
	must(t, proxy.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = proxy.Stop() })
	proxyCreds := map[string]string{"address": proxy.URL(), "username": "proxy", "password": "pr0xy"}
	sshCreds := map[string]string{"identity": string(key), "known_hosts": sshSrv.KnownHosts()}

	cases := []struct {
		authCase
		commit string
		target string // the address the proxy must have connected to
	}{
		{authCase: authCase{name: "ssh", url: sshSrv.RepoURL("repo"), secret: sshCreds, proxySecret: proxyCreds},
			commit: sshCommit, target: sshSrv.Addr()},
		{authCase: authCase{name: "http", url: httpSrv.RepoURL("repo"), proxySecret: proxyCreds},
			commit: httpCommit, target: strings.TrimPrefix(httpSrv.URL(), "http://")},
		{authCase: authCase{name: "ssh with a wrong proxy password", url: sshSrv.RepoURL("repo"), secret: sshCreds,
			proxySecret: map[string]string{"address": proxy.URL(), "username": "proxy", "password": "guess"},
			reason:      sourcev1.AuthenticationFailedReason, message: "username/password authentication failed"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := len(proxy.Requests())
			c.run(t, c.commit)
			if c.target != "" && !slices.Contains(proxy.Requests()[before:], "CONNECT "+c.target) {
				t.Errorf("the proxy did not connect to %s; it connected %q", c.target, proxy.Requests()[before:])
			}
		})
	}
}
