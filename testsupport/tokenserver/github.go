package tokenserver

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// GitHubApp is the GitHub API of one GitHub App installed once: it mints
// installation tokens for a JWT signed with the App's private key.
//
//	POST {prefix}/app/installations/{id}/access_tokens   201 {"token", "expires_at"}
//	GET  {prefix}/orgs/{owner}/installation              200 {"id"}
//	GET  {prefix}/users/{owner}/installation             404 (the owner is an organization)
//
// Each request must carry "Authorization: Bearer <JWT>": alg RS256, a
// signature the App's public key verifies, iss the App ID, iat not in the
// future (30 s allowed for drift), exp in the future and at most ten
// minutes after iat, as GitHub checks. Refusals are GitHub's: 401 with "A
// JSON web token could not be decoded" (or the claim at fault), 404 "Not
// Found" for another installation or owner.
type GitHubApp struct {
	// AppID is the App's ID; PublicKey verifies its JWTs.
	AppID     int64
	PublicKey *rsa.PublicKey
	// InstallationID is the installation's ID, Owner the organization it
	// is installed on.
	InstallationID int64
	Owner          string
	// Prefix is the API's path ("/api/v3" as on GitHub Enterprise Server),
	// "" for the root.
	Prefix string
	// TTL is the lifetime of the tokens minted; an hour (GitHub's) when
	// zero.
	TTL time.Duration
	// TLS serves HTTPS with a certificate authority of its own (CACert).
	TLS bool

	issued
	server

	mu sync.Mutex
	// status, when set, answers every request with it.
	status int
	// requests counts the token requests answered, refused or not.
	requests int
}

// Start serves the API on addr ("127.0.0.1:0" picks a free port) until
// Stop.
func (g *GitHubApp) Start(addr string) error {
	return g.start(addr, http.HandlerFunc(g.serve), g.TLS)
}

// APIURL is the App's API URL, a Secret's githubAppBaseURL.
func (g *GitHubApp) APIURL() string { return g.URL() + g.Prefix }

// CACert is the PEM certificate of the authority of a TLS server.
func (g *GitHubApp) CACert() []byte { return g.ca.CertPEM }

// FailWith makes every request answer status (with GitHub's message for
// it) until called with 0.
func (g *GitHubApp) FailWith(status int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.status = status
}

// Requests reports how many token requests the server answered, refused
// or not.
func (g *GitHubApp) Requests() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.requests
}

func (g *GitHubApp) serve(w http.ResponseWriter, r *http.Request) {
	path, ok := strings.CutPrefix(r.URL.Path, g.Prefix+"/")
	if !ok {
		gitHubError(w, http.StatusNotFound, "Not Found")
		return
	}
	g.mu.Lock()
	status := g.status
	if strings.HasSuffix(path, "/access_tokens") {
		g.requests++
	}
	g.mu.Unlock()
	if status != 0 {
		gitHubError(w, status, http.StatusText(status))
		return
	}
	if err := g.verify(r.Header.Get("Authorization")); err != nil {
		gitHubError(w, http.StatusUnauthorized, err.Error())
		return
	}
	switch {
	case r.Method == http.MethodPost && path == fmt.Sprintf("app/installations/%d/access_tokens", g.InstallationID):
		ttl := g.TTL
		if ttl == 0 {
			ttl = time.Hour
		}
		token, expires := g.issue(ttl)
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"token": token, "expires_at": expires.UTC().Format(time.RFC3339),
			"permissions": map[string]string{"contents": "read"}, "repository_selection": "all"})
	case r.Method == http.MethodGet && g.Owner != "" && path == "orgs/"+g.Owner+"/installation":
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": g.InstallationID, "app_id": g.AppID,
			"account": map[string]string{"login": g.Owner, "type": "Organization"}})
	default:
		gitHubError(w, http.StatusNotFound, "Not Found")
	}
}

// gitHubError answers as the GitHub API does.
func gitHubError(w http.ResponseWriter, status int, message string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"message": message, "documentation_url": "https://docs.github.com/rest", "status": strconv.Itoa(status)})
}

// verify checks an "Authorization: Bearer <JWT>" header as GitHub does.
func (g *GitHubApp) verify(header string) error {
	const undecodable = "A JSON web token could not be decoded"
	jwt, ok := strings.CutPrefix(header, "Bearer ")
	if !ok {
		return errors.New("Requires authentication")
	}
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return errors.New(undecodable)
	}
	enc := base64.RawURLEncoding
	var head struct {
		Alg string `json:"alg"`
	}
	var claims struct {
		Iss json.RawMessage `json:"iss"`
		Iat int64           `json:"iat"`
		Exp int64           `json:"exp"`
	}
	hb, err1 := enc.DecodeString(parts[0])
	cb, err2 := enc.DecodeString(parts[1])
	sig, err3 := enc.DecodeString(parts[2])
	if err := errors.Join(err1, err2, err3); err != nil || json.Unmarshal(hb, &head) != nil || json.Unmarshal(cb, &claims) != nil {
		return errors.New(undecodable)
	}
	if head.Alg != "RS256" {
		return errors.New(undecodable)
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if rsa.VerifyPKCS1v15(g.PublicKey, crypto.SHA256, digest[:], sig) != nil {
		return errors.New(undecodable)
	}
	// GitHub takes iss as a number or a string.
	if iss := strings.Trim(string(claims.Iss), `"`); iss != strconv.FormatInt(g.AppID, 10) {
		return errors.New("'Issuer' claim ('iss') must be an Integer")
	}
	now := time.Now().Unix()
	switch {
	case claims.Iat == 0 || claims.Iat > now+30:
		return errors.New("'Issued at' claim ('iat') must be an Integer representing a time in the past")
	case claims.Exp <= now:
		return errors.New("'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires")
	case claims.Exp-claims.Iat > 600:
		return errors.New("'Expiration time' claim ('exp') is too far in the future")
	}
	return nil
}
