// Package registrylogin logs in to the container registries of the three
// clouds (Amazon ECR, Azure Container Registry, Google Artifact Registry
// and Container Registry) with the fetcher's own cloud identity, as Flux's
// fluxcd/pkg/auth does for OCIRepository and OCI Helm sources whose
// spec.provider is aws, azure or gcp:
//
//   - aws: the IAM role of the fetcher's service account (IRSA,
//     AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE) assumed with STS's
//     AssumeRoleWithWebIdentity in the registry's region, then ECR's
//     GetAuthorizationToken;
//   - azure: the fetcher's workload identity's Entra ID token (a client
//     assertion) for ACR's scope, exchanged at the registry's
//     /oauth2/exchange for a refresh token;
//   - gcp: the metadata server's access token, presented as
//     oauth2accesstoken.
//
// With a source's ServiceAccount (object-level workload identity, package
// workloadidentity), they log in with its identity instead: the role or
// application its annotations name trusting its token (aws, azure), or
// its token exchanged at Google's STS, impersonating the Google service
// account its annotation names (gcp).
//
// The registry's host must match the cloud's registry names (Flux's
// patterns), which also give the region of ECR. Logins are kept in the
// fetcher's token cache per namespace until shortly before they expire;
// they never leave the process.
package registrylogin

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
)

// Providers of spec.provider this package logs in with.
const (
	AWS   = "aws"
	Azure = "azure"
	GCP   = "gcp"
)

// Flux's patterns of the clouds' registry host names.
const (
	awsRegistryPattern   = `^([0-9]{12})\.dkr[.-]ecr(?:-fips)?\.([a-zA-Z0-9][a-zA-Z0-9_-]{0,99})\.(amazonaws\.(?:com(?:\.cn)?|eu)|on\.(?:aws|amazonwebservices\.com\.cn)|sc2s\.sgov\.gov|c2s\.ic\.gov|cloud\.adc-e\.uk|csp\.hci\.ic\.gov)$`
	azureRegistryPattern = `^.+\.(azurecr\.io|azurecr\.cn|azurecr\.de|azurecr\.us)$`
	gcpRegistryPattern   = `^(((.+\.)?gcr\.io)|(.+-docker\.pkg\.dev)|(docker\.s3nsregistry\.fr))$`
	// publicECR is ECR Public, which Flux logs in to with ecr-public's
	// own token.
	publicECR, publicECRDualStack = "public.ecr.aws", "ecr-public.aws.com"
)

var (
	awsRegistry   = regexp.MustCompile(awsRegistryPattern)
	azureRegistry = regexp.MustCompile(azureRegistryPattern)
	gcpRegistry   = regexp.MustCompile(gcpRegistryPattern)
)

// ErrInvalidRegistry is the error of a registry that is not one of the
// provider's: the spec must change (another provider, or another URL).
var ErrInvalidRegistry = errors.New("invalid registry")

// invalidRegistry is an error that is ErrInvalidRegistry, with a message
// of its own.
type invalidRegistry struct{ msg string }

func (e *invalidRegistry) Error() string        { return e.msg }
func (e *invalidRegistry) Is(target error) bool { return target == ErrInvalidRegistry }

// invalidf returns an ErrInvalidRegistry with a formatted message.
func invalidf(format string, args ...any) error {
	return &invalidRegistry{msg: fmt.Sprintf(format, args...)}
}

// Login logs in to cloud registries. The zero value works with the
// process's environment, the system's certificate authorities and no
// cache.
type Login struct {
	// Tokens keeps logins and identity tokens until shortly before they
	// expire; nil mints for every fetch.
	Tokens *providertoken.Cache
	// Limiter, when set, paces the requests to the token endpoints and
	// the registry's exchange by host, as every other request.
	Limiter *hostlimit.Limiter
	// RootCAs, when set, replace the system's certificate authorities
	// for the token endpoints and ACR's exchange. Tests set it.
	RootCAs *x509.CertPool
	// Getenv looks up the identity's environment; nil reads the
	// process's.
	Getenv func(string) (string, bool)
	// Aliases map a registry host (host:port) to the cloud registry name
	// it stands for, for the host patterns and ECR's region. Only tests
	// set it (there is no flag): a loopback registry cannot be named like
	// a cloud's.
	Aliases map[string]string

	once               sync.Once
	identity, registry http.RoundTripper
}

// ErrUnsupported is the error of a login Headwater cannot do yet.
var ErrUnsupported = errors.New("unsupported")

// Credentials returns the login of registry (host[:port]) for provider,
// for a fetch of namespace, through proxy when not nil, with account's
// identity when not nil (it must be of namespace), else the fetcher's.
// Errors wrapping ErrInvalidRegistry mean the spec cannot work; see
// Handling for the others.
func (l *Login) Credentials(ctx context.Context, provider, namespace, registry string, proxy *url.URL, account *workloadidentity.Account) (authn.AuthConfig, error) {
	name := registry
	if a, ok := l.Aliases[registry]; ok {
		name = a
	}
	identity, exchange, done := l.clients(proxy)
	defer done()
	var login providertoken.Login
	var err error
	switch provider {
	case AWS:
		login, err = l.aws(ctx, identity, namespace, name, account)
	case Azure:
		login, err = l.azure(ctx, identity, exchange, namespace, registry, name, account)
	case GCP:
		login, err = l.gcp(ctx, identity, namespace, name, account)
	default:
		return authn.AuthConfig{}, invalidf("unknown provider '%s'", provider)
	}
	if err != nil {
		return authn.AuthConfig{}, err
	}
	return authn.AuthConfig{Username: login.Username, Password: login.Password}, nil
}

// aws logs in to ECR in the registry's region, as account's role when
// not nil.
func (l *Login) aws(ctx context.Context, client *http.Client, namespace, name string, account *workloadidentity.Account) (providertoken.Login, error) {
	if name == publicECR || name == publicECRDualStack {
		return providertoken.Login{}, invalidf("ECR Public ('%s') is not supported: its images are public, use provider 'generic'", name)
	}
	m := awsRegistry.FindStringSubmatch(name)
	if m == nil {
		return providertoken.Login{}, invalidf("invalid AWS registry: '%s'. must match %s", name, awsRegistryPattern)
	}
	var id *providertoken.AWSWebIdentity
	var err error
	if account != nil {
		id, err = account.AWS(m[2], l.Getenv)
	} else {
		id, err = providertoken.AWSWebIdentityFromEnv(l.Getenv)
	}
	if err != nil {
		return providertoken.Login{}, err
	}
	return id.ECRLogin(ctx, client, l.Tokens, namespace, m[2])
}

// azure exchanges the workload identity's token at the registry: the
// fetcher's, or account's when not nil.
func (l *Login) azure(ctx context.Context, identity, exchange *http.Client, namespace, registry, name string, account *workloadidentity.Account) (providertoken.Login, error) {
	if !azureRegistry.MatchString(name) {
		return providertoken.Login{}, invalidf("invalid Azure registry: '%s'. must match %s", name, azureRegistryPattern)
	}
	var id *providertoken.AzureWorkloadIdentity
	var err error
	if account != nil {
		id, err = account.Azure(l.Getenv)
	} else {
		id, err = providertoken.AzureWorkloadIdentityFromEnv(l.Getenv)
	}
	if err != nil {
		return providertoken.Login{}, err
	}
	return id.ACRLogin(ctx, identity, exchange, l.Tokens, namespace, "https://"+registry, name)
}

// gcp takes the metadata server's token, or with account its federated
// (or impersonated) token.
func (l *Login) gcp(ctx context.Context, client *http.Client, namespace, name string, account *workloadidentity.Account) (providertoken.Login, error) {
	if !gcpRegistry.MatchString(name) {
		return providertoken.Login{}, invalidf("invalid GCP registry: '%s'. must match %s", name, gcpRegistryPattern)
	}
	var t providertoken.Token
	var err error
	if account != nil {
		var id *providertoken.GCPFederation
		if id, err = account.GCP(l.Getenv); err == nil {
			t, err = id.AccessToken(ctx, client, l.Tokens, namespace)
		}
	} else {
		t, err = providertoken.GCPMetadataFromEnv(l.Getenv).Token(ctx, client, l.Tokens, namespace)
	}
	if err != nil {
		return providertoken.Login{}, err
	}
	return providertoken.Login{Username: "oauth2accesstoken", Password: t.Value, ExpiresAt: t.ExpiresAt}, nil
}

// clients returns the HTTP clients of the identity's token endpoints
// (configured by the operator, not the tenant) and of the registry's own
// exchange (a tenant-chosen host, so behind the egress policy), both
// behind the host limits; done releases a proxy's connections.
func (l *Login) clients(proxy *url.URL) (identity, registry *http.Client, done func()) {
	l.once.Do(func() {
		l.identity = hostlimit.Wrap(l.transport(false, nil), l.Limiter)
		l.registry = hostlimit.Wrap(l.transport(true, nil), l.Limiter)
	})
	if proxy == nil {
		return &http.Client{Transport: l.identity}, &http.Client{Transport: l.registry}, func() {}
	}
	it, rt := l.transport(false, proxy), l.transport(true, proxy)
	return &http.Client{Transport: hostlimit.Wrap(it, l.Limiter)}, &http.Client{Transport: hostlimit.Wrap(rt, l.Limiter)},
		func() { it.CloseIdleConnections(); rt.CloseIdleConnections() }
}

// transport is a clone of the default transport with l.RootCAs, guarded
// by the egress policy when guarded, through proxy when not nil.
func (l *Login) transport(guarded bool, proxy *url.URL) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if guarded {
		t = egress.Guard(t)
	}
	if l.RootCAs != nil {
		t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: l.RootCAs}
	}
	if proxy != nil {
		t.Proxy = http.ProxyURL(proxy)
	}
	return t
}

// Handling is how a fetch handles a login that failed: a registry the
// provider does not serve stalls the source; an identity endpoint refusing
// the request (a 4xx: a wrong role, a forged or expired token) or a
// fetcher without the identity's environment fails for good in this job
// (the next interval tries again: the deployment may have changed); an
// outage (a 5xx, a timeout, an endpoint that cannot be reached) is retried.
func Handling(err error) failure.Handling {
	var cfg *providertoken.ConfigError
	switch {
	case errors.Is(err, ErrInvalidRegistry) || errors.Is(err, ErrUnsupported):
		return failure.Stalling
	case providertoken.Refused(err) || errors.As(err, &cfg) || errors.Is(err, workloadidentity.ErrIdentity):
		return failure.Final
	}
	return failure.Transient
}
