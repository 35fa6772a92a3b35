package cloudid

import (
	"encoding/xml"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// assume asks STS for credentials with the form a client sends.
func assume(t *testing.T, a *AWS, role, token string) (*http.Response, string) {
	t.Helper()
	form := url.Values{"Action": {"AssumeRoleWithWebIdentity"}, "Version": {"2011-06-15"}, "RoleArn": {role},
		"RoleSessionName": {"test"}, "WebIdentityToken": {token}}
	resp, err := http.PostForm(a.URL()+"/", form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestSTSChecksRoleAndToken(t *testing.T) {
	a := &AWS{RoleARN: RoleARN, WebIdentityToken: ServiceAccountToken, Region: Region}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, tc := range []struct {
		role, token string
		status      int
		code        string
	}{
		{RoleARN, ServiceAccountToken, http.StatusOK, ""},
		{"arn:aws:iam::123456789012:role/other", ServiceAccountToken, http.StatusForbidden, "AccessDenied"},
		{RoleARN, "forged", http.StatusBadRequest, "InvalidIdentityToken"},
	} {
		resp, body := assume(t, a, tc.role, tc.token)
		if resp.StatusCode != tc.status || !strings.Contains(body, tc.code) {
			t.Errorf("role %s token %s: %d %s, want %d %s", tc.role, tc.token, resp.StatusCode, body, tc.status, tc.code)
		}
	}
	if n := a.CredentialsMinted(); n != 1 {
		t.Errorf("credentials issued %d, want 1", n)
	}
}

func TestECRRefusesWhatItCannotVerify(t *testing.T) {
	a := &AWS{RoleARN: RoleARN, WebIdentityToken: ServiceAccountToken, Region: Region}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, body := assume(t, a, RoleARN, ServiceAccountToken)
	var out struct {
		ID      string `xml:"AssumeRoleWithWebIdentityResult>Credentials>AccessKeyId"`
		Session string `xml:"AssumeRoleWithWebIdentityResult>Credentials>SessionToken"`
	}
	if err := xml.Unmarshal([]byte(body), &out); err != nil || out.ID == "" {
		t.Fatalf("STS answer %q: %v", body, err)
	}
	now := time.Now().UTC()
	for _, tc := range []struct {
		name, auth, code string
	}{
		{"unsigned", "", "MissingAuthenticationTokenException"},
		{"unknown key", "AWS4-HMAC-SHA256 Credential=AKIAUNKNOWN/" + now.Format("20060102") + "/" + Region + "/ecr/aws4_request, SignedHeaders=host;x-amz-date, Signature=00",
			"UnrecognizedClientException"},
		{"other region", "AWS4-HMAC-SHA256 Credential=" + out.ID + "/" + now.Format("20060102") + "/us-east-1/ecr/aws4_request, SignedHeaders=host;x-amz-date, Signature=00",
			"InvalidSignatureException"},
		{"wrong signature", "AWS4-HMAC-SHA256 Credential=" + out.ID + "/" + now.Format("20060102") + "/" + Region + "/ecr/aws4_request, SignedHeaders=host;x-amz-date, Signature=00",
			"The request signature we calculated does not match"},
	} {
		req, _ := http.NewRequest(http.MethodPost, a.URL()+"/", strings.NewReader("{}"))
		req.Header.Set("X-Amz-Target", ecrTarget)
		req.Header.Set("X-Amz-Date", now.Format("20060102T150405Z"))
		req.Header.Set("X-Amz-Security-Token", out.Session)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), tc.code) {
			t.Errorf("%s: %d %s, want 403 %s", tc.name, resp.StatusCode, b, tc.code)
		}
	}
	if n := a.LoginsMinted(); n != 0 {
		t.Errorf("ECR issued %d logins to unverified requests", n)
	}
	// CodeCommit's check refuses a password that is not a signature.
	authorize := a.CodeCommit("git-codecommit." + Region + ".amazonaws.com")
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1/v1/repos/repo/info/refs", nil)
	req.SetBasicAuth(out.ID+"%"+out.Session, now.Format("20060102T150405")+"Z"+strings.Repeat("0", 64))
	if authorize(req) {
		t.Error("CodeCommit check let in a forged signature")
	}
}

func TestGCPMetadataNeedsItsHeader(t *testing.T) {
	g := &GCPMetadata{}
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	u := "http://" + g.Host() + "/computeMetadata/v1/instance/service-accounts/default/token?scopes=" + cloudPlatform
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || g.Minted() != 0 {
		t.Errorf("without Metadata-Flavor: %d, %d minted; want 403, none", resp.StatusCode, g.Minted())
	}
}
