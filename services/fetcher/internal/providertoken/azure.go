package providertoken

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProviderAzure names Microsoft Entra ID tokens in metrics and logs.
const ProviderAzure = "azure"

// ScopeAzureDevOps is the scope of a token for Azure DevOps (Flux's
// azure.ScopeDevOps: the Azure DevOps application ID).
const ScopeAzureDevOps = "499b84ac-1321-427f-aa17-267ca6975798/.default"

// Environment of a workload identity, as the Azure Workload Identity
// webhook sets it on a pod and azidentity's WorkloadIdentityCredential
// reads it.
const (
	EnvAzureClientID           = "AZURE_CLIENT_ID"
	EnvAzureTenantID           = "AZURE_TENANT_ID"
	EnvAzureFederatedTokenFile = "AZURE_FEDERATED_TOKEN_FILE"
	EnvAzureAuthorityHost      = "AZURE_AUTHORITY_HOST"
)

// clientAssertionType is how the federated token is presented (RFC 7523).
const clientAssertionType = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"

// AzureWorkloadIdentity is the fetcher's own Microsoft Entra ID identity:
// an application (ClientID in TenantID) that trusts the Kubernetes service
// account token in TokenFile, exchanged for access tokens at
// AuthorityHost.
type AzureWorkloadIdentity struct {
	ClientID, TenantID string
	// TokenFile holds the projected service account token (the client
	// assertion); it is read at every exchange, as Kubernetes rotates it.
	TokenFile string
	// AuthorityHost is the Entra ID authority, e.g.
	// https://login.microsoftonline.com/.
	AuthorityHost string
	// Assertion, when set, gives the client assertion instead of
	// TokenFile: a token of a source's ServiceAccount (object-level
	// workload identity), asked for at every exchange.
	Assertion func(context.Context) (string, error)
	// Subject names the ServiceAccount of Assertion (namespace/name), part
	// of the cache key; empty for the fetcher's own identity.
	Subject string
}

// DefaultAuthorityHost is Entra ID's authority in Azure's public cloud,
// when AZURE_AUTHORITY_HOST names none.
const DefaultAuthorityHost = "https://login.microsoftonline.com/"

// AzureAccountIdentity returns the workload identity of the application
// clientID in tenantID (a ServiceAccount's annotations), at the authority
// of the environment (AZURE_AUTHORITY_HOST through lookup, os.LookupEnv
// when nil; DefaultAuthorityHost when unset), without its assertion.
func AzureAccountIdentity(clientID, tenantID string, lookup func(string) (string, bool)) (*AzureWorkloadIdentity, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	id := &AzureWorkloadIdentity{ClientID: clientID, TenantID: tenantID, AuthorityHost: DefaultAuthorityHost}
	if h, ok := lookup(EnvAzureAuthorityHost); ok && strings.TrimSpace(h) != "" {
		id.AuthorityHost = strings.TrimSpace(h)
	}
	if !validTenantID(tenantID) {
		return nil, configErrorf("invalid tenant ID '%s'", tenantID)
	}
	if u, err := url.Parse(id.AuthorityHost); err != nil || u.Host == "" || u.Scheme != "https" {
		return nil, configErrorf("invalid authority host '%s': must be an https URL", redact(id.AuthorityHost))
	}
	return id, nil
}

// clientAssertion is the service account token: Assertion's, else
// TokenFile's content.
func (w *AzureWorkloadIdentity) clientAssertion(ctx context.Context) (string, error) {
	if w.Assertion != nil {
		return w.Assertion(ctx)
	}
	b, err := os.ReadFile(w.TokenFile)
	if err != nil {
		return "", &ConfigError{Err: fmt.Errorf("WorkloadIdentityCredential: failed to read the federated token file: %w", err)}
	}
	return string(b), nil
}

// AzureWorkloadIdentityFromEnv reads the workload identity from the
// environment through lookup (os.LookupEnv when nil). Like Flux's default
// credential chain it needs all of AZURE_CLIENT_ID, AZURE_TENANT_ID,
// AZURE_FEDERATED_TOKEN_FILE and AZURE_AUTHORITY_HOST; like azidentity it
// takes only an https authority. Faults are *ConfigError values.
func AzureWorkloadIdentityFromEnv(lookup func(string) (string, bool)) (*AzureWorkloadIdentity, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	var id AzureWorkloadIdentity
	var ok [4]bool
	id.ClientID, ok[0] = lookup(EnvAzureClientID)
	id.TenantID, ok[1] = lookup(EnvAzureTenantID)
	id.TokenFile, ok[2] = lookup(EnvAzureFederatedTokenFile)
	id.AuthorityHost, ok[3] = lookup(EnvAzureAuthorityHost)
	if !ok[0] || !ok[1] || !ok[2] || !ok[3] {
		return nil, configErrorf("Workload Identity: missing environment variables for workload identity. Check webhook and pod configuration")
	}
	if !validTenantID(id.TenantID) {
		return nil, configErrorf("Workload Identity: invalid tenantID. You can locate your tenantID by following the instructions listed here: https://learn.microsoft.com/partner-center/find-ids-and-domain-names")
	}
	u, err := url.Parse(id.AuthorityHost)
	if err != nil || u.Host == "" {
		return nil, configErrorf("Workload Identity: invalid authority host '%s'", redact(id.AuthorityHost))
	}
	if u.Scheme != "https" {
		return nil, configErrorf("Workload Identity: cannot use an authority host without https")
	}
	return &id, nil
}

// validTenantID reports whether id is a tenant ID or domain (letters,
// digits, '-' and '.'), as azidentity checks.
func validTenantID(id string) bool {
	if id == "" {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}

// Token returns an access token for scope, from cache when one is
// reusable, else exchanged through client.
func (w *AzureWorkloadIdentity) Token(ctx context.Context, client *http.Client, cache *Cache, scope string) (Token, error) {
	key := Key(ProviderAzure, w.Subject, w.AuthorityHost, w.TenantID, w.ClientID, w.TokenFile, scope)
	return cache.Get(ctx, ProviderAzure, key, func(ctx context.Context) (Token, error) {
		return w.mint(ctx, client, scope)
	})
}

// tokenEndpoint is the tenant's OAuth 2.0 token endpoint (what the
// tenant's OpenID configuration names in every Entra ID cloud).
func (w *AzureWorkloadIdentity) tokenEndpoint() string {
	return strings.TrimSuffix(w.AuthorityHost, "/") + "/" + w.TenantID + "/oauth2/v2.0/token"
}

// mint exchanges the service account token for an access token with the
// client credentials grant and a client assertion, as MSAL does for
// azidentity's WorkloadIdentityCredential.
func (w *AzureWorkloadIdentity) mint(ctx context.Context, client *http.Client, scope string) (Token, error) {
	assertion, err := w.clientAssertion(ctx)
	if err != nil {
		return Token{}, err
	}
	form := url.Values{
		"client_id":             {w.ClientID},
		"scope":                 {scope},
		"grant_type":            {"client_credentials"},
		"client_assertion_type": {clientAssertionType},
		"client_assertion":      {strings.TrimSpace(assertion)},
		"client_info":           {"1"},
	}
	endpoint := w.tokenEndpoint()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return Token{}, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	req.Header.Set("Accept", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return Token{}, fmt.Errorf("WorkloadIdentityCredential: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return Token{}, fmt.Errorf("WorkloadIdentityCredential: reading the answer of %s: %w", endpoint, err)
	}
	var body struct {
		AccessToken      string          `json:"access_token"`
		ExpiresIn        json.RawMessage `json:"expires_in"`
		Error            string          `json:"error"`
		ErrorDescription string          `json:"error_description"`
	}
	decodeErr := json.Unmarshal(b, &body)
	if resp.StatusCode != http.StatusOK {
		re := &ResponseError{Method: http.MethodPost, URL: endpoint, StatusCode: resp.StatusCode, Message: http.StatusText(resp.StatusCode),
			format: func(e *ResponseError) string {
				return fmt.Sprintf("WorkloadIdentityCredential authentication failed: %s %s: RESPONSE %d: %s", e.Method, e.URL, e.StatusCode, e.Message)
			}}
		if decodeErr == nil && body.Error != "" {
			re.Message = body.Error
			if body.ErrorDescription != "" {
				re.Message += ": " + firstLine(body.ErrorDescription)
			}
		}
		return Token{}, re
	}
	if decodeErr != nil {
		return Token{}, fmt.Errorf("WorkloadIdentityCredential: decoding the answer of %s: %w", endpoint, decodeErr)
	}
	expiresIn, err := seconds(body.ExpiresIn)
	if body.AccessToken == "" || err != nil {
		return Token{}, errors.New("WorkloadIdentityCredential: the answer of " + endpoint + " holds no access token and lifetime")
	}
	return Token{Value: body.AccessToken, ExpiresAt: start.Add(expiresIn)}, nil
}

// seconds decodes a lifetime in seconds given as a JSON number or string
// (Entra ID has sent both).
func seconds(raw json.RawMessage) (time.Duration, error) {
	s := strings.Trim(string(raw), `"`)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("invalid expires_in %q", s)
	}
	return time.Duration(n) * time.Second, nil
}

// firstLine is s up to its first line break: Entra ID appends trace and
// correlation IDs on lines of their own.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\r\n")
	line, _, _ = strings.Cut(line, "\n")
	return line
}
