package providertoken

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Endpoints of Google's Security Token Service and IAM Service Account
// Credentials API, and the environment that replaces them (the operator's,
// for a private endpoint or the tests' servers; never a tenant's spec).
const (
	DefaultGCPSTSEndpoint            = "https://sts.googleapis.com"
	DefaultGCPIAMCredentialsEndpoint = "https://iamcredentials.googleapis.com"
	EnvGCPSTSEndpoint                = "HEADWATER_GCP_STS_ENDPOINT"
	EnvGCPIAMCredentialsEndpoint     = "HEADWATER_GCP_IAM_CREDENTIALS_ENDPOINT"
)

// The token exchange of RFC 8693 as Google's external account credentials
// (golang.org/x/oauth2/google/externalaccount) send it.
const (
	gcpGrantTokenExchange  = "urn:ietf:params:oauth:grant-type:token-exchange"
	gcpTokenTypeAccess     = "urn:ietf:params:oauth:token-type:access_token"
	gcpSubjectTokenTypeJWT = "urn:ietf:params:oauth:token-type:jwt"
	gcpCloudPlatformScope  = "https://www.googleapis.com/auth/cloud-platform"
)

// GCPFederation is a Kubernetes ServiceAccount's Google Cloud identity
// (Workload Identity Federation, as Flux's fluxcd/pkg/auth/gcp has it):
// the ServiceAccount's token is exchanged at Google's STS for a federated
// access token and, when Email names a Google service account, that token
// impersonates it (IAM Credentials' generateAccessToken).
type GCPFederation struct {
	// Provider is the workload identity provider's audience
	// (//iam.googleapis.com/projects/.../providers/...), from the
	// ServiceAccount's annotation; empty on GKE, where the audience comes
	// from the cluster's metadata.
	Provider string
	// Metadata is the GKE metadata server, read for the workload identity
	// pool when Provider is empty.
	Metadata *GCPMetadata
	// Email is the Google service account to impersonate; empty for the
	// federated token itself (direct resource access).
	Email string
	// STSEndpoint and IAMCredentialsEndpoint are the base URLs of the two
	// APIs.
	STSEndpoint, IAMCredentialsEndpoint string
	// Token requests the ServiceAccount's token for an audience.
	Token func(ctx context.Context, audience string) (string, error)
	// Subject names the ServiceAccount (namespace/name), part of the cache
	// key.
	Subject string
}

// GCPEndpointsFromEnv returns a federation at the endpoints of the
// environment (through lookup, os.LookupEnv when nil), else Google's, with
// the metadata server of GCE_METADATA_HOST.
func GCPEndpointsFromEnv(lookup func(string) (string, bool)) *GCPFederation {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	get := func(k, def string) string {
		if v, ok := lookup(k); ok && strings.TrimSpace(v) != "" {
			return strings.TrimRight(strings.TrimSpace(v), "/")
		}
		return def
	}
	return &GCPFederation{Metadata: GCPMetadataFromEnv(lookup),
		STSEndpoint:            get(EnvGCPSTSEndpoint, DefaultGCPSTSEndpoint),
		IAMCredentialsEndpoint: get(EnvGCPIAMCredentialsEndpoint, DefaultGCPIAMCredentialsEndpoint)}
}

// AccessToken returns an access token of the identity with GCPScopes, from
// cache when reusable, else minted through client. scope (a namespace) is
// part of the cache key.
func (f *GCPFederation) AccessToken(ctx context.Context, client *http.Client, cache *Cache, scope string) (Token, error) {
	key := Key(ProviderGCP, "federation", scope, f.Subject, f.Provider, f.Metadata.Host, f.Email, f.STSEndpoint, f.IAMCredentialsEndpoint)
	return cache.Get(ctx, ProviderGCP, key, func(ctx context.Context) (Token, error) {
		return f.mint(ctx, client)
	})
}

// audiences are the audience of the ServiceAccount's token and the STS
// audience: the provider's for both, or on GKE the workload identity pool
// <project>.svc.id.goog and identitynamespace:<pool>:<cluster URL>.
func (f *GCPFederation) audiences(ctx context.Context, client *http.Client) (token, sts string, err error) {
	if f.Provider != "" {
		return f.Provider, f.Provider, nil
	}
	get := func(path, what string) (string, error) {
		v, err := f.Metadata.get(ctx, client, path)
		if err != nil {
			return "", fmt.Errorf("failed to get GKE cluster %s from the metadata service: %w", what, err)
		}
		if v == "" {
			return "", fmt.Errorf("failed to get GKE cluster %s from the metadata service: empty value", what)
		}
		return v, nil
	}
	project, err := get("project/project-id", "project ID")
	if err != nil {
		return "", "", err
	}
	location, err := get("instance/attributes/cluster-location", "location")
	if err != nil {
		return "", "", err
	}
	cluster, err := get("instance/attributes/cluster-name", "name")
	if err != nil {
		return "", "", err
	}
	pool := project + ".svc.id.goog"
	return pool, fmt.Sprintf("identitynamespace:%s:https://container.googleapis.com/v1/projects/%s/locations/%s/clusters/%s",
		pool, project, location, cluster), nil
}

// mint exchanges the ServiceAccount's token, then impersonates Email when
// set.
func (f *GCPFederation) mint(ctx context.Context, client *http.Client) (Token, error) {
	tokenAudience, stsAudience, err := f.audiences(ctx, client)
	if err != nil {
		return Token{}, err
	}
	subject, err := f.Token(ctx, tokenAudience)
	if err != nil {
		return Token{}, err
	}
	// Impersonation asks STS for cloud-platform only and the service
	// account's token for the scopes, as externalaccount does.
	stsScopes := GCPScopes
	if f.Email != "" {
		stsScopes = []string{gcpCloudPlatformScope}
	}
	federated, err := f.exchange(ctx, client, stsAudience, subject, stsScopes)
	if err != nil || f.Email == "" {
		return federated, err
	}
	return f.impersonate(ctx, client, federated.Value)
}

// exchange is STS's token exchange.
func (f *GCPFederation) exchange(ctx context.Context, client *http.Client, audience, subject string, scopes []string) (Token, error) {
	endpoint := f.STSEndpoint + "/v1/token"
	form := url.Values{
		"grant_type":           {gcpGrantTokenExchange},
		"audience":             {audience},
		"scope":                {strings.Join(scopes, " ")},
		"requested_token_type": {gcpTokenTypeAccess},
		"subject_token_type":   {gcpSubjectTokenTypeJWT},
		"subject_token":        {subject},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return Token{}, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	var body struct {
		AccessToken string          `json:"access_token"`
		ExpiresIn   json.RawMessage `json:"expires_in"`
	}
	start := time.Now()
	if err := gcpCall(client, req, "Secure Token Server", &body); err != nil {
		return Token{}, err
	}
	expiresIn, err := seconds(body.ExpiresIn)
	if body.AccessToken == "" || err != nil || expiresIn <= 0 {
		return Token{}, fmt.Errorf("oauth2/google/externalaccount: got invalid expiry from security token service")
	}
	return Token{Value: body.AccessToken, ExpiresAt: start.Add(expiresIn)}, nil
}

// impersonate is IAM Credentials' generateAccessToken for Email with the
// federated token, for an hour.
func (f *GCPFederation) impersonate(ctx context.Context, client *http.Client, federated string) (Token, error) {
	endpoint := fmt.Sprintf("%s/v1/projects/-/serviceAccounts/%s:generateAccessToken", f.IAMCredentialsEndpoint, url.PathEscape(f.Email))
	b, err := json.Marshal(map[string]any{"lifetime": "3600s", "scope": GCPScopes})
	if err != nil {
		return Token{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(b))
	if err != nil {
		return Token{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+federated)
	var body struct {
		AccessToken string `json:"accessToken"`
		ExpireTime  string `json:"expireTime"`
	}
	if err := gcpCall(client, req, "IAM Credentials", &body); err != nil {
		return Token{}, err
	}
	expiry, err := time.Parse(time.RFC3339, body.ExpireTime)
	if body.AccessToken == "" || err != nil {
		return Token{}, fmt.Errorf("oauth2/google: unable to parse expiry of the impersonated token of %s", f.Email)
	}
	return Token{Value: body.AccessToken, ExpiresAt: expiry}, nil
}

// gcpCall sends req and decodes a 2xx JSON answer into out; another status
// is a *ResponseError worded as Google's oauth2 client does.
func gcpCall(client *http.Client, req *http.Request, api string, out any) error {
	endpoint := req.URL.Scheme + "://" + req.URL.Host + req.URL.Path
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("oauth2/google: failed to reach the %s at %s: %w", api, redact(endpoint), err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("oauth2/google: reading the answer of the %s: %w", api, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &ResponseError{Method: req.Method, URL: redact(endpoint), StatusCode: resp.StatusCode, Message: firstLine(strings.TrimSpace(string(b))),
			format: func(e *ResponseError) string {
				return fmt.Sprintf("oauth2/google: %s %s: status code %d: %s", api, e.URL, e.StatusCode, e.Message)
			}}
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("oauth2/google: failed to unmarshal response body from the %s: %w", api, err)
	}
	return nil
}
