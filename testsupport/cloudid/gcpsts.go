package cloudid

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// The GKE cluster the metadata server describes, and the audiences a
// workload identity of it uses, as Flux derives them.
const (
	GCPProject  = "headwater-tests"
	GCPLocation = "europe-west1"
	GCPCluster  = "fleet"
	// GCPPool is the workload identity pool: the audience of the
	// ServiceAccount's token on GKE.
	GCPPool = GCPProject + ".svc.id.goog"
	// GCPAudience is the audience STS is asked for on GKE.
	GCPAudience = "identitynamespace:" + GCPPool + ":https://container.googleapis.com/v1/projects/" + GCPProject +
		"/locations/" + GCPLocation + "/clusters/" + GCPCluster
	// GCPServiceAccount is a Google service account a ServiceAccount may
	// impersonate.
	GCPServiceAccount = "fetcher@headwater-tests.iam.gserviceaccount.com"
)

// GCPSTS serves Google's Security Token Service token exchange and IAM
// Credentials' generateAccessToken, over plain HTTP (the fetcher reaches
// them through HEADWATER_GCP_STS_ENDPOINT and
// HEADWATER_GCP_IAM_CREDENTIALS_ENDPOINT):
//
//	POST /v1/token  form grant_type=urn:ietf:params:oauth:grant-type:token-exchange,
//	    audience, scope, requested_token_type=...:access_token,
//	    subject_token_type=urn:ietf:params:oauth:token-type:jwt, subject_token
//	    200 {"access_token", "issued_token_type", "token_type", "expires_in"}
//	POST /v1/projects/-/serviceAccounts/<email>:generateAccessToken
//	    Authorization: Bearer <federated token>  {"lifetime", "scope"}
//	    200 {"accessToken", "expireTime"}
//
// STS checks every field as Google's does and the subject token with
// Trust (the workload identity pool's provider: audience and subject);
// generateAccessToken checks that the federated token's principal holds
// roles/iam.workloadIdentityUser on the service account (Impersonators).
type GCPSTS struct {
	// Audience is the STS audience the pool answers to.
	Audience string
	// Trust checks the subject token for the pool (see
	// ServiceAccountTrust, keyed by Audience); nil accepts none.
	Trust func(audience, token string) error
	// Impersonators name, per Google service account email, the
	// ServiceAccounts (namespace/name) allowed to impersonate it.
	Impersonators map[string][]string
	// TTL is the lifetime of the tokens; an hour when zero.
	TTL time.Duration

	faults
	server
	issued
	mu         sync.Mutex
	principals map[string]string // federated token -> namespace/name
	// impersonated are the access tokens of generateAccessToken.
	impersonated issued
}

// Start serves the endpoints until Close.
func (g *GCPSTS) Start() error {
	if err := g.listen(http.HandlerFunc(g.serve)); err != nil {
		return err
	}
	go func() { _ = g.srv.Serve(g.ln) }()
	return nil
}

// URL is the base URL of both APIs.
func (g *GCPSTS) URL() string { return "http://" + g.Addr() }

// ValidLogin reports whether user and password are a registry login with
// a federated or impersonated token the server issued that has not
// expired.
func (g *GCPSTS) ValidLogin(user, password string) bool {
	return user == "oauth2accesstoken" && (g.valid(password) || g.impersonated.valid(password))
}

// Impersonations reports how many tokens generateAccessToken issued.
func (g *GCPSTS) Impersonations() int { return g.impersonated.Minted() }

func (g *GCPSTS) ttl() time.Duration {
	if g.TTL == 0 {
		return time.Hour
	}
	return g.TTL
}

// googleError answers Google's JSON error.
func googleError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": code, "error_description": msg})
}

func (g *GCPSTS) serve(w http.ResponseWriter, r *http.Request) {
	if g.fault(w, r, func(s int) { googleError(w, s, "internal_failure", http.StatusText(s)) }) {
		return
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/token":
		g.exchange(w, r)
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/projects/-/serviceAccounts/") &&
		strings.HasSuffix(r.URL.Path, ":generateAccessToken"):
		g.generate(w, r, strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/projects/-/serviceAccounts/"), ":generateAccessToken"))
	default:
		http.NotFound(w, r)
	}
}

func (g *GCPSTS) exchange(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.Header.Get("Content-Type") != "application/x-www-form-urlencoded" {
		googleError(w, http.StatusBadRequest, "invalid_request", "the request must be form-encoded")
		return
	}
	f := r.PostForm
	for k, want := range map[string]string{
		"grant_type":           "urn:ietf:params:oauth:grant-type:token-exchange",
		"requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
		"subject_token_type":   "urn:ietf:params:oauth:token-type:jwt",
	} {
		if f.Get(k) != want {
			googleError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("%s %q, want %q", k, f.Get(k), want))
			return
		}
	}
	if !slices.Contains(strings.Fields(f.Get("scope")), cloudPlatform) {
		googleError(w, http.StatusBadRequest, "invalid_scope", "scope must include "+cloudPlatform)
		return
	}
	if f.Get("audience") != g.Audience {
		googleError(w, http.StatusBadRequest, "invalid_target", fmt.Sprintf("The target service indicated by the \"audience\" parameters is invalid: %q", f.Get("audience")))
		return
	}
	token := f.Get("subject_token")
	if g.Trust == nil {
		googleError(w, http.StatusForbidden, "access_denied", "no provider trusts the subject token")
		return
	}
	if err := g.Trust(g.Audience, token); err != nil {
		googleError(w, http.StatusBadRequest, "invalid_grant", "The claims in the subject token are not trusted: "+err.Error())
		return
	}
	c, _ := ServiceAccountClaims(token)
	principal := strings.Replace(strings.TrimPrefix(c.Subject, "system:serviceaccount:"), ":", "/", 1)
	access := "ya29.fed-" + random(24)
	g.issue(access, time.Now().Add(g.ttl()))
	g.mu.Lock()
	if g.principals == nil {
		g.principals = map[string]string{}
	}
	g.principals[access] = principal
	g.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": access, "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
		"token_type": "Bearer", "expires_in": int(g.ttl().Seconds())})
}

func (g *GCPSTS) generate(w http.ResponseWriter, r *http.Request, email string) {
	email, _ = url.PathUnescape(email)
	bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || !g.valid(bearer) {
		googleError(w, http.StatusUnauthorized, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
		return
	}
	var body struct {
		Lifetime string   `json:"lifetime"`
		Scope    []string `json:"scope"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || !slices.Contains(body.Scope, cloudPlatform) {
		googleError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "scope must include "+cloudPlatform)
		return
	}
	g.mu.Lock()
	principal := g.principals[bearer]
	g.mu.Unlock()
	if !slices.Contains(g.Impersonators[email], principal) {
		googleError(w, http.StatusForbidden, "PERMISSION_DENIED",
			fmt.Sprintf("Permission 'iam.serviceAccounts.getAccessToken' denied on resource (or it may not exist): %s for %s", email, principal))
		return
	}
	access := "ya29.imp-" + random(24)
	expires := time.Now().Add(g.ttl())
	g.impersonated.issue(access, expires)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"accessToken": access, "expireTime": expires.UTC().Format(time.RFC3339)})
}
