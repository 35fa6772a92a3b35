package providertoken

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/testsupport/tokenserver"
)

// newRSAKey returns a 2048-bit key and its PKCS #1 and PKCS #8 PEMs.
func newRSAKey(t *testing.T) (*rsa.PrivateKey, string, string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return key, string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})),
		string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}))
}

func appData(kv ...string) map[string][]byte {
	m := map[string][]byte{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = []byte(kv[i+1])
	}
	return m
}

func TestGitHubAppFromSecret(t *testing.T) {
	_, pkcs1, pkcs8 := newRSAKey(t)
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecDER, _ := x509.MarshalPKCS8PrivateKey(ec)
	ecPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: ecDER}))
	cases := []struct {
		name    string
		data    map[string][]byte
		want    string // error message, "" for none
		noData  bool
		apiURL  string
		install int64
	}{
		{name: "PKCS #1 key", data: appData(KeyGitHubAppID, "1", KeyGitHubAppInstallationID, "2", KeyGitHubAppPrivateKey, pkcs1),
			apiURL: DefaultGitHubAPIURL, install: 2},
		{name: "PKCS #8 key and Enterprise URL", data: appData(KeyGitHubAppID, "1", KeyGitHubAppInstallationOwner, "acme",
			KeyGitHubAppPrivateKey, pkcs8, KeyGitHubAppBaseURL, "https://ghe.example.com/api/v3"), apiURL: "https://ghe.example.com/api/v3/"},
		{name: "no app data", data: appData("username", "u"), noData: true,
			want: "secretRef with github app data must be specified when provider is set to github"},
		{name: "no app ID", data: appData(KeyGitHubAppInstallationID, "2", KeyGitHubAppPrivateKey, pkcs1),
			want: "secret 'ns/app': key 'githubAppID' not found"},
		{name: "no private key", data: appData(KeyGitHubAppID, "1", KeyGitHubAppInstallationID, "2"),
			want: "secret 'ns/app': key 'githubAppPrivateKey' not found"},
		{name: "no installation", data: appData(KeyGitHubAppID, "1", KeyGitHubAppPrivateKey, pkcs1),
			want: "secret 'ns/app' must contain exactly one of 'githubAppInstallationOwner' or 'githubAppInstallationID'"},
		{name: "both installation keys", data: appData(KeyGitHubAppID, "1", KeyGitHubAppInstallationID, "2",
			KeyGitHubAppInstallationOwner, "acme", KeyGitHubAppPrivateKey, pkcs1),
			want: "secret 'ns/app' must contain exactly one of 'githubAppInstallationOwner' or 'githubAppInstallationID'"},
		{name: "app ID not a number", data: appData(KeyGitHubAppID, "one", KeyGitHubAppInstallationID, "2", KeyGitHubAppPrivateKey, pkcs1),
			want: "app ID must be provided to use github app authentication: githubAppID 'one' is not a positive integer"},
		{name: "installation ID not a number", data: appData(KeyGitHubAppID, "1", KeyGitHubAppInstallationID, "-2", KeyGitHubAppPrivateKey, pkcs1),
			want: "app installation owner or ID must be provided to use github app authentication: githubAppInstallationID '-2' is not a positive integer"},
		{name: "empty private key", data: appData(KeyGitHubAppID, "1", KeyGitHubAppInstallationID, "2", KeyGitHubAppPrivateKey, ""),
			want: "private key must be provided to use github app authentication"},
		{name: "private key not PEM", data: appData(KeyGitHubAppID, "1", KeyGitHubAppInstallationID, "2", KeyGitHubAppPrivateKey, "s3cr3t"),
			want: "could not parse private key: invalid key: Key must be a PEM encoded PKCS1 or PKCS8 key"},
		{name: "private key not RSA", data: appData(KeyGitHubAppID, "1", KeyGitHubAppInstallationID, "2", KeyGitHubAppPrivateKey, ecPEM),
			want: "could not parse private key: key is not a valid RSA private key"},
		{name: "base URL not http", data: appData(KeyGitHubAppID, "1", KeyGitHubAppInstallationID, "2", KeyGitHubAppPrivateKey, pkcs1,
			KeyGitHubAppBaseURL, "ftp://ghe.example.com"), want: "invalid API URL: 'ftp://ghe.example.com/' is not an http or https URL"},
		{name: "base URL with credentials", data: appData(KeyGitHubAppID, "1", KeyGitHubAppInstallationID, "2", KeyGitHubAppPrivateKey, pkcs1,
			KeyGitHubAppBaseURL, "https://u:s3cr3t@ghe.example.com"), want: "invalid API URL: 'https://ghe.example.com/' must have no user-info or query"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			app, err := GitHubAppFromSecret(tc.data, "ns/app")
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if app.APIURL != tc.apiURL || app.InstallationID != tc.install || app.AppID != 1 {
					t.Errorf("app %+v, want API %s, installation %d", app, tc.apiURL, tc.install)
				}
				return
			}
			if err == nil || err.Error() != tc.want {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			var cfg *ConfigError
			if errors.Is(err, ErrNoGitHubAppData) != tc.noData || errors.As(err, &cfg) == tc.noData {
				t.Errorf("error %T: no app data %v, want %v; a *ConfigError otherwise", err, errors.Is(err, ErrNoGitHubAppData), tc.noData)
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("error leaks a secret: %v", err)
			}
		})
	}
}

// startGitHub starts the GitHub API of an App with key.
func startGitHub(t *testing.T, key *rsa.PrivateKey, mutate func(*tokenserver.GitHubApp)) *tokenserver.GitHubApp {
	t.Helper()
	srv := &tokenserver.GitHubApp{AppID: 4242, PublicKey: &key.PublicKey, InstallationID: 77, Owner: "acme", Prefix: "/api/v3"}
	if mutate != nil {
		mutate(srv)
	}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return srv
}

func TestGitHubAppMintsInstallationTokens(t *testing.T) {
	key, pkcs1, _ := newRSAKey(t)
	srv := startGitHub(t, key, nil)
	ctx := context.Background()
	for _, installation := range [][]string{{KeyGitHubAppInstallationID, "77"}, {KeyGitHubAppInstallationOwner, "acme"}} {
		app, err := GitHubAppFromSecret(appData(KeyGitHubAppID, "4242", installation[0], installation[1],
			KeyGitHubAppPrivateKey, pkcs1, KeyGitHubAppBaseURL, srv.APIURL()), "ns/app")
		if err != nil {
			t.Fatal(err)
		}
		tok, err := app.Token(ctx, http.DefaultClient, nil)
		if err != nil {
			t.Fatalf("%s: %v", installation[0], err)
		}
		if !srv.Valid(tok.Value) {
			t.Errorf("%s: token %q is not one the server issued", installation[0], tok.Value)
		}
		if d := time.Until(tok.ExpiresAt); d < 58*time.Minute || d > time.Hour+time.Second {
			t.Errorf("%s: token expires in %s, want the server's hour", installation[0], d)
		}
	}
}

func TestGitHubAppJWT(t *testing.T) {
	_, pkcs1, _ := newRSAKey(t)
	app, err := GitHubAppFromSecret(appData(KeyGitHubAppID, "4242", KeyGitHubAppInstallationID, "77", KeyGitHubAppPrivateKey, pkcs1), "ns/app")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 500_000_000, time.UTC)
	jwt, err := app.jwt(now)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		t.Fatalf("JWT %q has %d parts", jwt, len(parts))
	}
	claims := decodeSegment(t, parts[1])
	iat := now.Truncate(time.Second).Add(-30 * time.Second).Unix()
	if claims["iss"] != "4242" || claims["iat"] != float64(iat) || claims["exp"] != float64(iat+120) {
		t.Errorf("claims %v, want iss 4242, iat %d, exp %d", claims, iat, iat+120)
	}
	if h := decodeSegment(t, parts[0]); h["alg"] != "RS256" || h["typ"] != "JWT" {
		t.Errorf("header %v, want RS256 JWT", h)
	}
}

func TestGitHubAppRefusals(t *testing.T) {
	key, pkcs1, _ := newRSAKey(t)
	_, otherKey, _ := newRSAKey(t)
	srv := startGitHub(t, key, nil)
	ctx := context.Background()
	mint := func(t *testing.T, data map[string][]byte) error {
		t.Helper()
		app, err := GitHubAppFromSecret(data, "ns/app")
		if err != nil {
			t.Fatal(err)
		}
		_, err = app.Token(ctx, http.DefaultClient, nil)
		return err
	}
	base := func(kv ...string) map[string][]byte {
		d := appData(KeyGitHubAppID, "4242", KeyGitHubAppInstallationID, "77", KeyGitHubAppPrivateKey, pkcs1, KeyGitHubAppBaseURL, srv.APIURL())
		for k, v := range appData(kv...) {
			d[k] = v
		}
		return d
	}
	tokens := srv.APIURL() + "/app/installations/77/access_tokens"
	cases := []struct {
		name    string
		data    map[string][]byte
		status  int
		want    string
		refused bool
	}{
		{name: "another key", data: base(KeyGitHubAppPrivateKey, otherKey), refused: true,
			want: "POST " + tokens + ": 401 A JSON web token could not be decoded []"},
		{name: "another app", data: base(KeyGitHubAppID, "1"), refused: true,
			want: "POST " + tokens + ": 401 'Issuer' claim ('iss') must be an Integer []"},
		{name: "another installation", data: base(KeyGitHubAppInstallationID, "78"), refused: true,
			want: "POST " + srv.APIURL() + "/app/installations/78/access_tokens: 404 Not Found []"},
		{name: "unknown owner", data: appData(KeyGitHubAppID, "4242", KeyGitHubAppInstallationOwner, "nobody", KeyGitHubAppPrivateKey, pkcs1,
			KeyGitHubAppBaseURL, srv.APIURL()), refused: true,
			want: "failed to find organization installation: GET " + srv.APIURL() + "/orgs/nobody/installation: 404 Not Found []\n" +
				"failed to find user installation: GET " + srv.APIURL() + "/users/nobody/installation: 404 Not Found []"},
		{name: "server error", data: base(), status: http.StatusInternalServerError,
			want: "POST " + tokens + ": 500 Internal Server Error []"},
		{name: "rate limited", data: base(), status: http.StatusTooManyRequests,
			want: "POST " + tokens + ": 429 Too Many Requests []"},
		{name: "unreachable", data: base(KeyGitHubAppBaseURL, "http://127.0.0.1:1/api/v3"),
			want: `Post "http://127.0.0.1:1/api/v3/app/installations/77/access_tokens": dial tcp 127.0.0.1:1: connect: connection refused`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv.FailWith(tc.status)
			defer srv.FailWith(0)
			err := mint(t, tc.data)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if Refused(err) != tc.refused {
				t.Errorf("Refused = %v, want %v", Refused(err), tc.refused)
			}
		})
	}
}

func TestGitHubAppOverTLS(t *testing.T) {
	key, pkcs1, _ := newRSAKey(t)
	srv := startGitHub(t, key, func(g *tokenserver.GitHubApp) { g.TLS = true; g.Prefix = "" })
	app, err := GitHubAppFromSecret(appData(KeyGitHubAppID, "4242", KeyGitHubAppInstallationID, "77", KeyGitHubAppPrivateKey, pkcs1,
		KeyGitHubAppBaseURL, srv.APIURL()), "ns/app")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app.Token(context.Background(), http.DefaultClient, nil); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("without the server's CA: %v, want an unknown authority", err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(srv.CACert())
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	tok, err := app.Token(context.Background(), client, nil)
	if err != nil || !srv.Valid(tok.Value) {
		t.Errorf("with the server's CA: %q, %v; want a token the server issued", tok.Value, err)
	}
	if srv.Requests() != 1 {
		t.Errorf("token requests %d, want 1 (the refused handshake reaches no endpoint)", srv.Requests())
	}
}
