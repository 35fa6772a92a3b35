package gitfetch

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"

	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
)

// Secret keys Flux reads for Git authentication (spec.secretRef) and for
// the proxy (spec.proxySecretRef).
const (
	keyUsername    = "username"
	keyPassword    = "password" // HTTP password, or the passphrase of an SSH key
	keyBearerToken = "bearerToken"
	keyCA          = "ca.crt"
	keyCAFile      = "caFile" // deprecated spelling, still read by Flux
	keyTLSCert     = "tls.crt"
	keyTLSKey      = "tls.key"
	keyIdentity    = "identity"
	keyKnownHosts  = "known_hosts"
	keyAddress     = "address"
)

// credentials are what a fetch authenticates and connects with.
type credentials struct {
	method transport.AuthMethod
	// ca is added to the system roots for https; cert and key are the
	// client certificate for mutual TLS.
	ca, cert, key []byte
	// proxy is spec.proxySecretRef's proxy, empty for none.
	proxy transport.ProxyOptions
	// ssh is true for an ssh:// URL, whose connections are bounded by the
	// fetch's deadline (see proxyFor).
	ssh bool
	// fingerprint identifies everything above: a digest of the Secrets'
	// data the credentials were built from. It never leaves the process.
	fingerprint string
}

// proxyFor is the proxy to connect through within ctx. For SSH it is a
// dialer that also bounds the connection by ctx's deadline: go-git's SSH
// transport ignores the context while it connects and shakes hands.
func (c *credentials) proxyFor(ctx context.Context) transport.ProxyOptions {
	if deadline, ok := ctx.Deadline(); ok && c.ssh {
		return deadlineProxy(deadline, c.proxy)
	}
	return c.proxy
}

// authenticate reads the Secrets req names, if any, and builds the
// credentials for u with Flux's rules (see credentialsFor and
// proxyOptions); for provider github, azure or aws it adds the provider's token
// (see providerToken). A Secret that cannot be read is a transient
// failure; one whose content cannot work stalls the source.
func (s *Source) authenticate(ctx context.Context, req *events.FetchRequested, u *url.URL) (*credentials, error) {
	spec := req.GitRepository
	ns := req.Job.Object.Namespace
	provider := spec.Provider
	if provider == "" {
		provider = sourcev1.GitProviderGeneric
	}
	if provider != sourcev1.GitProviderGeneric && u.Scheme == "ssh" {
		return nil, source.StalledError(sourcev1.InvalidProviderConfigurationReason,
			"provider '%s' authenticates over HTTP(S) only: use an https URL or provider 'generic' with an SSH key", provider)
	}
	var proxy transport.ProxyOptions
	var proxyData map[string][]byte
	if spec.ProxySecretRef != nil {
		data, err := s.secret(ctx, ns, spec.ProxySecretRef.Name)
		proxyData = data
		if err != nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason, "failed to configure proxy options: %w", err)
		}
		if proxy, err = proxyOptions(ns+"/"+spec.ProxySecretRef.Name, data, u.Scheme); err != nil {
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason, "failed to configure proxy options: %w", err)
		}
	}
	var data map[string][]byte
	if spec.SecretRef != nil {
		name := spec.SecretRef.Name
		d, err := s.secret(ctx, ns, name)
		if err != nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason, "%w", err)
		}
		switch {
		case provider == sourcev1.GitProviderGeneric && providertoken.HasGitHubAppData(d):
			return nil, source.StalledError(sourcev1.InvalidProviderConfigurationReason,
				"secretRef '%s/%s' has github app data but provider is not set to github", ns, name)
		case provider == sourcev1.GitProviderGeneric && u.Scheme != "ssh" &&
			!hasAnyKey(d, keyUsername, keyPassword, keyBearerToken, keyCA, keyCAFile, keyTLSCert, keyTLSKey):
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason,
				"failed to configure authentication options: secret '%s/%s' has none of the keys '%s', '%s', '%s', '%s' or '%s'",
				ns, name, keyUsername, keyPassword, keyBearerToken, keyCA, keyTLSCert)
		}
		data = d
	}
	var app *providertoken.GitHubApp
	if provider == sourcev1.GitProviderGitHub {
		var err error
		if app, err = gitHubApp(spec, ns, data); err != nil {
			return nil, err
		}
	}
	c, err := credentialsFor(u, data)
	if err != nil {
		return nil, source.StalledError(sourcev1.AuthenticationFailedReason, "failed to configure authentication options: %w", err)
	}
	c.proxy = proxy
	c.fingerprint = secrets.Fingerprint(data, proxyData)
	if provider != sourcev1.GitProviderGeneric {
		// A listing obtained with a provider's token never answers a
		// source without it, even with the same Secrets (or none).
		c.fingerprint = secrets.Fingerprint(data, proxyData, map[string][]byte{"provider": []byte(provider)})
		if err := s.providerToken(ctx, provider, spec, app, c, ns, u); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// gitHubApp reads the GitHub App of spec.secretRef's data with Flux's
// rules; every fault stalls the source.
func gitHubApp(spec *sourcev1.GitRepositorySpec, ns string, data map[string][]byte) (*providertoken.GitHubApp, error) {
	if spec.SecretRef == nil {
		return nil, source.StalledError(sourcev1.InvalidProviderConfigurationReason, "%w", providertoken.ErrNoGitHubAppData)
	}
	app, err := providertoken.GitHubAppFromSecret(data, ns+"/"+spec.SecretRef.Name)
	switch {
	case errors.Is(err, providertoken.ErrNoGitHubAppData):
		return nil, source.StalledError(sourcev1.InvalidProviderConfigurationReason, "%w", err)
	case err != nil:
		return nil, source.StalledError(sourcev1.AuthenticationFailedReason, "failed to configure authentication options: %w", err)
	}
	return app, nil
}

// providerToken obtains the token of provider github (a GitHub App
// installation token, sent as the password of user x-access-token),
// azure (a Microsoft Entra ID token for Azure DevOps from the fetcher's
// workload identity, sent as a bearer token) or aws (AWS CodeCommit
// credentials signed with the fetcher's IAM role) and makes it c's
// authentication, as Flux does. Token endpoints are reached through
// spec.proxySecretRef's proxy; a GitHub App's also with its Secret's TLS
// settings (ca.crt, tls.crt and tls.key).
func (s *Source) providerToken(ctx context.Context, provider string, spec *sourcev1.GitRepositorySpec,
	app *providertoken.GitHubApp, c *credentials, ns string, u *url.URL) error {
	if provider == sourcev1.GitProviderAWS && spec.ServiceAccountName != "" {
		return source.StalledError(source.UnsupportedProviderReason,
			"object-level workload identity (spec.serviceAccountName with provider '%s') is not supported for Git (Flux supports it with provider azure only): "+
				"remove serviceAccountName to authenticate with the fetcher's own workload identity", provider)
	}
	var account *workloadidentity.Account
	if provider == sourcev1.GitProviderAzure {
		var err error
		if account, err = s.Accounts.Resolve(ctx, ns, spec.ServiceAccountName); err != nil {
			return err
		}
	}
	client, err := s.tokenClient(c, provider == sourcev1.GitProviderGitHub)
	if err != nil {
		return source.StalledError(sourcev1.AuthenticationFailedReason, "failed to configure authentication options: %w", err)
	}
	defer client.CloseIdleConnections()
	switch provider {
	case sourcev1.GitProviderGitHub:
		token, err := app.Token(ctx, client, s.Tokens)
		if err != nil {
			return tokenFailure(err, "failed to configure authentication options: %w")
		}
		c.method = &githttp.BasicAuth{Username: providertoken.GitHubAppUsername, Password: token.Value}
	case sourcev1.GitProviderAzure:
		// Flux's words for a failed token, through its provider chain.
		const format = "failed to configure authentication options: failed to get access token for Git repository: " +
			"failed to create provider access token for the controller: %w"
		id, err := providertoken.AzureWorkloadIdentityFromEnv(s.Getenv)
		if account != nil {
			// Flux's words for the token of a ServiceAccount.
			const format = "failed to configure authentication options: failed to get access token for Git repository: %w"
			if id, err = account.Azure(s.Getenv); err != nil {
				return source.FailedWith(workloadidentity.Handling(err), sourcev1.AuthenticationFailedReason, format, err)
			}
			token, err := id.Token(ctx, client, s.Tokens, providertoken.ScopeAzureDevOps)
			if err != nil {
				return source.FailedWith(workloadidentity.Handling(err), sourcev1.AuthenticationFailedReason, format, err)
			}
			c.method = &githttp.TokenAuth{Token: token.Value}
			return nil
		}
		if err != nil {
			return tokenFailure(err, format)
		}
		token, err := id.Token(ctx, client, s.Tokens, providertoken.ScopeAzureDevOps)
		if err != nil {
			return tokenFailure(err, format)
		}
		c.method = &githttp.TokenAuth{Token: token.Value}
	case sourcev1.GitProviderAWS:
		login, err := s.codeCommitLogin(ctx, client, ns, u)
		if err != nil {
			return err
		}
		c.method = &githttp.BasicAuth{Username: login.Username, Password: login.Password}
	}
	return nil
}

// codeCommitLogin signs the CodeCommit repository URL u with the
// fetcher's IAM role (IRSA), as Flux does for provider aws.
func (s *Source) codeCommitLogin(ctx context.Context, client *http.Client, ns string, u *url.URL) (providertoken.Login, error) {
	signed := *u
	signed.User = nil
	if a, ok := s.Aliases[u.Host]; ok {
		signed.Host = a
	}
	region, err := codeCommitRegion(&signed)
	if err != nil {
		return providertoken.Login{}, source.StalledError(sourcev1.AuthenticationFailedReason, "failed to configure authentication options: %w", err)
	}
	const format = "failed to configure authentication options: failed to get access token for Git repository: " +
		"failed to create provider access token for the controller: %w"
	id, err := providertoken.AWSWebIdentityFromEnv(s.Getenv)
	if err != nil {
		return providertoken.Login{}, tokenFailure(err, format)
	}
	login, err := id.CodeCommitLogin(ctx, client, s.Tokens, ns, region, &signed)
	if err != nil {
		return providertoken.Login{}, tokenFailure(err, format)
	}
	return login, nil
}

// codeCommitRegion checks u is an AWS CodeCommit HTTPS URL
// (git-codecommit[-fips].<region>.amazonaws.com[.cn]) and returns its
// region, with Flux's messages.
func codeCommitRegion(u *url.URL) (string, error) {
	if !strings.EqualFold(u.Scheme, "https") {
		return "", errors.New("AWS CodeCommit authentication requires an HTTPS Git URL")
	}
	h := u.Hostname()
	parts := strings.Split(h, ".")
	if len(parts) < 4 ||
		!(strings.HasPrefix(h, "git-codecommit.") || strings.HasPrefix(h, "git-codecommit-fips.")) ||
		!(strings.HasSuffix(h, ".amazonaws.com") || strings.HasSuffix(h, ".amazonaws.com.cn")) {
		return "", fmt.Errorf("invalid AWS CodeCommit Git URL: %s", u.Host)
	}
	return parts[1], nil
}

// tokenFailure classifies a token that could not be obtained: an endpoint
// refusing the request (a 4xx) or a fetcher without a workload identity
// fails for good in this job, but not the source (the next interval tries
// again, and the installation or the deployment may have changed by
// then); anything else (a 5xx, an endpoint that cannot be reached) may
// pass, and is retried.
func tokenFailure(err error, format string) error {
	var cfg *providertoken.ConfigError
	if providertoken.Refused(err) || errors.As(err, &cfg) {
		return source.FailedWith(failure.Final, sourcev1.AuthenticationFailedReason, format, err)
	}
	return source.Failed(sourcev1.AuthenticationFailedReason, format, err)
}

// tokenClient is an HTTP client for a token endpoint: through c's proxy,
// trusting s.TokenRootCAs or the system's authorities, and, with
// secretTLS, the Secret's ca.crt too and its client certificate; behind
// s.Limiter, so the endpoint's host is paced and its holds kept.
func (s *Source) tokenClient(c *credentials, secretTLS bool) (*http.Client, error) {
	roots := s.TokenRootCAs
	if roots == nil {
		var err error
		if roots, err = x509.SystemCertPool(); err != nil {
			roots = x509.NewCertPool()
		}
	} else {
		roots = roots.Clone()
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
	if secretTLS {
		if len(c.ca) > 0 && !roots.AppendCertsFromPEM(c.ca) {
			return nil, fmt.Errorf("failed to parse CA certificate in '%s'", keyCA)
		}
		if len(c.cert) > 0 {
			pair, err := tls.X509KeyPair(c.cert, c.key)
			if err != nil {
				return nil, fmt.Errorf("invalid TLS certificate and key pair: %w", err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
	}
	tr := egress.Transport()
	tr.TLSClientConfig = cfg
	if c.proxy.URL != "" {
		p, err := url.Parse(c.proxy.URL)
		if err != nil {
			return nil, errors.New("failed to parse proxy address")
		}
		if c.proxy.Username != "" {
			p.User = url.UserPassword(c.proxy.Username, c.proxy.Password)
		}
		tr.Proxy = http.ProxyURL(p)
	}
	return &http.Client{Transport: hostlimit.Wrap(tr, s.Limiter)}, nil
}

// secret reads the data of the Secret namespace/name, with Flux's words
// for a failure.
func (s *Source) secret(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	if s.Secrets == nil {
		return nil, fmt.Errorf("failed to get secret '%s/%s': no Kubernetes API server is configured", namespace, name)
	}
	data, err := s.Secrets.Get(ctx, namespace, name)
	if err != nil {
		return nil, fmt.Errorf("failed to get secret '%s/%s': %w", namespace, name, err)
	}
	return data, nil
}

// credentialsFor applies Flux's rules (git.NewAuthOptions and the go-git
// client's checks) to a Secret's data, which is nil without a Secret.
//
// For http and https: ca.crt (or caFile) joins the system roots,
// tls.crt and tls.key are a client certificate, bearerToken is preferred to
// username and password, and the URL's user-info fills what the Secret
// leaves empty. For ssh: identity (a private key, decrypted with password
// when it is encrypted) and known_hosts are required, the user is the URL's
// or "git", and host keys are always checked against known_hosts.
func credentialsFor(u *url.URL, data map[string][]byte) (*credentials, error) {
	if u.Scheme == "ssh" {
		return sshCredentials(u, data)
	}
	c := &credentials{}
	var username, password, token string
	if data != nil {
		if c.ca = data[keyCA]; len(c.ca) == 0 {
			c.ca = data[keyCAFile]
		}
		c.cert, c.key = data[keyTLSCert], data[keyTLSKey]
		if t, found := data[keyBearerToken]; found {
			token = string(t)
		} else {
			username, password = string(data[keyUsername]), string(data[keyPassword])
		}
	}
	if username == "" {
		username = u.User.Username()
	}
	if password == "" {
		password, _ = u.User.Password()
	}
	switch {
	case username == "" && password != "":
		return nil, fmt.Errorf("invalid '%s' auth option: 'password' requires 'username' to be set", u.Scheme)
	case token != "" && (username != "" || password != ""):
		return nil, errors.New("basic auth and bearer token cannot be set at the same time")
	case token != "":
		c.method = &githttp.TokenAuth{Token: token}
	case username != "":
		c.method = &githttp.BasicAuth{Username: username, Password: password}
	}
	if u.Scheme == "https" {
		if err := checkTLS(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// checkTLS rejects a CA or client certificate that cannot be used, which
// go-git would otherwise ignore or report on every fetch.
func checkTLS(c *credentials) error {
	switch {
	case len(c.cert) > 0 && len(c.key) == 0:
		return fmt.Errorf("secret contains '%s' but misses '%s'", keyTLSCert, keyTLSKey)
	case len(c.key) > 0 && len(c.cert) == 0:
		return fmt.Errorf("secret contains '%s' but misses '%s'", keyTLSKey, keyTLSCert)
	case len(c.cert) > 0:
		if _, err := tls.X509KeyPair(c.cert, c.key); err != nil {
			return fmt.Errorf("invalid TLS certificate and key pair: %w", err)
		}
	}
	if len(c.ca) > 0 && !x509.NewCertPool().AppendCertsFromPEM(c.ca) {
		return fmt.Errorf("failed to parse CA certificate in '%s'", keyCA)
	}
	return nil
}

// proxyOptions reads a proxy Secret as Flux does: address is required and
// must be an http, https or socks5 URL; username and password, optional,
// authenticate with the proxy. An ssh URL can only go through socks5.
func proxyOptions(ref string, data map[string][]byte, scheme string) (transport.ProxyOptions, error) {
	address, found := data[keyAddress]
	switch {
	case !found:
		return transport.ProxyOptions{}, fmt.Errorf("secret '%s': key '%s' not found", ref, keyAddress)
	case len(address) == 0:
		return transport.ProxyOptions{}, fmt.Errorf("secret '%s': proxy address is empty", ref)
	case len(address) > 2048:
		return transport.ProxyOptions{}, fmt.Errorf("secret '%s': proxy URL exceeds maximum length of 2048 characters", ref)
	}
	u, err := url.Parse(string(address))
	if err != nil {
		return transport.ProxyOptions{}, fmt.Errorf("secret '%s': failed to parse proxy address: %w", ref, err)
	}
	switch u.Scheme {
	case "http", "https", "socks5":
	default:
		return transport.ProxyOptions{}, fmt.Errorf("secret '%s': proxy URL must use one of the supported schemes (http, https, socks5), got '%s'", ref, u.Scheme)
	}
	if scheme == "ssh" && u.Scheme != "socks5" {
		return transport.ProxyOptions{}, fmt.Errorf("secret '%s': an ssh URL can only be fetched through a socks5 proxy, got '%s'", ref, u.Scheme)
	}
	if u.Host == "" {
		return transport.ProxyOptions{}, fmt.Errorf("secret '%s': proxy address '%s' has no host", ref, failure.RedactURL(u.String()))
	}
	opts := transport.ProxyOptions{Username: string(data[keyUsername]), Password: string(data[keyPassword])}
	if opts.Username == "" && u.User != nil {
		opts.Username = u.User.Username()
		opts.Password, _ = u.User.Password()
	}
	u.User = nil
	opts.URL = u.String()
	return opts, nil
}

// isAuthFailure reports whether a fetch failed on authentication: the
// server or the proxy refused the credentials, or SSH could not
// authenticate the server or the client.
func isAuthFailure(err error) bool {
	if errors.Is(err, transport.ErrAuthenticationRequired) || errors.Is(err, transport.ErrAuthorizationFailed) ||
		errors.Is(err, transport.ErrInvalidAuthMethod) || errors.Is(err, errHostKey) {
		return true
	}
	// The SSH client, go-git for a relayed request, net/http for a tunnel
	// and the SOCKS5 client only say it in words.
	msg := err.Error()
	return strings.Contains(msg, "ssh: unable to authenticate") || strings.Contains(msg, "status code: 407") ||
		strings.Contains(msg, http.StatusText(http.StatusProxyAuthRequired)) ||
		strings.Contains(msg, "username/password authentication failed")
}

func hasAnyKey(data map[string][]byte, keys ...string) bool {
	for _, k := range keys {
		if _, ok := data[k]; ok {
			return true
		}
	}
	return false
}
