package helmfetch

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// Secret keys Flux reads for a Helm repository's basic auth.
const (
	keyUsername = "username"
	keyPassword = "password"
)

// customIdleTimeout bounds how long the idle connections of a job's own
// transport (one with TLS settings) outlive it.
const customIdleTimeout = 10 * time.Second

// Access is how to reach a chart repository: its URL and the credentials
// of the HelmRepository's Secrets.
type Access struct {
	// URL is the repository's URL, normalised with a trailing slash.
	URL *url.URL
	// Username and Password are the basic auth of spec.secretRef.
	Username, Password string
	// PassCredentials sends the basic auth to hosts other than the
	// repository's (charts served elsewhere), as spec.passCredentials.
	PassCredentials bool
	// Fingerprint identifies the Secrets' data (see secrets.Fingerprint).
	Fingerprint string

	client *http.Client
}

// IndexURL is the URL of the repository's index.
func (a *Access) IndexURL() string { return a.URL.JoinPath("index.yaml").String() }

// Get sends a GET to u with the repository's credentials (to another host
// only with PassCredentials) and header.
func (a *Access) Get(ctx context.Context, u string, header http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("User-Agent", "Helm/3 (headwater)")
	if a.Username != "" || a.Password != "" {
		if a.PassCredentials || req.URL.Host == a.URL.Host {
			req.SetBasicAuth(a.Username, a.Password)
		}
	}
	return a.client.Do(req)
}

// Transports shares HTTP transports between jobs: the one without TLS
// settings always, so connections to a repository are reused.
type Transports struct {
	// Limiter, when set, passes every request through the limits of its
	// host (see package hostlimit).
	Limiter *hostlimit.Limiter

	once   sync.Once
	shared *http.Transport
}

func (t *Transports) get(tlsConfig *tls.Config) *http.Transport {
	t.once.Do(func() {
		t.shared = egress.Transport()
	})
	if tlsConfig == nil {
		return t.shared
	}
	own := t.shared.Clone()
	own.TLSClientConfig = tlsConfig
	own.IdleConnTimeout = customIdleTimeout
	return own
}

// NewAccess checks a HelmRepository's URL and reads its Secrets with
// Flux's rules (getter.GetClientOpts): basic auth from spec.secretRef,
// TLS from spec.certSecretRef, or from spec.secretRef when it holds TLS
// keys (deprecated in Flux, still read). A Secret that cannot be read is a
// transient AuthenticationFailed; one that cannot work stalls.
func NewAccess(ctx context.Context, r secrets.Reader, t *Transports, namespace string, spec *sourcev1.HelmRepositorySpec) (*Access, error) {
	u, err := NormalizeURL(spec.URL)
	if err != nil {
		return nil, err
	}
	a := &Access{URL: u, PassCredentials: spec.PassCredentials}
	get := func(ref *meta.LocalObjectReference) (map[string][]byte, error) {
		if r == nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason, "failed to get secret '%s/%s': %w",
				namespace, ref.Name, secrets.ErrNoCluster)
		}
		data, err := r.Get(ctx, namespace, ref.Name)
		if err != nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason, "failed to get secret '%s/%s': %w", namespace, ref.Name, err)
		}
		return data, nil
	}
	var auth, certs map[string][]byte
	if ref := spec.SecretRef; ref != nil {
		if auth, err = get(ref); err != nil {
			return nil, err
		}
		user, hasUser := auth[keyUsername]
		pass, hasPass := auth[keyPassword]
		switch {
		case hasUser != hasPass:
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason,
				"invalid '%s' secret data: required fields 'username' and 'password'", ref.Name)
		case !hasUser && !secrets.HasTLS(auth):
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason,
				"invalid '%s' secret data: required fields 'username' and 'password', or TLS keys", ref.Name)
		}
		a.Username, a.Password = string(user), string(pass)
	}
	var tlsConfig *tls.Config
	switch {
	case spec.CertSecretRef != nil:
		if certs, err = get(spec.CertSecretRef); err != nil {
			return nil, err
		}
		if tlsConfig, err = secrets.TLSConfig(certs, namespace+"/"+spec.CertSecretRef.Name); err != nil {
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason, "failed to construct Helm client's TLS config: %w", err)
		}
	case auth != nil && secrets.HasTLS(auth):
		if tlsConfig, err = secrets.TLSConfig(auth, namespace+"/"+spec.SecretRef.Name); err != nil {
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason, "failed to construct Helm client's TLS config: %w", err)
		}
	}
	if tlsConfig != nil && u.Scheme != "https" {
		tlsConfig = nil // Flux applies TLS settings to https only
	}
	a.Fingerprint = secrets.Fingerprint(auth, certs)
	a.client = &http.Client{Transport: hostlimit.Wrap(t.get(tlsConfig), t.Limiter)}
	return a, nil
}

// NormalizeURL checks a chart repository URL as Flux does (an http or
// https URL with a host; oci is for type oci) and gives it a trailing
// slash. A bad URL stalls with reason URLInvalid.
func NormalizeURL(raw string) (*url.URL, error) {
	if strings.HasPrefix(raw, "oci://") {
		return nil, source.StalledError(sourcev1.URLInvalidReason,
			"invalid Helm repository URL: 'oci' URL scheme cannot be used with 'default' HelmRepository type")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, &failure.Error{Handling: failure.Stalling, Condition: sourcev1.FetchFailedCondition,
			Reason: sourcev1.URLInvalidReason, Err: fmt.Errorf("invalid Helm repository URL: %w", err)}
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, source.StalledError(sourcev1.URLInvalidReason,
			"invalid Helm repository URL: scheme '%s' is not supported: use http or https", u.Scheme)
	case u.Host == "":
		return nil, source.StalledError(sourcev1.URLInvalidReason, "invalid Helm repository URL '%s': no host", failure.RedactURL(raw))
	}
	u.RawQuery, u.Fragment = "", ""
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
		if u.RawPath != "" {
			u.RawPath += "/"
		}
	}
	return u, nil
}
