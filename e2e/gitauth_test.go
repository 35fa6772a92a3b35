package e2e

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	gossh "golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/testsupport/gitserver"
	"github.com/headwater-gitops/headwater/testsupport/tokenserver"
)

// TestGitAuth fetches GitRepositories whose spec.secretRef and
// spec.proxySecretRef name Secrets in the API server, from servers the test
// runs: basic auth over http, https with a CA of its own, SSH, a bearer
// token, a GitHub App, and a forward proxy. The fetcher reads the Secrets
// itself.
func TestGitAuth(t *testing.T) {
	requireEnv(t)
	t.Parallel()

	// Basic auth over plain http; then a wrong password: AuthenticationFailed,
	// a Warning Event, and the last artifact still served.
	t.Run("auth-basic", func(t *testing.T) {
		t.Parallel()
		const name = "auth-basic"
		srv := authServe(t, &gitserver.Server{Root: t.TempDir(), Username: "flux", Password: "s3cr3t"})
		repo, c1 := authRepo(t, srv.Root, name)
		authSecret(t, name, map[string]string{"username": "flux", "password": "s3cr3t"})
		createSource(t, name, srv.RepoURL(name), branch, withSecret(name))
		ready := waitArtifact(t, name, revision(c1))
		checkAuthContent(t, ready, name)

		authUpdateSecret(t, name, map[string]string{"username": "flux", "password": "guess"})
		commit(t, repo, map[string]string{"README.md": "# " + name + " v2\n"}, "Second commit")
		requestReconcile(t, name)
		obj := waitCondition(t, name, meta.ReadyCondition, metav1.ConditionFalse, sourcev1.AuthenticationFailedReason)
		failed := condition(t, obj, sourcev1.FetchFailedCondition)
		if failed.Status != metav1.ConditionTrue || failed.Reason != sourcev1.AuthenticationFailedReason ||
			!strings.Contains(failed.Message, "authentication required") {
			t.Errorf("FetchFailed %s %s: %q, want True AuthenticationFailed naming the refusal", failed.Status, failed.Reason, failed.Message)
		}
		if strings.Contains(failed.Message, "guess") || strings.Contains(failed.Message, "s3cr3t") {
			t.Errorf("FetchFailed message leaks the password: %q", failed.Message)
		}
		waitKubeEvent(t, name, corev1.EventTypeWarning, sourcev1.AuthenticationFailedReason, func(msg string) bool {
			return strings.Contains(msg, "authentication required")
		})
		if a, prev := obj.Status.Artifact, ready.Status.Artifact; a == nil || a.Digest != prev.Digest || a.Revision != prev.Revision {
			t.Fatalf("artifact after the failure %+v, want the previous one %+v", a, prev)
		}
		if got := sha256Digest(download(t, obj.Status.Artifact.URL)); got != obj.Status.Artifact.Digest {
			t.Errorf("previous artifact downloads with digest %s, want %s", got, obj.Status.Artifact.Digest)
		}
	})

	// https with the server's CA in ca.crt and basic auth; without ca.crt
	// the certificate is refused.
	t.Run("auth-https", func(t *testing.T) {
		t.Parallel()
		const name = "auth-https"
		srv := &gitserver.TLSServer{Server: gitserver.Server{Root: t.TempDir(), Username: "flux", Password: "s3cr3t"}}
		authServe(t, srv)
		_, c := authRepo(t, srv.Root, name)
		ca, err := srv.CACert()
		if err != nil {
			t.Fatal(err)
		}
		authSecret(t, name, map[string]string{"ca.crt": string(ca), "username": "flux", "password": "s3cr3t"})
		createSource(t, name, srv.RepoURL(name), branch, withSecret(name))
		checkAuthContent(t, waitArtifact(t, name, revision(c)), name)

		const noCA = "auth-https-no-ca"
		authSecret(t, noCA, map[string]string{"username": "flux", "password": "s3cr3t"})
		createSource(t, noCA, srv.RepoURL(name), branch, withSecret(noCA))
		obj := waitCondition(t, noCA, sourcev1.FetchFailedCondition, metav1.ConditionTrue, sourcev1.GitOperationFailedReason)
		checkFetchFailed(t, obj, "x509: certificate signed by unknown authority")
	})

	// SSH with identity and known_hosts (and identity.pub, which Flux's
	// CLI writes too); a known_hosts with another key for the server.
	t.Run("auth-ssh", func(t *testing.T) {
		t.Parallel()
		const name = "auth-ssh"
		key, pub, err := gitserver.NewSSHKey("")
		if err != nil {
			t.Fatal(err)
		}
		srv := &gitserver.SSHServer{Root: t.TempDir(), AuthorizedKeys: []gossh.PublicKey{pub}}
		authServe(t, srv)
		_, c := authRepo(t, srv.Root, name)
		authSecret(t, name, map[string]string{"identity": string(key), "identity.pub": string(gossh.MarshalAuthorizedKey(pub)),
			"known_hosts": srv.KnownHosts()})
		createSource(t, name, srv.RepoURL(name), branch, withSecret(name))
		checkAuthContent(t, waitArtifact(t, name, revision(c)), name)

		const wrongHost = "auth-ssh-wrong-host"
		impostor := &gitserver.SSHServer{Root: t.TempDir()}
		authServe(t, impostor)
		_, port, _ := net.SplitHostPort(srv.Addr())
		_, impostorKey, _ := strings.Cut(impostor.KnownHosts(), " ")
		authSecret(t, wrongHost, map[string]string{"identity": string(key), "known_hosts": "[127.0.0.1]:" + port + " " + impostorKey})
		createSource(t, wrongHost, srv.RepoURL(name), branch, withSecret(wrongHost))
		obj := waitCondition(t, wrongHost, meta.ReadyCondition, metav1.ConditionFalse, sourcev1.AuthenticationFailedReason)
		msg := condition(t, obj, meta.ReadyCondition).Message
		if !strings.Contains(msg, "host key verification failed: the host key of '[127.0.0.1]:"+port+"'") {
			t.Errorf("Ready message %q does not say the host key was refused", msg)
		}
		waitKubeEvent(t, wrongHost, corev1.EventTypeWarning, sourcev1.AuthenticationFailedReason, func(m string) bool {
			return strings.Contains(m, "host key")
		})
		if obj.Status.Artifact != nil {
			t.Errorf("a source refused by its host key has artifact %+v", obj.Status.Artifact)
		}
	})

	// A server that accepts the SSH connection and never answers: the
	// fetch gives up at spec.timeout.
	t.Run("auth-ssh-silent", func(t *testing.T) {
		t.Parallel()
		const name = "auth-ssh-silent"
		key, pub, err := gitserver.NewSSHKey("")
		if err != nil {
			t.Fatal(err)
		}
		addr := silentListener(t)
		host, port, _ := net.SplitHostPort(addr)
		authSecret(t, name, map[string]string{"identity": string(key),
			"known_hosts": fmt.Sprintf("[%s]:%s %s", host, port, gossh.MarshalAuthorizedKey(pub))})
		createSource(t, name, "ssh://git@"+addr+"/"+name+".git", branch, withSecret(name), func(o *sourcev1.GitRepository) {
			o.Spec.Timeout = &metav1.Duration{Duration: 3 * time.Second}
		})
		obj := waitCondition(t, name, sourcev1.FetchFailedCondition, metav1.ConditionTrue, sourcev1.GitOperationFailedReason)
		checkFetchFailed(t, obj, "ssh: handshake failed")
	})

	// A bearer token, sent as "Authorization: Bearer", over http.
	t.Run("auth-bearer", func(t *testing.T) {
		t.Parallel()
		const name = "auth-bearer"
		srv := authServe(t, &gitserver.Server{Root: t.TempDir(), BearerToken: "t0ken"})
		_, c := authRepo(t, srv.Root, name)
		authSecret(t, name, map[string]string{"bearerToken": "t0ken"})
		createSource(t, name, srv.RepoURL(name), branch, withSecret(name))
		checkAuthContent(t, waitArtifact(t, name, revision(c)), name)
	})

	// A GitHub App (spec.provider github) on a GitHub Enterprise Server
	// URL: the fetcher signs the App's JWT with the Secret's key, trades it
	// at the App's API for an installation token and clones with it as
	// x-access-token; the reconcile after a push reuses the token.
	t.Run("auth-github-app", func(t *testing.T) {
		t.Parallel()
		const name = "auth-github-app"
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		api := authServe(t, &tokenserver.GitHubApp{AppID: 4242, PublicKey: &key.PublicKey, InstallationID: 77, Prefix: "/api/v3"})
		srv := authServe(t, &gitserver.Server{Root: t.TempDir(), Authorize: func(r *http.Request) bool {
			u, p, ok := r.BasicAuth()
			return ok && u == "x-access-token" && api.Valid(p)
		}})
		repo, c1 := authRepo(t, srv.Root, name)
		authSecret(t, name, map[string]string{"githubAppID": "4242", "githubAppInstallationID": "77",
			"githubAppPrivateKey": string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})),
			"githubAppBaseURL":    api.APIURL()})
		createSource(t, name, srv.RepoURL(name), branch, withSecret(name), func(o *sourcev1.GitRepository) {
			o.Spec.Provider = sourcev1.GitProviderGitHub
		})
		checkAuthContent(t, waitArtifact(t, name, revision(c1)), name)

		c2 := commit(t, repo, map[string]string{"README.md": "# " + name + "\n"}, "Second commit")
		requestReconcile(t, name)
		waitArtifact(t, name, revision(c2))
		if n := api.Minted(); n != 1 {
			t.Errorf("installation tokens minted for two reconciles: %d, want 1 (the fetcher keeps it)", n)
		}
	})

	// Fetches through a forward proxy that requires its own credentials:
	// the proxy relays them.
	t.Run("auth-proxy", func(t *testing.T) {
		t.Parallel()
		const name = "auth-proxy"
		proxy := &gitserver.Proxy{Username: "proxy", Password: "pr0xy"}
		if err := proxy.Start("127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = proxy.Stop() })
		_, c := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
		authSecret(t, name, map[string]string{"address": proxy.URL(), "username": "proxy", "password": "pr0xy"})
		createSource(t, name, env.Git.RepoURL(name), branch, withProxySecret(name))
		checkAuthContent(t, waitArtifact(t, name, revision(c)), name)
		for _, want := range []string{
			"GET " + env.Git.RepoURL(name) + "/info/refs?service=git-upload-pack",
			"POST " + env.Git.RepoURL(name) + "/git-upload-pack",
		} {
			if !slices.Contains(proxy.Requests(), want) {
				t.Errorf("the proxy did not relay %q; it relayed %q", want, proxy.Requests())
			}
		}
	})

	t.Cleanup(func() { requireServicesRunning(t) })
}

// authServer is a git server the test starts and stops.
type authServer interface {
	Start(addr string) error
	Stop() error
}

// authServe starts srv on a free port until the test ends, and returns it.
func authServe[S authServer](t *testing.T, srv S) S {
	t.Helper()
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return srv
}

// authRepo creates the repository name under root with README.md on the
// test branch and returns it with its commit.
func authRepo(t *testing.T, root, name string) (*gitserver.Repo, string) {
	t.Helper()
	repo, err := gitserver.NewRepo(root, name, t.TempDir(), branch)
	if err != nil {
		t.Fatal(err)
	}
	return repo, commit(t, repo, map[string]string{"README.md": "# " + name + "\n"}, "Initial commit of "+name)
}

// checkAuthContent checks that the artifact holds the repository's README.
func checkAuthContent(t *testing.T, obj *sourcev1.GitRepository, name string) {
	t.Helper()
	files := untarArtifact(t, download(t, obj.Status.Artifact.URL))
	if got, want := files["README.md"], "# "+name+"\n"; got != want {
		t.Errorf("README.md in the artifact %q, want %q", got, want)
	}
}

// authSecret creates the Secret name with data.
func authSecret(t *testing.T, name string, data map[string]string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, StringData: data}
	if err := env.Client.Create(t.Context(), s); err != nil {
		t.Fatalf("create secret %s: %v", name, err)
	}
}

// authUpdateSecret replaces the data of the Secret name.
func authUpdateSecret(t *testing.T, name string, data map[string]string) {
	t.Helper()
	var s corev1.Secret
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, &s); err != nil {
		t.Fatalf("get secret %s: %v", name, err)
	}
	s.Data, s.StringData = nil, data
	if err := env.Client.Update(t.Context(), &s); err != nil {
		t.Fatalf("update secret %s: %v", name, err)
	}
}

// withSecret sets spec.secretRef.
func withSecret(name string) func(*sourcev1.GitRepository) {
	return func(o *sourcev1.GitRepository) { o.Spec.SecretRef = &meta.LocalObjectReference{Name: name} }
}

// withProxySecret sets spec.proxySecretRef.
func withProxySecret(name string) func(*sourcev1.GitRepository) {
	return func(o *sourcev1.GitRepository) { o.Spec.ProxySecretRef = &meta.LocalObjectReference{Name: name} }
}
