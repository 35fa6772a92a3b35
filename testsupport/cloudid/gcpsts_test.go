package cloudid

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// saToken is an unsigned JWT with the claims of a ServiceAccount token.
func saToken(t *testing.T, sub, aud string) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"sub": sub, "aud": []string{aud}, "exp": time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	return "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(b) + ".sig"
}

// TestGCPSTSChecksTheExchange: STS answers only the form Google's
// externalaccount client sends, for its audience, with a subject token
// the pool trusts; generateAccessToken only for a federated token whose
// principal may impersonate the service account.
func TestGCPSTSChecksTheExchange(t *testing.T) {
	g := &GCPSTS{Audience: GCPAudience, Trust: PoolTrust(GCPPool, "default/a", "default/b"),
		Impersonators: map[string][]string{GCPServiceAccount: {"default/a"}}}
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	form := func(edit func(url.Values)) url.Values {
		f := url.Values{"grant_type": {"urn:ietf:params:oauth:grant-type:token-exchange"}, "audience": {GCPAudience},
			"scope":                {cloudPlatform},
			"requested_token_type": {"urn:ietf:params:oauth:token-type:access_token"},
			"subject_token_type":   {"urn:ietf:params:oauth:token-type:jwt"},
			"subject_token":        {saToken(t, "system:serviceaccount:default:a", GCPPool)}}
		if edit != nil {
			edit(f)
		}
		return f
	}
	exchange := func(f url.Values) (int, string) {
		resp, err := http.PostForm(g.URL()+"/v1/token", f)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			AccessToken string `json:"access_token"`
			Error       string `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body.AccessToken + body.Error
	}
	for name, tc := range map[string]struct {
		edit   func(url.Values)
		status int
		got    string
	}{
		"wrong grant type":   {func(f url.Values) { f.Set("grant_type", "client_credentials") }, 400, "invalid_request"},
		"wrong subject type": {func(f url.Values) { f.Set("subject_token_type", "urn:ietf:params:oauth:token-type:id_token") }, 400, "invalid_request"},
		"wrong STS audience": {func(f url.Values) { f.Set("audience", "//iam.googleapis.com/projects/1/x") }, 400, "invalid_target"},
		"no cloud-platform":  {func(f url.Values) { f.Set("scope", "openid") }, 400, "invalid_scope"},
		"token for another audience": {func(f url.Values) {
			f.Set("subject_token", saToken(t, "system:serviceaccount:default:a", "sts.amazonaws.com"))
		}, 400, "invalid_grant"},
		"untrusted subject": {func(f url.Values) {
			f.Set("subject_token", saToken(t, "system:serviceaccount:default:c", GCPPool))
		}, 400, "invalid_grant"},
	} {
		if status, got := exchange(form(tc.edit)); status != tc.status || got != tc.got {
			t.Errorf("%s: %d %q, want %d %q", name, status, got, tc.status, tc.got)
		}
	}
	generate := func(bearer string) int {
		req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/v1/projects/-/serviceAccounts/%s:generateAccessToken", g.URL(), GCPServiceAccount),
			strings.NewReader(`{"lifetime":"3600s","scope":["`+cloudPlatform+`"]}`))
		req.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	status, a := exchange(form(nil))
	if status != http.StatusOK || !g.ValidLogin("oauth2accesstoken", a) {
		t.Fatalf("exchange of default/a: %d %q", status, a)
	}
	_, b := exchange(form(func(f url.Values) { f.Set("subject_token", saToken(t, "system:serviceaccount:default:b", GCPPool)) }))
	for name, tc := range map[string]struct {
		bearer string
		status int
	}{"impersonator": {a, 200}, "not an impersonator": {b, 403}, "not a federated token": {"ya29.forged", 401}} {
		if got := generate(tc.bearer); got != tc.status {
			t.Errorf("generateAccessToken, %s: %d, want %d", name, got, tc.status)
		}
	}
	if g.Impersonations() != 1 {
		t.Errorf("impersonations: %d, want 1", g.Impersonations())
	}
}
