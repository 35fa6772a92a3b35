package bucketfetch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"

	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
)

// keyServiceAccount is the Secret key Flux reads a Google service account
// key (JSON) from.
const keyServiceAccount = "serviceaccount"

// googleStorageHost is Google Cloud Storage's own endpoint. A gcp Bucket's
// spec.endpoint names it (Flux ignores the field for gcp); any other
// endpoint is used instead of it, so a GCS-compatible server or an
// emulator can be read.
const googleStorageHost = "storage.googleapis.com"

// googleStorageAPI is the JSON API of Google's own endpoint.
const googleStorageAPI = "https://" + googleStorageHost + "/storage/v1/"

// gcsScopeReadOnly is the OAuth 2.0 scope every gcp token is asked for, as
// Flux asks for it: objects and their metadata can be read, nothing else.
const gcsScopeReadOnly = "https://www.googleapis.com/auth/devstorage.read_only"

// validGCSBucketName tells whether name is a valid Google Cloud Storage
// bucket name: 3 to 222 lowercase letters, digits, '-', '_' and '.',
// starting and ending with a letter or digit (the per-component limit of
// 63 is left to the server).
func validGCSBucketName(name string) bool {
	return validName(name, 3, 222, "-_.")
}

// newGCSStore builds the client of a gcp Bucket as Flux does: the service
// account key of spec.secretRef's "serviceaccount" key, or without a
// secretRef the application default credentials (the pod's workload
// identity through the metadata server, GOOGLE_APPLICATION_CREDENTIALS, or
// gcloud's file), always with the read-only scope; a proxy from
// spec.proxySecretRef. Unlike Flux, spec.endpoint is honoured when it is
// not storage.googleapis.com, and then a missing default credential means
// anonymous access. Only keys of type service_account are accepted: other
// credential configurations (external accounts) can make the fetcher read
// its own files or call arbitrary URLs, so a Secret must not choose them.
//
// With account (object-level workload identity, no secretRef) the token is
// the ServiceAccount's Google identity (workloadidentity's GCP: Google's
// STS exchange and the impersonation its annotation names), from the
// fetcher's token cache, as Flux's gcp provider gives it.
func (s *Source) newGCSStore(ctx context.Context, namespace string, spec *sourcev1.BucketSpec, account *workloadidentity.Account) (store, string, error) {
	endpoint, err := gcsEndpoint(spec)
	if err != nil {
		return nil, "", err
	}
	if !validGCSBucketName(spec.BucketName) {
		return nil, "", source.StalledError(sourcev1.BucketOperationFailedReason,
			"invalid bucket name '%s': a Google Cloud Storage bucket name has 3 to 222 lowercase letters, digits, '-', '_' or '.', and starts and ends with a letter or digit", spec.BucketName)
	}
	data, err := s.authSecret(ctx, namespace, spec)
	if err != nil {
		return nil, "", err
	}
	var key []byte
	if data != nil {
		var ok bool
		if key, ok = data[keyServiceAccount]; !ok {
			return nil, "", source.StalledError(sourcev1.AuthenticationFailedReason,
				"invalid '%s' secret data: required fields '%s'", spec.SecretRef.Name, keyServiceAccount)
		}
	}
	proxy, proxyData, err := s.proxyURL(ctx, namespace, spec)
	if err != nil {
		return nil, "", err
	}

	hc := &http.Client{Transport: s.cloudTransport(proxy)}
	// Tokens are fetched through the same transport (and proxy).
	tokenCtx := context.WithValue(ctx, oauth2.HTTPClient, hc)
	var tokens oauth2.TokenSource
	switch {
	case key != nil:
		if err := checkServiceAccountKey(key); err != nil {
			return nil, "", source.StalledError(sourcev1.AuthenticationFailedReason,
				"failed to create Google credentials from secret: invalid '%s' secret data: %w", spec.SecretRef.Name, err)
		}
		creds, err := google.CredentialsFromJSONWithType(tokenCtx, key, google.ServiceAccount, gcsScopeReadOnly)
		if err != nil {
			return nil, "", source.StalledError(sourcev1.AuthenticationFailedReason,
				"failed to create Google credentials from secret: invalid '%s' secret data: %w", spec.SecretRef.Name, err)
		}
		tokens = creds.TokenSource
	case account != nil:
		const format = "failed to get credential from gcp: %w"
		id, err := account.GCP(s.Getenv)
		if err != nil {
			return nil, "", source.FailedWith(workloadidentity.Handling(err), sourcev1.AuthenticationFailedReason, format, err)
		}
		// The identity endpoints are the operator's: through the Bucket's
		// proxy, as Flux's, and the host limits.
		tokenClient := &http.Client{Transport: s.cloudTransport(proxy)}
		// Minted before the listing, so a refusal is the authentication's.
		first, err := id.AccessToken(ctx, tokenClient, s.Tokens, namespace)
		if err != nil {
			return nil, "", source.FailedWith(workloadidentity.Handling(err), sourcev1.AuthenticationFailedReason, format, err)
		}
		tokens = oauth2.ReuseTokenSource(&oauth2.Token{AccessToken: first.Value, TokenType: "Bearer", Expiry: first.ExpiresAt},
			&federatedTokens{ctx: context.WithoutCancel(ctx), id: id, client: tokenClient, cache: s.Tokens, scope: namespace})
	default:
		creds, err := google.FindDefaultCredentials(tokenCtx, gcsScopeReadOnly)
		switch {
		case err == nil:
			tokens = creds.TokenSource
		case endpoint == "":
			return nil, "", source.Failed(sourcev1.AuthenticationFailedReason, "failed to find Google default credentials: %w", err)
		default:
			logr.FromContextOrDiscard(ctx).V(1).Info("no Google default credentials: reading the bucket anonymously", "endpoint", endpoint)
		}
	}
	if tokens != nil {
		hc = &http.Client{Transport: &oauth2.Transport{Source: tokens, Base: hc.Transport}}
	}
	if endpoint == "" {
		endpoint = googleStorageAPI
	}
	api := &gcsClient{http: hc, base: endpoint, attempts: s.MaxRetries, backoff: gcsInitialBackoff}
	if s.gcsBackoff > 0 {
		api.backoff = s.gcsBackoff
	}
	return &gcsStore{api: api, bucket: spec.BucketName, pageSize: s.listPageSize}, secrets.Fingerprint(data, proxyData), nil
}

// gcsEndpoint returns the JSON API endpoint of spec.endpoint, or "" for
// Google's own. The endpoint is a host[:port] (its scheme then follows
// spec.insecure) or an http(s) URL without a path.
func gcsEndpoint(spec *sourcev1.BucketSpec) (string, error) {
	raw := strings.TrimSpace(spec.Endpoint)
	if !strings.Contains(raw, "://") {
		scheme := "https"
		if spec.Insecure {
			scheme = "http"
		}
		raw = scheme + "://" + raw
	}
	u, err := url.Parse(raw)
	if err == nil && (u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.User != nil) {
		err = errors.New("want host[:port] or an http(s) URL without path, query or user-info")
	}
	if err != nil {
		return "", source.StalledError(sourcev1.URLInvalidReason, "invalid endpoint '%s': %w", spec.Endpoint, err)
	}
	if host, _, splitErr := net.SplitHostPort(u.Host); (splitErr == nil && host == googleStorageHost) || u.Host == googleStorageHost {
		return "", nil
	}
	return u.Scheme + "://" + u.Host + "/storage/v1/", nil
}

// checkServiceAccountKey tells whether key is a JSON service account key,
// without quoting any of it.
func checkServiceAccountKey(key []byte) error {
	var k struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(key, &k); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			return fmt.Errorf("'%s' is not JSON (syntax error at byte %d)", keyServiceAccount, syntax.Offset)
		}
		return fmt.Errorf("'%s' is not a JSON service account key", keyServiceAccount)
	}
	if k.Type != string(google.ServiceAccount) {
		return fmt.Errorf("'%s' is not a service account key: type '%s', want '%s'", keyServiceAccount, k.Type, google.ServiceAccount)
	}
	return nil
}

// federatedTokenTimeout bounds a mint of federatedTokens, which runs
// detached from the fetch that asked (oauth2.TokenSource has no context).
const federatedTokenTimeout = 30 * time.Second

// federatedTokens is the oauth2.TokenSource of a ServiceAccount's Google
// identity, through the fetcher's token cache.
type federatedTokens struct {
	ctx    context.Context
	id     *providertoken.GCPFederation
	client *http.Client
	cache  *providertoken.Cache
	scope  string
}

// Token returns the cached or a new access token.
func (f *federatedTokens) Token() (*oauth2.Token, error) {
	ctx, cancel := context.WithTimeout(f.ctx, federatedTokenTimeout)
	defer cancel()
	t, err := f.id.AccessToken(ctx, f.client, f.cache, f.scope)
	if err != nil {
		return nil, err
	}
	return &oauth2.Token{AccessToken: t.Value, TokenType: "Bearer", Expiry: t.ExpiresAt}, nil
}
