package providertoken

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// ProviderGitHub names GitHub App tokens in metrics and logs.
const ProviderGitHub = "github"

// Keys of a GitHub App in a Secret, Flux's (fluxcd/pkg/auth/githubapp).
const (
	KeyGitHubAppID                = "githubAppID"
	KeyGitHubAppInstallationID    = "githubAppInstallationID"
	KeyGitHubAppInstallationOwner = "githubAppInstallationOwner"
	KeyGitHubAppPrivateKey        = "githubAppPrivateKey"
	KeyGitHubAppBaseURL           = "githubAppBaseURL"
)

// GitHubAppUsername is the user name an installation token authenticates
// Git over HTTP with; the token is the password.
const GitHubAppUsername = "x-access-token"

// DefaultGitHubAPIURL is the GitHub API a GitHub App's tokens come from
// when the Secret names no githubAppBaseURL.
const DefaultGitHubAPIURL = "https://api.github.com/"

// ErrNoGitHubAppData is returned for a Secret with none of a GitHub App's
// keys.
var ErrNoGitHubAppData = errors.New("secretRef with github app data must be specified when provider is set to github")

// maxResponse bounds what is read of an endpoint's answer.
const maxResponse = 1 << 20

// GitHubApp is a GitHub App installation: what mints its installation
// tokens.
type GitHubApp struct {
	// AppID is the App's ID, the issuer of its JWTs.
	AppID int64
	// InstallationID is the installation tokens are minted for; when it
	// is 0, InstallationOwner's (an organization or a user) is looked up.
	InstallationID    int64
	InstallationOwner string
	// APIURL is the GitHub API, with a trailing slash: DefaultGitHubAPIURL
	// or a GitHub Enterprise Server's (githubAppBaseURL).
	APIURL string

	key *rsa.PrivateKey
	// cacheKey identifies the App, installation, API and key.
	cacheKey string
}

// HasGitHubAppData reports whether a Secret's data holds a GitHub App ID,
// which Flux takes as meaning the source should name provider github.
func HasGitHubAppData(data map[string][]byte) bool {
	return len(data[KeyGitHubAppID]) > 0
}

// GitHubAppFromSecret reads a GitHub App from the data of the Secret ref
// ("namespace/name") with Flux's rules and words: githubAppID and
// githubAppPrivateKey (an RSA key, PEM-encoded PKCS #1 or PKCS #8) are
// required, and exactly one of githubAppInstallationID and
// githubAppInstallationOwner; githubAppBaseURL, optional, is a GitHub
// Enterprise Server's API URL. A Secret with none of these keys gives
// ErrNoGitHubAppData; any other fault a *ConfigError. No message holds
// the key.
func GitHubAppFromSecret(data map[string][]byte, ref string) (*GitHubApp, error) {
	_, hasAppID := data[KeyGitHubAppID]
	_, hasOwner := data[KeyGitHubAppInstallationOwner]
	_, hasInstallationID := data[KeyGitHubAppInstallationID]
	_, hasKey := data[KeyGitHubAppPrivateKey]
	switch {
	case !hasAppID && !hasOwner && !hasInstallationID && !hasKey:
		return nil, ErrNoGitHubAppData
	case !hasAppID:
		return nil, configErrorf("secret '%s': key '%s' not found", ref, KeyGitHubAppID)
	case !hasKey:
		return nil, configErrorf("secret '%s': key '%s' not found", ref, KeyGitHubAppPrivateKey)
	case hasOwner == hasInstallationID:
		return nil, configErrorf("secret '%s' must contain exactly one of '%s' or '%s'",
			ref, KeyGitHubAppInstallationOwner, KeyGitHubAppInstallationID)
	}
	app := &GitHubApp{InstallationOwner: string(data[KeyGitHubAppInstallationOwner]), APIURL: DefaultGitHubAPIURL}
	var err error
	if app.AppID, err = positive(data[KeyGitHubAppID]); err != nil {
		return nil, configErrorf("app ID must be provided to use github app authentication: %s '%s' %w", KeyGitHubAppID, data[KeyGitHubAppID], err)
	}
	if hasInstallationID {
		if app.InstallationID, err = positive(data[KeyGitHubAppInstallationID]); err != nil {
			return nil, configErrorf("app installation owner or ID must be provided to use github app authentication: %s '%s' %w",
				KeyGitHubAppInstallationID, data[KeyGitHubAppInstallationID], err)
		}
	} else if app.InstallationOwner == "" {
		return nil, configErrorf("app installation owner or ID must be provided to use github app authentication")
	}
	pemKey := data[KeyGitHubAppPrivateKey]
	if len(pemKey) == 0 {
		return nil, configErrorf("private key must be provided to use github app authentication")
	}
	if app.key, err = parseRSAPrivateKey(pemKey); err != nil {
		return nil, configErrorf("could not parse private key: %w", err)
	}
	if raw, ok := data[KeyGitHubAppBaseURL]; ok {
		if app.APIURL, err = apiURL(string(raw)); err != nil {
			return nil, configErrorf("invalid API URL: %w", err)
		}
	}
	app.cacheKey = Key(ProviderGitHub, strconv.FormatInt(app.AppID, 10), app.InstallationOwner,
		strconv.FormatInt(app.InstallationID, 10), app.APIURL, string(pemKey))
	return app, nil
}

// positive parses a decimal ID greater than zero.
func positive(b []byte) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n <= 0 {
		return 0, errors.New("is not a positive integer")
	}
	return n, nil
}

// parseRSAPrivateKey decodes a PEM-encoded PKCS #1 or PKCS #8 RSA private
// key, with the words of the JWT library Flux uses.
func parseRSAPrivateKey(b []byte) (*rsa.PrivateKey, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("invalid key: Key must be a PEM encoded PKCS1 or PKCS8 key")
	}
	if key, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return key, nil
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	key, ok := parsed.(*rsa.PrivateKey)
	if !ok {
		return nil, errors.New("key is not a valid RSA private key")
	}
	return key, nil
}

// apiURL checks a githubAppBaseURL and gives it a trailing slash. Flux's
// client sends requests to it as given, whatever its path.
func apiURL(raw string) (string, error) {
	if !strings.HasSuffix(raw, "/") {
		raw += "/"
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("failed to parse '%s'", redact(raw))
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("'%s' is not an http or https URL", redact(raw))
	}
	if u.User != nil || u.RawQuery != "" {
		return "", fmt.Errorf("'%s' must have no user-info or query", redact(raw))
	}
	return u.String(), nil
}

// redact cuts what may be a credential out of a URL-like string.
func redact(raw string) string {
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		raw = raw[:i]
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	host, path, _ := strings.Cut(rest, "/")
	if i := strings.LastIndex(host, "@"); i >= 0 {
		host = host[i+1:]
	}
	return scheme + "://" + host + "/" + path
}

// Token returns an installation token, from cache when one is reusable,
// else minted through client.
func (a *GitHubApp) Token(ctx context.Context, client *http.Client, cache *Cache) (Token, error) {
	return cache.Get(ctx, ProviderGitHub, a.cacheKey, func(ctx context.Context) (Token, error) {
		return a.mint(ctx, client)
	})
}

// mint signs a JWT, looks the installation up if only its owner is known,
// and asks for an installation token.
// Ref: https://docs.github.com/en/apps/creating-github-apps/authenticating-with-a-github-app/authenticating-as-a-github-app-installation
func (a *GitHubApp) mint(ctx context.Context, client *http.Client) (Token, error) {
	jwt, err := a.jwt(time.Now())
	if err != nil {
		return Token{}, err
	}
	id := a.InstallationID
	if id == 0 {
		if id, err = a.findInstallation(ctx, client, jwt); err != nil {
			return Token{}, err
		}
	}
	var body struct {
		Token     string    `json:"token"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := a.call(ctx, client, jwt, http.MethodPost, fmt.Sprintf("app/installations/%d/access_tokens", id), &body); err != nil {
		return Token{}, err
	}
	if body.Token == "" {
		return Token{}, fmt.Errorf("POST %sapp/installations/%d/access_tokens: the answer holds no token", a.APIURL, id)
	}
	return Token{Value: body.Token, ExpiresAt: body.ExpiresAt}, nil
}

// findInstallation looks up the installation of InstallationOwner, as an
// organization, then as a user.
func (a *GitHubApp) findInstallation(ctx context.Context, client *http.Client, jwt string) (int64, error) {
	var body struct {
		ID int64 `json:"id"`
	}
	owner := url.PathEscape(a.InstallationOwner)
	orgErr := a.call(ctx, client, jwt, http.MethodGet, "orgs/"+owner+"/installation", &body)
	if orgErr == nil && body.ID > 0 {
		return body.ID, nil
	}
	userErr := a.call(ctx, client, jwt, http.MethodGet, "users/"+owner+"/installation", &body)
	if userErr == nil && body.ID > 0 {
		return body.ID, nil
	}
	if orgErr == nil {
		orgErr = errors.New("the answer holds no installation ID")
	}
	if userErr == nil {
		userErr = errors.New("the answer holds no installation ID")
	}
	return 0, errors.Join(fmt.Errorf("failed to find organization installation: %w", orgErr),
		fmt.Errorf("failed to find user installation: %w", userErr))
}

// call sends a request authenticated with jwt to the API path and decodes
// a 2xx answer into out. Another answer is a *ResponseError worded as
// go-github (Flux's client) words it.
func (a *GitHubApp) call(ctx context.Context, client *http.Client, jwt, method, path string, out any) error {
	u := a.APIURL + path
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", "2022-11-28")
	req.Header.Set("Authorization", "Bearer "+jwt)
	req.Header.Set("User-Agent", "headwater")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, u, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		re := &ResponseError{Method: method, URL: u, StatusCode: resp.StatusCode, Message: http.StatusText(resp.StatusCode),
			format: func(e *ResponseError) string {
				return fmt.Sprintf("%s %s: %d %s []", e.Method, e.URL, e.StatusCode, e.Message)
			}}
		var gh struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &gh) == nil && gh.Message != "" {
			re.Message = gh.Message
		}
		return re
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: decoding the answer: %w", method, u, err)
	}
	return nil
}

// jwt is the App's JSON Web Token as GitHub requires it: RS256, issued by
// the App ID, with whole-second times, backdated 30 seconds for clock
// drift and valid for 2 minutes (the token only buys an installation
// token), as Flux makes it.
func (a *GitHubApp) jwt(now time.Time) (string, error) {
	iat := now.Truncate(time.Second).Add(-30 * time.Second)
	header, err := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT"})
	if err != nil {
		return "", err
	}
	claims, err := json.Marshal(struct {
		Issuer    string `json:"iss"`
		ExpiresAt int64  `json:"exp"`
		IssuedAt  int64  `json:"iat"`
	}{strconv.FormatInt(a.AppID, 10), iat.Add(2 * time.Minute).Unix(), iat.Unix()})
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	enc := base64.RawURLEncoding
	b.WriteString(enc.EncodeToString(header))
	b.WriteByte('.')
	b.WriteString(enc.EncodeToString(claims))
	digest := sha256.Sum256(b.Bytes())
	sig, err := rsa.SignPKCS1v15(nil, a.key, crypto.SHA256, digest[:])
	if err != nil {
		return "", fmt.Errorf("signing the GitHub App JWT: %w", err)
	}
	b.WriteByte('.')
	b.WriteString(enc.EncodeToString(sig))
	return b.String(), nil
}
