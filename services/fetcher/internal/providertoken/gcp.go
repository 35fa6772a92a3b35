package providertoken

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// ProviderGCP names Google Cloud access tokens in metrics and logs.
const ProviderGCP = "gcp"

// EnvGCEMetadataHost overrides the metadata server's address, as Google's
// client libraries read it (GKE's metadata server, or the tests').
const EnvGCEMetadataHost = "GCE_METADATA_HOST"

// gceMetadataIP is the metadata server's address when the environment
// names none.
const gceMetadataIP = "169.254.169.254"

// GCPScopes are the scopes of a controller's Google Cloud access token, as
// Flux asks for them.
var GCPScopes = []string{"https://www.googleapis.com/auth/cloud-platform", "https://www.googleapis.com/auth/userinfo.email"}

// GCPMetadata is the fetcher's own Google Cloud identity, as the GKE
// metadata server (Workload Identity Federation for GKE) or a VM's
// metadata server hands it out.
type GCPMetadata struct {
	// Host is the metadata server's host[:port].
	Host string
}

// GCPMetadataFromEnv returns the metadata server named by
// GCE_METADATA_HOST through lookup (os.LookupEnv when nil), else the
// well-known one.
func GCPMetadataFromEnv(lookup func(string) (string, bool)) *GCPMetadata {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if h, ok := lookup(EnvGCEMetadataHost); ok && strings.TrimSpace(h) != "" {
		return &GCPMetadata{Host: strings.TrimSpace(h)}
	}
	return &GCPMetadata{Host: gceMetadataIP}
}

// Token returns an access token of the instance's default service account
// with GCPScopes, from cache when reusable, else from the metadata server
// through client. scope (a namespace) is part of the cache key.
func (g *GCPMetadata) Token(ctx context.Context, client *http.Client, cache *Cache, scope string) (Token, error) {
	key := Key(ProviderGCP, scope, g.Host)
	return cache.Get(ctx, ProviderGCP, key, func(ctx context.Context) (Token, error) {
		return g.mint(ctx, client)
	})
}

// mint asks the metadata server for a token, as the compute metadata
// client does.
func (g *GCPMetadata) mint(ctx context.Context, client *http.Client) (Token, error) {
	endpoint := "http://" + g.Host + "/computeMetadata/v1/instance/service-accounts/default/token"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"?scopes="+strings.Join(GCPScopes, ","), nil)
	if err != nil {
		return Token{}, err
	}
	req.Header.Set("Metadata-Flavor", "Google")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return Token{}, fmt.Errorf("failed to reach the GCP metadata server at %s (the fetcher must run on GKE with Workload Identity, or set %s): %w",
			g.Host, EnvGCEMetadataHost, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return Token{}, fmt.Errorf("reading the answer of the GCP metadata server: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return Token{}, &ResponseError{Method: http.MethodGet, URL: endpoint, StatusCode: resp.StatusCode, Message: firstLine(strings.TrimSpace(string(b))),
			format: func(e *ResponseError) string {
				return fmt.Sprintf("compute: Received %d `%s` from %s", e.StatusCode, e.Message, e.URL)
			}}
	}
	var body struct {
		AccessToken string          `json:"access_token"`
		ExpiresIn   json.RawMessage `json:"expires_in"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return Token{}, fmt.Errorf("decoding the answer of the GCP metadata server: %w", err)
	}
	expiresIn, err := seconds(body.ExpiresIn)
	if body.AccessToken == "" || err != nil {
		return Token{}, fmt.Errorf("the GCP metadata server answered %s without an access token and lifetime", endpoint)
	}
	return Token{Value: body.AccessToken, ExpiresAt: start.Add(expiresIn)}, nil
}

// get reads a value of the metadata server (path under
// /computeMetadata/v1/), as the compute metadata client does.
func (g *GCPMetadata) get(ctx context.Context, client *http.Client, path string) (string, error) {
	endpoint := "http://" + g.Host + "/computeMetadata/v1/" + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Metadata-Flavor", "Google")
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("failed to reach the GCP metadata server at %s (the fetcher must run on GKE with Workload Identity, or set %s): %w",
			g.Host, EnvGCEMetadataHost, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return "", fmt.Errorf("reading the answer of the GCP metadata server: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", &ResponseError{Method: http.MethodGet, URL: endpoint, StatusCode: resp.StatusCode, Message: firstLine(strings.TrimSpace(string(b))),
			format: func(e *ResponseError) string {
				return fmt.Sprintf("compute: Received %d `%s` from %s", e.StatusCode, e.Message, e.URL)
			}}
	}
	return strings.TrimSpace(string(b)), nil
}
