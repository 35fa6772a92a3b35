package gitfetch

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
	"github.com/headwater-gitops/headwater/testsupport/tokenserver"
)

// The tests below fetch with spec.provider github and azure: a token
// server speaking GitHub's App API or Entra ID's token endpoint mints the
// tokens, and the git server lets in only requests carrying a token it
// minted that has not expired.

// providerCase is a fetch with a provider, and what it must give.
type providerCase struct {
	name     string
	provider string
	url      string
	secret   map[string]string // nil for no secretRef
	// proxySecret is spec.proxySecretRef's data; nil for none.
	proxySecret map[string]string
	// reason is the failure's reason, "" for a fetch that works; handling
	// its handling and message part of its message.
	reason   string
	handling failure.Handling
	message  string
}

// run resolves and downloads c with src: master at commit with README.md
// "one", or the failure.
func (c providerCase) run(t *testing.T, src *Source, commit string) {
	t.Helper()
	req := request(c.url, &sourcev1.GitRepositoryRef{Branch: "master"})
	req.GitRepository.Provider = c.provider
	var objs []*corev1.Secret
	if c.secret != nil {
		req.GitRepository.SecretRef = &meta.LocalObjectReference{Name: "auth"}
		objs = append(objs, newSecret("auth", c.secret))
	}
	if c.proxySecret != nil {
		req.GitRepository.ProxySecretRef = &meta.LocalObjectReference{Name: "proxy"}
		objs = append(objs, newSecret("proxy", c.proxySecret))
	}
	if objs != nil {
		src.Secrets = secretSource(t, objs...).Secrets
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := src.Resolve(ctx, req)
	if c.reason != "" {
		checkProviderFailure(t, err, c.reason, c.handling, c.message)
		return
	}
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	if c, ok := res.(interface{ Close() error }); ok {
		defer func() { _ = c.Close() }()
	}
	content, err := res.Download(ctx, t.TempDir())
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

// checkProviderFailure asserts err is a FetchFailed *failure.Error with
// reason, handling and a message containing want, and no credential.
func checkProviderFailure(t *testing.T, err error, reason string, h failure.Handling, want string) {
	t.Helper()
	checkFailure(t, err, reason, h == failure.Stalling, want)
	if f := failure.As(err); f != nil && f.Handling != h {
		t.Errorf("handling %s, want %s", f.Handling, h)
	}
	if f := failure.As(err); f != nil && strings.Contains(f.Error(), "PRIVATE KEY") {
		t.Errorf("message holds a private key: %q", f.Error())
	}
}

// newAppKey returns an RSA key and its PEM (PKCS #1), as GitHub issues
// App keys.
func newAppKey(t *testing.T) (*rsa.PrivateKey, string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	must(t, err)
	return key, string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
}

// gitHubFixture is a GitHub App's API and a git server that takes its
// installation tokens as the password of x-access-token.
type gitHubFixture struct {
	api    *tokenserver.GitHubApp
	git    *gitserver.Server
	key    string // the App's private key, PEM
	commit string
}

func newGitHubFixture(t *testing.T, ttl time.Duration) *gitHubFixture {
	t.Helper()
	key, keyPEM := newAppKey(t)
	f := &gitHubFixture{key: keyPEM}
	f.api = &tokenserver.GitHubApp{AppID: 4242, PublicKey: &key.PublicKey, InstallationID: 77, Owner: "acme", Prefix: "/api/v3", TTL: ttl}
	must(t, f.api.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = f.api.Stop() })
	f.git = &gitserver.Server{Root: t.TempDir(), Authorize: func(r *http.Request) bool {
		u, p, ok := r.BasicAuth()
		return ok && u == "x-access-token" && f.api.Valid(p)
	}}
	must(t, f.git.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = f.git.Stop() })
	f.commit = newRepoIn(t, f.git.Root, "repo")
	// Without a token, or with one the tenant never issued, the git
	// server refuses: a fetch that succeeds is the token's.
	sourcetest.CheckRefusesForgedBearer(t, nil, f.git.RepoURL("repo")+"/info/refs?service=git-upload-pack", http.StatusUnauthorized)
	return f
}

// secret is the App's Secret, with kv replacing or (with an empty
// value) removing keys.
func (f *gitHubFixture) secret(kv ...string) map[string]string {
	s := map[string]string{"githubAppID": "4242", "githubAppInstallationID": "77", "githubAppPrivateKey": f.key,
		"githubAppBaseURL": f.api.APIURL()}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(s, kv[i])
		} else {
			s[kv[i]] = kv[i+1]
		}
	}
	return s
}

func TestGitHubApp(t *testing.T) {
	f := newGitHubFixture(t, 0)
	src := &Source{Tokens: providertoken.NewCache(0, nil)}
	ok := providerCase{provider: sourcev1.GitProviderGitHub, url: f.git.RepoURL("repo"), secret: f.secret()}
	for range 3 {
		ok.run(t, src, f.commit)
	}
	if n := f.api.Minted(); n != 1 {
		t.Errorf("tokens minted for 3 fetches: %d, want 1 (cached)", n)
	}
	// The same App and installation by owner, through a Secret of its
	// own: a token for the installation it finds.
	byOwner := providerCase{provider: sourcev1.GitProviderGitHub, url: ok.url,
		secret: f.secret("githubAppInstallationID", "", "githubAppInstallationOwner", "acme")}
	byOwner.run(t, src, f.commit)
	// Another key for the same App and installation must not get the
	// cached token: GitHub refuses its JWT.
	_, otherKey := newAppKey(t)
	tokens := f.api.APIURL() + "/app/installations/77/access_tokens"
	stranger := providerCase{provider: sourcev1.GitProviderGitHub, url: ok.url, secret: f.secret("githubAppPrivateKey", otherKey),
		reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
		message: "failed to configure authentication options: POST " + tokens + ": 401 A JSON web token could not be decoded []"}
	stranger.run(t, src, f.commit)
}

// TestGitHubAppTokenLimited checks that the installation token request
// passes the host limiter as clones do: while the API's host is held (it
// answered 429 with Retry-After to another fetch), the fetch sends it
// nothing and learns of the hold, which the fetch handler turns into
// RateLimited.
func TestGitHubAppTokenLimited(t *testing.T) {
	f := newGitHubFixture(t, 0)
	l := &hostlimit.Limiter{Rules: hostlimit.Rules{}, Store: &hostlimit.MemoryStore{}, MaxWait: time.Second}
	apiHost := strings.TrimPrefix(f.api.URL(), "http://")
	must(t, l.Hold(t.Context(), apiHost, time.Now().Add(time.Hour)))
	req := request(f.git.RepoURL("repo"), &sourcev1.GitRepositoryRef{Branch: "master"})
	req.GitRepository.Provider = sourcev1.GitProviderGitHub
	req.GitRepository.SecretRef = &meta.LocalObjectReference{Name: "auth"}
	src := &Source{Tokens: providertoken.NewCache(0, nil), Limiter: l, Secrets: secretSource(t, newSecret("auth", f.secret())).Secrets}
	ctx, tracker := hostlimit.Track(t.Context())
	if _, err := src.Resolve(ctx, req); failure.As(err) == nil {
		t.Fatalf("resolve with the API's host held: %v, want a failure", err)
	}
	if h := tracker.Held(); h == nil || h.Host != apiHost || !h.ByHost {
		t.Errorf("the fetch learned of hold %v, want the API's host %s held by the host", h, apiHost)
	}
	if n := f.api.Minted(); n != 0 {
		t.Errorf("the API minted %d tokens while held, want none asked for", n)
	}
}

func TestGitHubAppOverTLSThroughAProxy(t *testing.T) {
	// A GitHub Enterprise Server whose certificate only the Secret's
	// ca.crt vouches for, reached through spec.proxySecretRef's proxy.
	f := newGitHubFixture(t, 0)
	key, keyPEM := newAppKey(t)
	api := &tokenserver.GitHubApp{AppID: 4242, PublicKey: &key.PublicKey, InstallationID: 77, Prefix: "/api/v3", TLS: true}
	must(t, api.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = api.Stop() })
	f.api, f.key = api, keyPEM
	proxy := &gitserver.Proxy{Username: "proxy", Password: "pr0xy"}
	must(t, proxy.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = proxy.Stop() })
	proxySecret := map[string]string{"address": proxy.URL(), "username": "proxy", "password": "pr0xy"}
	url := f.git.RepoURL("repo")

	withCA := providerCase{provider: sourcev1.GitProviderGitHub, url: url, proxySecret: proxySecret,
		secret: f.secret("ca.crt", string(api.CACert()))}
	withCA.run(t, &Source{}, f.commit)
	host := strings.TrimPrefix(api.URL(), "https://")
	if reqs := proxy.Requests(); len(reqs) == 0 || reqs[0] != "CONNECT "+host {
		t.Errorf("the proxy relayed %q, want the token request's tunnel to %s first", reqs, host)
	}

	withoutCA := providerCase{provider: sourcev1.GitProviderGitHub, url: url, proxySecret: proxySecret, secret: f.secret(),
		reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient,
		message: "x509: certificate signed by unknown authority"}
	withoutCA.run(t, &Source{}, f.commit)
}

func TestGitHubAppTokenRenewedBeforeExpiry(t *testing.T) {
	// Tokens live 3 s; the cache reuses one for 80% of that.
	f := newGitHubFixture(t, 3*time.Second)
	src := &Source{Tokens: providertoken.NewCache(0, nil)}
	c := providerCase{provider: sourcev1.GitProviderGitHub, url: f.git.RepoURL("repo"), secret: f.secret()}
	start := time.Now()
	c.run(t, src, f.commit)
	c.run(t, src, f.commit)
	if n := f.api.Minted(); n != 1 && time.Since(start) < 2*time.Second {
		t.Fatalf("tokens minted for 2 quick fetches: %d, want 1", n)
	}
	// Every fetch works (the git server takes no expired token) and, once
	// the first token is past 80% of its life, a new one is minted.
	deadline := time.Now().Add(15 * time.Second)
	for f.api.Minted() < 2 && time.Now().Before(deadline) {
		c.run(t, src, f.commit)
	}
	if n := f.api.Minted(); n < 2 {
		t.Errorf("tokens minted over %s of fetches with 3 s tokens: %d, want a new one", time.Since(start).Round(time.Second), n)
	}
}

func TestGitHubAppFailures(t *testing.T) {
	f := newGitHubFixture(t, 0)
	url := f.git.RepoURL("repo")
	tokens := f.api.APIURL() + "/app/installations/77/access_tokens"
	const configure = "failed to configure authentication options: "
	cases := []providerCase{
		{name: "no secret", reason: sourcev1.InvalidProviderConfigurationReason, handling: failure.Stalling,
			message: "secretRef with github app data must be specified when provider is set to github"},
		{name: "no app data", secret: map[string]string{"username": "u", "password": "p"},
			reason: sourcev1.InvalidProviderConfigurationReason, handling: failure.Stalling,
			message: "secretRef with github app data must be specified when provider is set to github"},
		{name: "no private key", secret: f.secret("githubAppPrivateKey", ""),
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
			message: configure + "secret 'default/auth': key 'githubAppPrivateKey' not found"},
		{name: "no app ID", secret: f.secret("githubAppID", ""),
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
			message: configure + "secret 'default/auth': key 'githubAppID' not found"},
		{name: "key not PEM", secret: f.secret("githubAppPrivateKey", "not a key"),
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
			message: configure + "could not parse private key: invalid key: Key must be a PEM encoded PKCS1 or PKCS8 key"},
		{name: "another installation (404)", secret: f.secret("githubAppInstallationID", "78"),
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: configure + "POST " + f.api.APIURL() + "/app/installations/78/access_tokens: 404 Not Found []"},
		{name: "another app (401)", secret: f.secret("githubAppID", "1"),
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: configure + "POST " + tokens + ": 401 'Issuer' claim ('iss') must be an Integer []"},
		{name: "unreachable API", secret: f.secret("githubAppBaseURL", "http://127.0.0.1:1"),
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient,
			message: configure + `Post "http://127.0.0.1:1/app/installations/77/access_tokens": dial tcp 127.0.0.1:1: connect: connection refused`},
		{name: "app data without provider github", provider: sourcev1.GitProviderGeneric, secret: f.secret(),
			reason: sourcev1.InvalidProviderConfigurationReason, handling: failure.Stalling,
			message: "secretRef 'default/auth' has github app data but provider is not set to github"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.provider == "" {
				tc.provider = sourcev1.GitProviderGitHub
			}
			tc.url = url
			tc.run(t, &Source{Secrets: secretSource(t).Secrets}, f.commit)
		})
	}
	t.Run("API error (500)", func(t *testing.T) {
		f.api.FailWith(http.StatusInternalServerError)
		defer f.api.FailWith(0)
		c := providerCase{provider: sourcev1.GitProviderGitHub, url: url, secret: f.secret(),
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient,
			message: configure + "POST " + tokens + ": 500 Internal Server Error []"}
		c.run(t, &Source{}, f.commit)
	})
	if n := f.api.Minted(); n != 0 {
		t.Errorf("tokens minted for failing fetches: %d", n)
	}
}

// entraFixture is a tenant's token endpoint, the fetcher's workload
// identity there, and a git server that takes its tokens as bearer
// tokens, as Azure DevOps does.
type entraFixture struct {
	tenant *tokenserver.EntraID
	git    *gitserver.Server
	env    map[string]string
	roots  *x509.CertPool
	commit string
}

func newEntraFixture(t *testing.T) *entraFixture {
	t.Helper()
	f := &entraFixture{tenant: &tokenserver.EntraID{TenantID: "72f988bf-86f1-41af-91ab-2d7cd011db47",
		ClientID: "5e1f0c2a-7d3b-4f6e-9a8c-0b1d2e3f4a5b", Assertion: "eyJhbGciOiJSUzI1NiJ9.service-account.sig",
		Scope: providertoken.ScopeAzureDevOps}}
	must(t, f.tenant.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = f.tenant.Stop() })
	f.roots = x509.NewCertPool()
	f.roots.AppendCertsFromPEM(f.tenant.CACert())
	file := filepath.Join(t.TempDir(), "azure-identity-token")
	must(t, os.WriteFile(file, []byte(f.tenant.Assertion), 0o600))
	f.env = map[string]string{"AZURE_CLIENT_ID": f.tenant.ClientID, "AZURE_TENANT_ID": f.tenant.TenantID,
		"AZURE_FEDERATED_TOKEN_FILE": file, "AZURE_AUTHORITY_HOST": f.tenant.AuthorityHost()}
	f.git = &gitserver.Server{Root: t.TempDir(), Authorize: func(r *http.Request) bool {
		return sourcetest.BearerValid(r, f.tenant.Valid)
	}}
	must(t, f.git.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = f.git.Stop() })
	f.commit = newRepoIn(t, f.git.Root, "repo")
	// Without a token, or with one the tenant never issued, the git
	// server refuses: a fetch that succeeds is the token's.
	sourcetest.CheckRefusesForgedBearer(t, nil, f.git.RepoURL("repo")+"/info/refs?service=git-upload-pack", http.StatusUnauthorized)
	return f
}

func TestAzureWorkloadIdentity(t *testing.T) {
	f := newEntraFixture(t)
	// The fetcher's environment, as the workload identity webhook sets it.
	for k, v := range f.env {
		t.Setenv(k, v)
	}
	src := &Source{Tokens: providertoken.NewCache(0, nil), TokenRootCAs: f.roots, RefCache: NewRefCache(time.Hour, 0, nil)}
	c := providerCase{provider: sourcev1.GitProviderAzure, url: f.git.RepoURL("repo")}
	for range 3 {
		c.run(t, src, f.commit)
	}
	if n := f.tenant.Minted(); n != 1 {
		t.Errorf("tokens minted for 3 fetches: %d, want 1 (cached)", n)
	}
	// A source of the same URL without the provider is not answered by
	// the listing the fetcher's identity obtained.
	anonymous := providerCase{url: c.url, reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient,
		message: "authentication required"}
	anonymous.run(t, src, f.commit)
}

func TestAzureWorkloadIdentityFailures(t *testing.T) {
	f := newEntraFixture(t)
	url := f.git.RepoURL("repo")
	const prefix = "failed to configure authentication options: failed to get access token for Git repository: " +
		"failed to create provider access token for the controller: "
	endpoint := f.tenant.URL() + "/" + f.tenant.TenantID + "/oauth2/v2.0/token"
	with := func(k, v string) map[string]string {
		env := map[string]string{}
		for kk, vv := range f.env {
			env[kk] = vv
		}
		if v == "" {
			delete(env, k)
		} else {
			env[k] = v
		}
		return env
	}
	wrong := filepath.Join(t.TempDir(), "wrong")
	must(t, os.WriteFile(wrong, []byte("another-token"), 0o600))
	cases := []struct {
		providerCase
		env    map[string]string
		status int
		sa     string
	}{
		{providerCase: providerCase{name: "no client ID", reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: prefix + "Workload Identity: missing environment variables for workload identity. Check webhook and pod configuration"},
			env: with("AZURE_CLIENT_ID", "")},
		{providerCase: providerCase{name: "assertion refused (401)", reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: prefix + "WorkloadIdentityCredential authentication failed: POST " + endpoint + ": RESPONSE 401: invalid_client: AADSTS700211"},
			env: with("AZURE_FEDERATED_TOKEN_FILE", wrong)},
		{providerCase: providerCase{name: "unknown tenant (400)", reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: prefix + "WorkloadIdentityCredential authentication failed: POST " + f.tenant.URL() + "/other/oauth2/v2.0/token: RESPONSE 400: invalid_tenant"},
			env: with("AZURE_TENANT_ID", "other")},
		{providerCase: providerCase{name: "token endpoint error (500)", reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient,
			message: prefix + "WorkloadIdentityCredential authentication failed: POST " + endpoint + ": RESPONSE 500"},
			env: f.env, status: http.StatusInternalServerError},
		{providerCase: providerCase{name: "unreachable authority", reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient,
			message: prefix + "WorkloadIdentityCredential: Post \"https://127.0.0.1:1/"},
			env: with("AZURE_AUTHORITY_HOST", "https://127.0.0.1:1/")},
		{providerCase: providerCase{name: "service account, gate off", reason: "FeatureGateDisabled", handling: failure.Stalling,
			message: "to use spec.serviceAccountName for provider authentication please enable the ObjectLevelWorkloadIdentity feature gate in the controller"},
			env: f.env, sa: "tenant-a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.tenant.FailWith(tc.status)
			defer f.tenant.FailWith(0)
			src := &Source{Getenv: sourcetest.Getenv(tc.env), TokenRootCAs: f.roots}
			req := request(url, &sourcev1.GitRepositoryRef{Branch: "master"})
			req.GitRepository.Provider = sourcev1.GitProviderAzure
			req.GitRepository.ServiceAccountName = tc.sa
			_, err := src.Resolve(context.Background(), req)
			checkProviderFailure(t, err, tc.reason, tc.handling, tc.message)
			if f := failure.As(err); f != nil && strings.Contains(f.Error(), "service-account.sig") {
				t.Errorf("message holds the assertion: %q", f.Error())
			}
		})
	}
	if n := f.tenant.Minted(); n != 0 {
		t.Errorf("tokens minted for failing fetches: %d", n)
	}
}
