package providertoken

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ScopeACR is the scope of the Entra ID token exchanged for an ACR
// refresh token (azcontainerregistry's audience in every Azure cloud).
const ScopeACR = "https://containerregistry.azure.net/.default"

// ACRUsername is the user name an ACR refresh token is presented with.
const ACRUsername = "00000000-0000-0000-0000-000000000000"

// acrAPIVersion is the version of ACR's authentication API asked for, as
// azcontainerregistry asks.
const acrAPIVersion = "2021-07-01"

// ACRLogin returns the login of the Azure container registry at
// endpoint (https://<registry>) for service (its host name): the fetcher's
// workload identity's Entra ID token for ScopeACR exchanged at the
// registry's /oauth2/exchange for a refresh token, as Flux does. tokens
// reaches Entra ID, registry the registry. scope (a namespace) is part of
// the cache key of the login.
func (w *AzureWorkloadIdentity) ACRLogin(ctx context.Context, tokens, registry *http.Client, cache *Cache, scope, endpoint, service string) (Login, error) {
	key := Key(ProviderAzure, "acr", scope, w.Subject, w.AuthorityHost, w.TenantID, w.ClientID, w.TokenFile, endpoint, service)
	t, err := cache.Get(ctx, ProviderAzure, key, func(ctx context.Context) (Token, error) {
		aad, err := w.Token(ctx, tokens, cache, ScopeACR)
		if err != nil {
			return Token{}, err
		}
		return exchangeACR(ctx, registry, endpoint, service, aad.Value)
	})
	if err != nil {
		return Login{}, err
	}
	return Login{Username: ACRUsername, Password: t.Value, ExpiresAt: t.ExpiresAt}, nil
}

// exchangeACR exchanges an Entra ID access token for an ACR refresh token,
// whose expiry is its JWT's exp claim.
func exchangeACR(ctx context.Context, client *http.Client, endpoint, service, accessToken string) (Token, error) {
	form := url.Values{"grant_type": {"access_token"}, "service": {service}, "access_token": {accessToken}}
	u := strings.TrimSuffix(endpoint, "/") + "/oauth2/exchange"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u+"?api-version="+acrAPIVersion, strings.NewReader(form.Encode()))
	if err != nil {
		return Token{}, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return Token{}, fmt.Errorf("failed to exchange the Entra ID token at %s: %w", u, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return Token{}, fmt.Errorf("reading the answer of %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return Token{}, &ResponseError{Method: http.MethodPost, URL: u, StatusCode: resp.StatusCode, Message: firstLine(strings.TrimSpace(string(b))),
			format: func(e *ResponseError) string {
				return fmt.Sprintf("%s %s\n--------------------------------------------------------------------------------\nRESPONSE %d: %s",
					e.Method, e.URL, e.StatusCode, e.Message)
			}}
	}
	var body struct {
		RefreshToken string `json:"refresh_token"`
	}
	if err := json.Unmarshal(b, &body); err != nil || body.RefreshToken == "" {
		return Token{}, fmt.Errorf("the answer of %s holds no refresh token", u)
	}
	exp, err := jwtExpiry(body.RefreshToken)
	if err != nil {
		return Token{}, fmt.Errorf("the refresh token of %s: %w", u, err)
	}
	return Token{Value: body.RefreshToken, ExpiresAt: exp}, nil
}

// jwtExpiry reads a JWT's exp claim without verifying it (the registry
// verifies its own tokens; the fetcher only needs to know when to renew).
func jwtExpiry(token string) (time.Time, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, errors.New("token is malformed: not a JWT")
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, fmt.Errorf("token is malformed: %w", err)
	}
	var claims struct {
		Exp json.Number `json:"exp"`
	}
	if err := json.Unmarshal(raw, &claims); err != nil {
		return time.Time{}, fmt.Errorf("token is malformed: %w", err)
	}
	exp, err := claims.Exp.Int64()
	if err != nil || exp <= 0 {
		return time.Time{}, errors.New("token has no expiration time")
	}
	return time.Unix(exp, 0), nil
}
