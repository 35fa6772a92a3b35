package tokenserver

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// EntraID is a Microsoft Entra ID tenant's OAuth 2.0 token endpoint for
// one application with one federated credential, over HTTPS (azidentity
// takes no other authority):
//
//	POST /{tenant}/oauth2/v2.0/token   200 {"token_type": "Bearer", "expires_in", "access_token"}
//
// It accepts the client credentials grant with a client assertion (RFC
// 7523) that is exactly Assertion, for ClientID and Scope. Refusals are
// Entra ID's: 400 with "error" and an AADSTS "error_description".
type EntraID struct {
	// TenantID and ClientID name the tenant and the application.
	TenantID, ClientID string
	// Assertion is the federated token (a service account token) accepted,
	// unless Trust is set.
	Assertion string
	// Trust, when set, decides which client assertions are accepted for
	// which application instead of Assertion and ClientID (a federated
	// identity credential of each application).
	Trust func(clientID, assertion string) error
	// Scope is the only scope tokens are issued for.
	Scope string
	// TTL is the lifetime of the tokens minted; an hour when zero.
	TTL time.Duration

	issued
	server

	mu     sync.Mutex
	status int
}

// Start serves the endpoint over HTTPS on addr ("127.0.0.1:0" picks a
// free port) until Stop.
func (e *EntraID) Start(addr string) error {
	return e.start(addr, http.HandlerFunc(e.serve), true)
}

// AuthorityHost is the authority, as AZURE_AUTHORITY_HOST.
func (e *EntraID) AuthorityHost() string { return e.URL() + "/" }

// CACert is the PEM certificate of the server's authority.
func (e *EntraID) CACert() []byte { return e.ca.CertPEM }

// FailWith makes every request answer status until called with 0.
func (e *EntraID) FailWith(status int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.status = status
}

func (e *EntraID) serve(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	status := e.status
	e.mu.Unlock()
	if status != 0 {
		entraError(w, status, "temporarily_unavailable", fmt.Sprintf("AADSTS90033: %s.", http.StatusText(status)))
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != "/"+e.TenantID+"/oauth2/v2.0/token" {
		entraError(w, http.StatusBadRequest, "invalid_tenant", "AADSTS90002: Tenant not found.")
		return
	}
	if err := r.ParseForm(); err != nil {
		entraError(w, http.StatusBadRequest, "invalid_request", "AADSTS900144: The request body must contain the following parameter: 'grant_type'.")
		return
	}
	f := r.PostForm
	trusted := func() bool {
		if e.Trust != nil {
			return e.Trust(f.Get("client_id"), f.Get("client_assertion")) == nil
		}
		return f.Get("client_assertion") == e.Assertion
	}
	switch {
	case f.Get("grant_type") != "client_credentials":
		entraError(w, http.StatusBadRequest, "unsupported_grant_type", "AADSTS70003: The app requested an unsupported grant type.")
	case e.Trust == nil && f.Get("client_id") != e.ClientID:
		entraError(w, http.StatusBadRequest, "unauthorized_client",
			fmt.Sprintf("AADSTS700016: Application with identifier '%s' was not found in the directory.", f.Get("client_id")))
	case f.Get("client_assertion_type") != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer" || !trusted():
		entraError(w, http.StatusUnauthorized, "invalid_client",
			"AADSTS700211: No matching federated identity record found for presented assertion issuer.")
	case f.Get("scope") != e.Scope:
		entraError(w, http.StatusBadRequest, "invalid_scope",
			fmt.Sprintf("AADSTS70011: The provided value for the input parameter 'scope' is not valid. The scope %s is not valid.", f.Get("scope")))
	default:
		ttl := e.TTL
		if ttl == 0 {
			ttl = time.Hour
		}
		token, _ := e.issue(ttl)
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		_ = json.NewEncoder(w).Encode(map[string]any{"token_type": "Bearer", "expires_in": int(ttl.Seconds()),
			"ext_expires_in": int(ttl.Seconds()), "access_token": token})
	}
}

// entraError answers as Entra ID does, with its trace lines.
func entraError(w http.ResponseWriter, status int, code, description string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": code,
		"error_description": description + "\r\nTrace ID: 00000000-0000-0000-0000-000000000000\r\nTimestamp: " + time.Now().UTC().Format(time.DateTime) + "Z",
		"error_codes":       []int{}, "timestamp": time.Now().UTC().Format(time.DateTime) + "Z"})
}
