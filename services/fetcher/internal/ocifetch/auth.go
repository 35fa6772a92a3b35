package ocifetch

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/registrylogin"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// Keys of an image pull secret: kubernetes.io/dockerconfigjson and the
// legacy kubernetes.io/dockercfg.
const (
	keyDockerConfigJSON = ".dockerconfigjson"
	keyDockerCfg        = ".dockercfg"
)

const (
	// maxManifestSize bounds a manifest or index read into memory (the
	// distribution registry refuses to store larger ones).
	maxManifestSize = 4 << 20
	// customIdleTimeout bounds how long the idle connections of a job's
	// own transport (one with a CA, a client certificate or a proxy)
	// outlive it.
	customIdleTimeout = 10 * time.Second
)

// access is how a source reaches its registry.
type access struct {
	auth      authn.Authenticator
	transport http.RoundTripper
}

// access reads the Secrets the spec names and builds the credentials and
// transport with Flux's rules: the first image pull secret (spec.secretRef,
// then the service account's) with credentials for the registry, else
// with spec.provider aws, azure or gcp a login with the fetcher's cloud
// identity (see package registrylogin), else anonymous; TLS from spec.certSecretRef, or no certificate check with
// spec.insecure and no certSecretRef; a proxy from spec.proxySecretRef. A
// Secret that cannot be read is a transient failure; one whose content
// cannot work stalls the source.
func (s *Source) access(ctx context.Context, namespace string, spec *sourcev1.OCIRepositorySpec, repo name.Repository) (*access, error) {
	auth, err := s.authenticator(ctx, namespace, spec, repo.RegistryStr())
	if err != nil {
		return nil, err
	}
	var proxy *url.URL
	if ref := spec.ProxySecretRef; ref != nil {
		data, err := s.secret(ctx, namespace, ref.Name)
		if err != nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason,
				"failed to get proxy address: failed to get secret '%s/%s': %w", namespace, ref.Name, err)
		}
		if proxy, err = secrets.ProxyURL(data, namespace+"/"+ref.Name); err != nil {
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason, "failed to get proxy address: %w", err)
		}
	}
	if p := spec.Provider; p != "" && p != sourcev1.GenericOCIProvider && auth == authn.Anonymous {
		if auth, err = s.cloudLogin(ctx, namespace, spec, repo.RegistryStr(), proxy); err != nil {
			return nil, err
		}
	}
	var tlsConfig *tls.Config
	if ref := spec.CertSecretRef; ref != nil && ref.Name != "" {
		data, err := s.secret(ctx, namespace, ref.Name)
		if err != nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason,
				"failed to generate transport for '%s': failed to get secret '%s/%s': %w", spec.URL, namespace, ref.Name, err)
		}
		if tlsConfig, err = secrets.TLSConfig(data, namespace+"/"+ref.Name); err != nil {
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason, "failed to generate transport for '%s': %w", spec.URL, err)
		}
	} else if spec.Insecure {
		// As Flux: insecure without a certSecretRef accepts any
		// certificate (tools like crane push to such registries).
		tlsConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // spec.insecure asks for it
	}
	return &access{auth: auth, transport: hostlimit.Wrap(s.transport(tlsConfig, proxy), s.Limiter)}, nil
}

// cloudLogin logs in to a cloud registry, as Flux does when spec.provider
// is aws, azure or gcp and no image pull secret holds credentials for the
// registry: with the identity of the source's ServiceAccount
// (spec.serviceAccountName, or -default-service-account) under the
// ObjectLevelWorkloadIdentity gate, else with the fetcher's own.
func (s *Source) cloudLogin(ctx context.Context, namespace string, spec *sourcev1.OCIRepositorySpec, registry string, proxy *url.URL) (authn.Authenticator, error) {
	account, err := s.Accounts.Resolve(ctx, namespace, spec.ServiceAccountName)
	if err != nil {
		return nil, err
	}
	login := s.Cloud
	if login == nil {
		login = &registrylogin.Login{}
	}
	cfg, err := login.Credentials(ctx, spec.Provider, namespace, registry, proxy, account)
	if err != nil {
		return nil, source.FailedWith(registrylogin.Handling(err), sourcev1.AuthenticationFailedReason,
			"failed to get credential from %s: %w", spec.Provider, err)
	}
	return authn.FromConfig(cfg), nil
}

// authenticator finds the credentials for registry in the image pull
// secrets of spec.secretRef and spec.serviceAccountName, in that order.
func (s *Source) authenticator(ctx context.Context, namespace string, spec *sourcev1.OCIRepositorySpec, registry string) (authn.Authenticator, error) {
	var names []string
	if ref := spec.SecretRef; ref != nil {
		names = append(names, ref.Name)
	}
	if sa := spec.ServiceAccountName; sa != "" {
		if s.Secrets == nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason, "failed to get credential: no Kubernetes API server is configured")
		}
		pull, err := s.Secrets.ImagePullSecrets(ctx, namespace, sa)
		if err != nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason,
				"failed to get credential: failed to get service account '%s/%s': %w", namespace, sa, err)
		}
		names = append(names, pull...)
	}
	for _, n := range names {
		data, err := s.secret(ctx, namespace, n)
		if err != nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason,
				"failed to get credential: failed to get secret '%s/%s': %w", namespace, n, err)
		}
		cfg, found, err := registryAuth(data, registry)
		if err != nil {
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason,
				"failed to get credential: secret '%s/%s': %w", namespace, n, err)
		}
		if found {
			return authn.FromConfig(cfg), nil
		}
	}
	return authn.Anonymous, nil
}

// secret reads a Secret's data.
func (s *Source) secret(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	if s.Secrets == nil {
		return nil, errors.New("no Kubernetes API server is configured")
	}
	return s.Secrets.Get(ctx, namespace, name)
}

// dockerAuth is one registry's entry of a Docker config.
type dockerAuth struct {
	Username      string `json:"username"`
	Password      string `json:"password"`
	Auth          string `json:"auth"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

// registryAuth returns the credentials an image pull secret's data holds
// for registry; found is false when it holds none for it.
func registryAuth(data map[string][]byte, registry string) (cfg authn.AuthConfig, found bool, err error) {
	var auths map[string]dockerAuth
	switch {
	case data[keyDockerConfigJSON] != nil:
		var c struct {
			Auths map[string]dockerAuth `json:"auths"`
		}
		if err := json.Unmarshal(data[keyDockerConfigJSON], &c); err != nil {
			return cfg, false, fmt.Errorf("invalid '%s': %w", keyDockerConfigJSON, err)
		}
		auths = c.Auths
	case data[keyDockerCfg] != nil:
		if err := json.Unmarshal(data[keyDockerCfg], &auths); err != nil {
			return cfg, false, fmt.Errorf("invalid '%s': %w", keyDockerCfg, err)
		}
	default:
		return cfg, false, fmt.Errorf("no '%s' key: the secret must be of type kubernetes.io/dockerconfigjson", keyDockerConfigJSON)
	}
	for key, a := range auths {
		if !registryMatches(key, registry) {
			continue
		}
		cfg = authn.AuthConfig{Username: a.Username, Password: a.Password, IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
		if a.Auth != "" && cfg.Username == "" && cfg.Password == "" {
			raw, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return cfg, false, fmt.Errorf("invalid 'auth' for '%s': not base64", key)
			}
			user, pass, ok := strings.Cut(string(raw), ":")
			if !ok {
				return cfg, false, fmt.Errorf("invalid 'auth' for '%s': not 'username:password'", key)
			}
			cfg.Username, cfg.Password = user, pass
		}
		return cfg, true, nil
	}
	return cfg, false, nil
}

// dockerHub are the names of Docker Hub's registry.
var dockerHub = map[string]bool{name.DefaultRegistry: true, "docker.io": true, "registry-1.docker.io": true}

// registryMatches reports whether a Docker config key ("host[:port]", with
// an optional scheme and path, or "*.domain") names registry.
func registryMatches(key, registry string) bool {
	host := key
	if i := strings.Index(host, "://"); i >= 0 {
		host = host[i+3:]
	}
	host, _, _ = strings.Cut(host, "/")
	switch {
	case host == registry:
		return true
	case dockerHub[host] && dockerHub[registry]:
		return true
	case strings.HasPrefix(host, "*."):
		h, _, _ := strings.Cut(registry, ":")
		return strings.HasSuffix(h, host[1:]) && !strings.Contains(strings.TrimSuffix(h, host[1:]), ".")
	}
	return false
}

// transport returns the HTTP transport of a source: a shared one without
// TLS settings or proxy, so connections are reused across jobs, and a
// job's own one otherwise. Either refuses manifests over maxManifestSize.
func (s *Source) transport(tlsConfig *tls.Config, proxy *url.URL) http.RoundTripper {
	if tlsConfig == nil && proxy == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.shared == nil {
			t := egress.Guard(remote.DefaultTransport.(*http.Transport).Clone())
			s.shared = manifestLimit{t}
		}
		return s.shared
	}
	t := egress.Guard(remote.DefaultTransport.(*http.Transport).Clone())
	t.IdleConnTimeout = customIdleTimeout
	if tlsConfig != nil {
		t.TLSClientConfig = tlsConfig
	}
	if proxy != nil {
		t.Proxy = http.ProxyURL(proxy)
	}
	return manifestLimit{t}
}

// errManifestTooLarge is the error of a manifest over maxManifestSize.
var errManifestTooLarge = fmt.Errorf("manifest is larger than %d bytes", maxManifestSize)

// manifestLimit refuses manifest responses larger than maxManifestSize,
// before or while they are read.
type manifestLimit struct{ next http.RoundTripper }

func (m manifestLimit) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := m.next.RoundTrip(req)
	if err != nil || req.Method != http.MethodGet || !strings.Contains(req.URL.Path, "/manifests/") {
		return resp, err
	}
	if resp.ContentLength > maxManifestSize {
		resp.Body.Close()
		return nil, errManifestTooLarge
	}
	resp.Body = &limitedBody{ReadCloser: resp.Body, left: maxManifestSize}
	return resp, nil
}

// limitedBody fails a read past its limit.
type limitedBody struct {
	io.ReadCloser
	left int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One more byte tells a body of exactly the limit from a larger one.
		var one [1]byte
		if n, _ := b.ReadCloser.Read(one[:]); n > 0 {
			return 0, errManifestTooLarge
		}
		return b.ReadCloser.Read(p)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
