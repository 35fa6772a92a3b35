package cloudid

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// cloudPlatform is the scope a registry login needs.
const cloudPlatform = "https://www.googleapis.com/auth/cloud-platform"

// GCPMetadata is a metadata server's token endpoint for the instance's
// default service account, over plain HTTP as on GKE (the fetcher reaches
// it through GCE_METADATA_HOST):
//
//	GET /computeMetadata/v1/instance/service-accounts/default/token?scopes=...
//	    Metadata-Flavor: Google   200 {"access_token", "expires_in", "token_type"}
//
// and the GKE cluster's attributes a workload identity's audience is made
// of (project/project-id, instance/attributes/cluster-location and
// cluster-name: GCPProject, GCPLocation and GCPCluster).
//
// It refuses a request without the Metadata-Flavor header (403, as the
// real server) and one whose scopes lack cloud-platform (400).
type GCPMetadata struct {
	// TTL is the lifetime of the tokens; an hour when zero.
	TTL time.Duration

	faults
	server
	issued
}

// Start serves the endpoint until Close.
func (g *GCPMetadata) Start() error {
	if err := g.listen(http.HandlerFunc(g.serve)); err != nil {
		return err
	}
	go func() { _ = g.srv.Serve(g.ln) }()
	return nil
}

// Host is the server's host:port, as GCE_METADATA_HOST.
func (g *GCPMetadata) Host() string { return g.Addr() }

// ValidLogin reports whether user and password are a registry login with a
// token the server issued that has not expired.
func (g *GCPMetadata) ValidLogin(user, password string) bool {
	return user == "oauth2accesstoken" && g.valid(password)
}

func (g *GCPMetadata) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Metadata-Flavor", "Google")
	if g.fault(w, r, func(s int) { http.Error(w, http.StatusText(s), s) }) {
		return
	}
	if r.Header.Get("Metadata-Flavor") != "Google" {
		http.Error(w, "Missing required header: Metadata-Flavor", http.StatusForbidden)
		return
	}
	if v, ok := map[string]string{
		"/computeMetadata/v1/project/project-id":                   GCPProject,
		"/computeMetadata/v1/instance/attributes/cluster-location": GCPLocation,
		"/computeMetadata/v1/instance/attributes/cluster-name":     GCPCluster,
	}[r.URL.Path]; ok && r.Method == http.MethodGet {
		w.Header().Set("Content-Type", "application/text")
		_, _ = w.Write([]byte(v))
		return
	}
	if r.Method != http.MethodGet || r.URL.Path != "/computeMetadata/v1/instance/service-accounts/default/token" {
		http.NotFound(w, r)
		return
	}
	scopes := strings.Split(r.URL.Query().Get("scopes"), ",")
	ok := false
	for _, s := range scopes {
		ok = ok || s == cloudPlatform
	}
	if !ok {
		http.Error(w, "scopes must include "+cloudPlatform, http.StatusBadRequest)
		return
	}
	ttl := g.TTL
	if ttl == 0 {
		ttl = time.Hour
	}
	token := "ya29." + random(32)
	g.issue(token, time.Now().Add(ttl))
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": token, "expires_in": int(ttl.Seconds()), "token_type": "Bearer"})
}
