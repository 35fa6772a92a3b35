package cloudid

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/headwater-gitops/headwater/testsupport/registry"
	"github.com/headwater-gitops/headwater/testsupport/testca"
)

// acrUser is the user name of an ACR refresh token.
const acrUser = "00000000-0000-0000-0000-000000000000"

// Registry is a cloud registry: an HTTPS front of a real registry that
// lets a request through only with a login Accept approves, or a refresh
// token its own ACR exchange issued, and forwards it with the registry's
// htpasswd credentials.
//
//	POST /oauth2/exchange   ACR: grant_type=access_token, service, access_token -> {"refresh_token"}
//	/v2/...                 the registry, behind Basic authentication
//
// The exchange accepts only an access token ValidAccessToken approves (an
// Entra ID token of a tokenserver.EntraID) and service Service (the
// registry's name, as a client derives it from the registry's host).
type Registry struct {
	// Backend is the registry fronted; it must require Username and
	// Password.
	Backend *registry.Server
	// Accept approves a login (ECR's or GCP's); nil approves none.
	Accept func(user, password string) bool
	// ValidAccessToken approves the Entra ID token of an exchange; nil
	// refuses every exchange.
	ValidAccessToken func(string) bool
	// Service is the registry name the exchange must be asked for.
	Service string
	// TTL is the lifetime of refresh tokens; three hours (ACR's) when
	// zero.
	TTL time.Duration

	faults
	server
	refresh issued
	ca      *testca.Authority
	// refused counts the registry requests refused.
	refused atomic.Int64
}

// Start serves the front over HTTPS until Close.
func (g *Registry) Start() error {
	target, err := url.Parse(g.Backend.Scheme() + "://" + g.Backend.Host)
	if err != nil {
		return err
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	mux := http.NewServeMux()
	mux.HandleFunc("/oauth2/exchange", g.exchange)
	mux.HandleFunc("/v2/", func(w http.ResponseWriter, r *http.Request) {
		user, password, ok := r.BasicAuth()
		if !ok || !(g.refresh.valid(password) && user == acrUser || g.Accept != nil && g.Accept(user, password)) {
			g.refused.Add(1)
			w.Header().Set("WWW-Authenticate", `Basic realm="cloud registry"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":null}]}`)
			return
		}
		r.SetBasicAuth(g.Backend.Options.Username, g.Backend.Options.Password)
		proxy.ServeHTTP(w, r)
	})
	if g.ca, err = testca.New("cloud-registry"); err != nil {
		return err
	}
	if err := g.listen(mux); err != nil {
		return err
	}
	if g.srv.TLSConfig, err = g.ca.ServerConfig("cloud-registry", false); err != nil {
		return err
	}
	go func() { _ = g.srv.ServeTLS(g.ln, "", "") }()
	return nil
}

// Host is the front's host:port, the registry of references.
func (g *Registry) Host() string { return g.Addr() }

// CACert is the PEM certificate of the authority of the front's
// certificate.
func (g *Registry) CACert() []byte { return g.ca.CertPEM }

// RefreshTokensMinted counts the refresh tokens the exchange issued.
func (g *Registry) RefreshTokensMinted() int { return g.refresh.Minted() }

// Refused counts the registry requests refused for want of a login.
func (g *Registry) Refused() int { return int(g.refused.Load()) }

// exchange answers ACR's /oauth2/exchange.
func (g *Registry) exchange(w http.ResponseWriter, r *http.Request) {
	if g.fault(w, r, func(s int) { acrError(w, s, http.StatusText(s)) }) {
		return
	}
	if r.Method != http.MethodPost || r.ParseForm() != nil {
		acrError(w, http.StatusBadRequest, "invalid request")
		return
	}
	f := r.PostForm
	switch {
	case f.Get("grant_type") != "access_token":
		acrError(w, http.StatusBadRequest, "unsupported grant_type")
	case f.Get("service") != g.Service:
		acrError(w, http.StatusBadRequest, fmt.Sprintf("the service '%s' does not match the registry '%s'", f.Get("service"), g.Service))
	case g.ValidAccessToken == nil || !g.ValidAccessToken(f.Get("access_token")):
		acrError(w, http.StatusUnauthorized, "invalid access token: the AAD token is not valid or has expired")
	default:
		ttl := g.TTL
		if ttl == 0 {
			ttl = 3 * time.Hour
		}
		exp := time.Now().Add(ttl)
		token := jwt(map[string]any{"jti": random(8), "sub": "headwater-fetcher", "aud": g.Service, "exp": exp.Unix(),
			"grant_type": "refresh_token", "iss": "Azure Container Registry"})
		g.refresh.issue(token, exp)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"refresh_token": token})
	}
}

// jwt is an unsigned-looking JWT of claims with a random signature: the
// client reads it, the front only compares it with those it issued.
func jwt(claims map[string]any) string {
	enc := base64.RawURLEncoding
	head, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT"})
	body, _ := json.Marshal(claims)
	return strings.Join([]string{enc.EncodeToString(head), enc.EncodeToString(body), enc.EncodeToString([]byte(random(32)))}, ".")
}

// acrError answers as ACR's authentication API does.
func acrError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"code": "UNAUTHORIZED", "message": msg}}})
}
