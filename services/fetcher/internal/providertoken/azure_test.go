package providertoken

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/testsupport/tokenserver"
)

// startEntraID starts a tenant's token endpoint and returns it with a
// client that trusts it and a token file holding the accepted assertion.
func startEntraID(t *testing.T) (*tokenserver.EntraID, *http.Client, string) {
	t.Helper()
	srv := &tokenserver.EntraID{TenantID: "72f988bf-86f1-41af-91ab-2d7cd011db47", ClientID: "b1a4e0a6-0000-4c3b-9d1e-fetcher",
		Assertion: "eyJhbGciOiJSUzI1NiJ9.sa-token.sig", Scope: ScopeAzureDevOps}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(srv.CACert())
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	file := filepath.Join(t.TempDir(), "azure-identity-token")
	if err := os.WriteFile(file, []byte(srv.Assertion+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return srv, client, file
}

// envOf is a lookup in env.
func envOf(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

func TestAzureWorkloadIdentityFromEnv(t *testing.T) {
	full := map[string]string{EnvAzureClientID: "c", EnvAzureTenantID: "t", EnvAzureFederatedTokenFile: "/f",
		EnvAzureAuthorityHost: "https://login.microsoftonline.com/"}
	without := func(k string) map[string]string {
		m := map[string]string{}
		for kk, v := range full {
			if kk != k {
				m[kk] = v
			}
		}
		return m
	}
	with := func(k, v string) map[string]string {
		m := without("")
		m[k] = v
		return m
	}
	missing := "Workload Identity: missing environment variables for workload identity. Check webhook and pod configuration"
	cases := []struct {
		name string
		env  map[string]string
		want string
	}{
		{name: "complete", env: full},
		{name: "no client ID", env: without(EnvAzureClientID), want: missing},
		{name: "no tenant", env: without(EnvAzureTenantID), want: missing},
		{name: "no token file", env: without(EnvAzureFederatedTokenFile), want: missing},
		{name: "no authority", env: without(EnvAzureAuthorityHost), want: missing},
		{name: "http authority", env: with(EnvAzureAuthorityHost, "http://login.example.com/"),
			want: "Workload Identity: cannot use an authority host without https"},
		{name: "bad tenant", env: with(EnvAzureTenantID, "../other"), want: "Workload Identity: invalid tenantID."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id, err := AzureWorkloadIdentityFromEnv(envOf(tc.env))
			if tc.want == "" {
				if err != nil || id.ClientID != "c" || id.TenantID != "t" || id.TokenFile != "/f" {
					t.Fatalf("identity %+v, %v", id, err)
				}
				return
			}
			var cfg *ConfigError
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !errors.As(err, &cfg) {
				t.Fatalf("error %v (%T), want a *ConfigError starting %q", err, err, tc.want)
			}
		})
	}
}

func TestAzureWorkloadIdentityToken(t *testing.T) {
	srv, client, file := startEntraID(t)
	env := map[string]string{EnvAzureClientID: srv.ClientID, EnvAzureTenantID: srv.TenantID,
		EnvAzureFederatedTokenFile: file, EnvAzureAuthorityHost: srv.AuthorityHost()}
	id, err := AzureWorkloadIdentityFromEnv(envOf(env))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := id.Token(context.Background(), client, nil, ScopeAzureDevOps)
	if err != nil {
		t.Fatal(err)
	}
	if !srv.Valid(tok.Value) {
		t.Errorf("token %q is not one the tenant issued", tok.Value)
	}
	if d := time.Until(tok.ExpiresAt); d < 59*time.Minute || d > time.Hour {
		t.Errorf("token expires in %s, want an hour", d)
	}
}

func TestAzureWorkloadIdentityRefusals(t *testing.T) {
	srv, client, file := startEntraID(t)
	wrong := filepath.Join(t.TempDir(), "wrong-token")
	if err := os.WriteFile(wrong, []byte("someone-else"), 0o600); err != nil {
		t.Fatal(err)
	}
	endpoint := srv.URL() + "/" + srv.TenantID + "/oauth2/v2.0/token"
	prefix := "WorkloadIdentityCredential authentication failed: POST " + endpoint + ": RESPONSE "
	cases := []struct {
		name     string
		mutate   func(*AzureWorkloadIdentity)
		scope    string
		status   int
		want     string
		refused  bool
		badSetup bool
	}{
		{name: "another assertion", mutate: func(w *AzureWorkloadIdentity) { w.TokenFile = wrong }, refused: true,
			want: prefix + "401: invalid_client: AADSTS700211: No matching federated identity record found for presented assertion issuer."},
		{name: "unknown application", mutate: func(w *AzureWorkloadIdentity) { w.ClientID = "nobody" }, refused: true,
			want: prefix + "400: unauthorized_client: AADSTS700016: Application with identifier 'nobody' was not found in the directory."},
		{name: "another scope", scope: "https://storage.azure.com/.default", refused: true,
			want: prefix + "400: invalid_scope: AADSTS70011: The provided value for the input parameter 'scope' is not valid."},
		{name: "unavailable", status: http.StatusServiceUnavailable,
			want: prefix + "503: temporarily_unavailable: AADSTS90033: Service Unavailable."},
		{name: "no token file", mutate: func(w *AzureWorkloadIdentity) { w.TokenFile = filepath.Join(t.TempDir(), "none") }, badSetup: true,
			want: "WorkloadIdentityCredential: failed to read the federated token file: open "},
		{name: "unreachable", mutate: func(w *AzureWorkloadIdentity) { w.AuthorityHost = "https://127.0.0.1:1/" },
			want: "WorkloadIdentityCredential: Post \"https://127.0.0.1:1/" + srv.TenantID + "/oauth2/v2.0/token\": dial tcp 127.0.0.1:1: connect: connection refused"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := &AzureWorkloadIdentity{ClientID: srv.ClientID, TenantID: srv.TenantID, TokenFile: file, AuthorityHost: srv.AuthorityHost()}
			if tc.mutate != nil {
				tc.mutate(id)
			}
			scope := ScopeAzureDevOps
			if tc.scope != "" {
				scope = tc.scope
			}
			srv.FailWith(tc.status)
			defer srv.FailWith(0)
			_, err := id.Token(context.Background(), client, nil, scope)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to start %q", err, tc.want)
			}
			var cfg *ConfigError
			if Refused(err) != tc.refused || errors.As(err, &cfg) != tc.badSetup {
				t.Errorf("Refused %v, a *ConfigError %v; want %v, %v", Refused(err), errors.As(err, &cfg), tc.refused, tc.badSetup)
			}
			if strings.Contains(err.Error(), srv.Assertion) || strings.Contains(err.Error(), "Trace ID") {
				t.Errorf("error holds the assertion or Entra ID's trace lines: %v", err)
			}
		})
	}
}
