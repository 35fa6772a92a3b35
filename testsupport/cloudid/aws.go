package cloudid

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"
)

// ecrTarget is the X-Amz-Target of ECR's GetAuthorizationToken.
const ecrTarget = "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken"

// AWS is STS and ECR for one account, over plain HTTP (the fetcher reaches
// it through AWS_ENDPOINT_URL_STS and AWS_ENDPOINT_URL_ECR):
//
//	POST / Action=AssumeRoleWithWebIdentity   STS: temporary credentials for RoleARN
//	POST / X-Amz-Target: ...GetAuthorizationToken   ECR: "AWS:<password>", signed with them
//
// STS issues credentials only for RoleARN and the web identity token
// WebIdentityToken; ECR answers only a request signed (SigV4, service
// ecr, region Region) with credentials STS issued that have not expired.
// Refusals are AWS's: STS's XML ErrorResponse, ECR's JSON __type.
type AWS struct {
	// RoleARN is the only role that may be assumed.
	RoleARN string
	// WebIdentityToken is the only web identity token accepted, unless
	// Trust is set.
	WebIdentityToken string
	// Trust, when set, decides which web identity tokens are accepted
	// for which role instead of WebIdentityToken and RoleARN (a
	// ServiceAccountTrust, as an IAM role's trust policy does).
	Trust func(role, token string) error
	// Region is ECR's region, as its signatures must name it.
	Region string
	// TTL is the lifetime of credentials and authorization tokens; an
	// hour when zero.
	TTL time.Duration

	faults
	server
	creds        issued // access key ID -> expiry
	logins       issued // ECR passwords
	mu           sync.Mutex
	secrets      map[string]string // access key ID -> secret access key
	sessions     map[string]string // access key ID -> session token
	sessionNames []string
}

// Start serves STS and ECR until Close.
func (a *AWS) Start() error {
	a.secrets, a.sessions = map[string]string{}, map[string]string{}
	if err := a.listen(http.HandlerFunc(a.serve)); err != nil {
		return err
	}
	go func() { _ = a.srv.Serve(a.ln) }()
	return nil
}

// URL is the endpoint of both services.
func (a *AWS) URL() string { return "http://" + a.Addr() }

// ValidLogin reports whether user and password are an ECR login the
// server issued that has not expired.
func (a *AWS) ValidLogin(user, password string) bool {
	return user == "AWS" && a.logins.valid(password)
}

// SessionNames are the role session names STS was asked for, in order.
func (a *AWS) SessionNames() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.sessionNames...)
}

// CredentialsMinted counts the credentials STS issued.
func (a *AWS) CredentialsMinted() int { return a.creds.Minted() }

// LoginsMinted counts the ECR authorization tokens issued.
func (a *AWS) LoginsMinted() int { return a.logins.Minted() }

func (a *AWS) ttl() time.Duration {
	if a.TTL == 0 {
		return time.Hour
	}
	return a.TTL
}

func (a *AWS) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return
	}
	if r.Header.Get("X-Amz-Target") != "" {
		if !a.fault(w, r, func(s int) { ecrError(w, s, "ServerException", http.StatusText(s)) }) {
			a.ecr(w, r, body)
		}
		return
	}
	if !a.fault(w, r, func(s int) { stsError(w, s, "Receiver", "ServiceUnavailable", http.StatusText(s)) }) {
		a.sts(w, r, body)
	}
}

// sts answers AssumeRoleWithWebIdentity.
func (a *AWS) sts(w http.ResponseWriter, r *http.Request, body []byte) {
	f, err := url.ParseQuery(string(body))
	if r.Method != http.MethodPost || err != nil || f.Get("Action") != "AssumeRoleWithWebIdentity" || f.Get("Version") != "2011-06-15" {
		stsError(w, http.StatusBadRequest, "Sender", "InvalidAction", "Could not find operation "+f.Get("Action")+" for version "+f.Get("Version"))
		return
	}
	switch {
	case f.Get("RoleSessionName") == "":
		stsError(w, http.StatusBadRequest, "Sender", "ValidationError", "1 validation error detected: Value null at 'roleSessionName' failed to satisfy constraint: Member must not be null")
		return
	case a.Trust != nil:
		if err := a.Trust(f.Get("RoleArn"), f.Get("WebIdentityToken")); err != nil {
			stsError(w, http.StatusForbidden, "Sender", "AccessDenied", "Not authorized to perform sts:AssumeRoleWithWebIdentity: "+err.Error())
			return
		}
	case f.Get("WebIdentityToken") != a.WebIdentityToken:
		stsError(w, http.StatusBadRequest, "Sender", "InvalidIdentityToken", "Token signature could not be verified, or the token has expired.")
		return
	case f.Get("RoleArn") != a.RoleARN:
		stsError(w, http.StatusForbidden, "Sender", "AccessDenied", "Not authorized to perform sts:AssumeRoleWithWebIdentity")
		return
	}
	id, secret, session := "ASIA"+strings.ToUpper(random(8)), random(20), random(32)
	exp := time.Now().Add(a.ttl()).UTC()
	a.mu.Lock()
	a.secrets[id], a.sessions[id] = secret, session
	a.sessionNames = append(a.sessionNames, f.Get("RoleSessionName"))
	a.mu.Unlock()
	a.creds.issue(id, exp)
	type credentials struct {
		AccessKeyID     string `xml:"AccessKeyId"`
		SecretAccessKey string
		SessionToken    string
		Expiration      string
	}
	var resp struct {
		XMLName     xml.Name    `xml:"https://sts.amazonaws.com/doc/2011-06-15/ AssumeRoleWithWebIdentityResponse"`
		Credentials credentials `xml:"AssumeRoleWithWebIdentityResult>Credentials"`
		Subject     string      `xml:"AssumeRoleWithWebIdentityResult>SubjectFromWebIdentityToken"`
		RequestID   string      `xml:"ResponseMetadata>RequestId"`
	}
	resp.Credentials = credentials{id, secret, session, exp.Format(time.RFC3339)}
	resp.Subject, resp.RequestID = "system:serviceaccount:flux-system:headwater-fetcher", random(8)
	w.Header().Set("Content-Type", "text/xml")
	_ = xml.NewEncoder(w).Encode(resp)
}

// ecr answers GetAuthorizationToken after verifying its signature.
func (a *AWS) ecr(w http.ResponseWriter, r *http.Request, body []byte) {
	if r.Header.Get("X-Amz-Target") != ecrTarget {
		ecrError(w, http.StatusBadRequest, "UnknownOperationException", "")
		return
	}
	id, err := a.verify(r, body)
	if err != nil {
		ecrError(w, http.StatusForbidden, err.code, err.msg)
		return
	}
	if r.Header.Get("X-Amz-Security-Token") != a.session(id) {
		ecrError(w, http.StatusForbidden, "UnrecognizedClientException", "The security token included in the request is invalid.")
		return
	}
	password := random(32)
	exp := time.Now().Add(a.ttl())
	a.logins.issue(password, exp)
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	_ = json.NewEncoder(w).Encode(map[string]any{"authorizationData": []map[string]any{{
		"authorizationToken": base64.StdEncoding.EncodeToString([]byte("AWS:" + password)),
		"expiresAt":          float64(exp.Unix()),
		"proxyEndpoint":      "https://123456789012.dkr.ecr." + a.Region + ".amazonaws.com",
	}}})
}

func (a *AWS) session(id string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sessions[id]
}

// awsError is a refusal in AWS's words.
type awsError struct{ code, msg string }

// verify checks r's Signature Version 4 (RFC-like spec in AWS's docs,
// implemented here independently of the SDK that signs) and returns the
// access key ID it was signed with.
func (a *AWS) verify(r *http.Request, body []byte) (string, *awsError) {
	const algorithm = "AWS4-HMAC-SHA256"
	auth := r.Header.Get("Authorization")
	if !strings.HasPrefix(auth, algorithm+" ") {
		return "", &awsError{"MissingAuthenticationTokenException", "Missing Authentication Token"}
	}
	fields := map[string]string{}
	for _, kv := range strings.Split(strings.TrimPrefix(auth, algorithm+" "), ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		fields[k] = v
	}
	scope := strings.Split(fields["Credential"], "/")
	if len(scope) != 5 || scope[4] != "aws4_request" {
		return "", &awsError{"IncompleteSignatureException", "Authorization header requires a valid Credential."}
	}
	id, date, region, service := scope[0], scope[1], scope[2], scope[3]
	a.mu.Lock()
	secret, known := a.secrets[id]
	a.mu.Unlock()
	switch {
	case !known || !a.creds.valid(id):
		return "", &awsError{"UnrecognizedClientException", "The security token included in the request is invalid."}
	case service != "ecr":
		return "", &awsError{"InvalidSignatureException", "Credential should be scoped to correct service: 'ecr'."}
	case region != a.Region:
		return "", &awsError{"InvalidSignatureException", fmt.Sprintf("Credential should be scoped to a valid region, not '%s'.", region)}
	}
	amzDate := r.Header.Get("X-Amz-Date")
	t, err := time.Parse("20060102T150405Z", amzDate)
	if err != nil || !strings.HasPrefix(amzDate, date) || time.Since(t).Abs() > 5*time.Minute {
		return "", &awsError{"InvalidSignatureException", "Signature expired or X-Amz-Date is invalid."}
	}
	signed := strings.Split(fields["SignedHeaders"], ";")
	if !sort.StringsAreSorted(signed) {
		return "", &awsError{"InvalidSignatureException", "SignedHeaders are not sorted."}
	}
	var canonical bytes.Buffer
	fmt.Fprintf(&canonical, "%s\n%s\n%s\n", r.Method, canonicalPath(r.URL), r.URL.Query().Encode())
	hostSigned := false
	for _, h := range signed {
		var v string
		switch h {
		case "host":
			v, hostSigned = r.Host, true
		case "content-length":
			v = fmt.Sprint(r.ContentLength)
		default:
			v = strings.Join(r.Header.Values(h), ",")
		}
		fmt.Fprintf(&canonical, "%s:%s\n", h, strings.Join(strings.Fields(v), " "))
	}
	if !hostSigned {
		return "", &awsError{"InvalidSignatureException", "'Host' must be a signed header."}
	}
	sum := sha256.Sum256(body)
	fmt.Fprintf(&canonical, "\n%s\n%s", fields["SignedHeaders"], hex.EncodeToString(sum[:]))
	cr := sha256.Sum256(canonical.Bytes())
	toSign := strings.Join([]string{algorithm, amzDate, strings.Join(scope[1:], "/"), hex.EncodeToString(cr[:])}, "\n")
	key := []byte("AWS4" + secret)
	for _, part := range []string{date, region, service, "aws4_request"} {
		key = hmacSHA256(key, part)
	}
	want := hex.EncodeToString(hmacSHA256(key, toSign))
	if !hmac.Equal([]byte(want), []byte(fields["Signature"])) {
		return "", &awsError{"InvalidSignatureException",
			"The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method."}
	}
	return id, nil
}

// canonicalPath is the URI-encoded path of a SigV4 canonical request.
func canonicalPath(u *url.URL) string {
	if p := u.EscapedPath(); p != "" {
		return p
	}
	return "/"
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

// stsError answers as STS does.
func stsError(w http.ResponseWriter, status int, kind, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, `<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>%s</Type><Code>%s</Code><Message>%s</Message></Error><RequestId>%s</RequestId></ErrorResponse>`,
		kind, code, xmlEscape(msg), random(8))
}

// ecrError answers as ECR (JSON 1.1) does.
func ecrError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-ErrorType", code)
	w.Header().Set("X-Amzn-RequestId", random(8))
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": code, "message": msg})
}

func xmlEscape(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// CodeCommit returns an Authorize of a git server (testsupport/gitserver)
// that lets in only AWS CodeCommit's Git credentials: user
// "<access key ID>%<session token>" of credentials STS issued that have
// not expired, and password "<time>Z<signature>", a SigV4 signature
// (service codecommit in Region, method GIT, only the host signed, no
// payload) of the repository's URL on host name (the CodeCommit host the
// server stands for), made less than 15 minutes ago.
func (a *AWS) CodeCommit(name string) func(*http.Request) bool {
	return func(r *http.Request) bool {
		user, password, ok := r.BasicAuth()
		id, session, ok2 := strings.Cut(user, "%")
		if !ok || !ok2 || len(password) < 17 || password[15] != 'Z' {
			return false
		}
		a.mu.Lock()
		secret, known := a.secrets[id]
		want := a.sessions[id]
		a.mu.Unlock()
		if !known || !a.creds.valid(id) || session != want {
			return false
		}
		stamp := password[:15]
		t, err := time.Parse("20060102T150405", stamp)
		if err != nil || time.Since(t) > 15*time.Minute || time.Until(t) > time.Minute {
			return false
		}
		repo := r.URL.EscapedPath()
		for _, suffix := range []string{"/info/refs", "/git-upload-pack", "/git-receive-pack"} {
			repo = strings.TrimSuffix(repo, suffix)
		}
		canonical := "GIT\n" + repo + "\n\nhost:" + name + "\n\nhost\n"
		sum := sha256.Sum256([]byte(canonical))
		date := stamp[:8]
		toSign := strings.Join([]string{"AWS4-HMAC-SHA256", stamp, date + "/" + a.Region + "/codecommit/aws4_request", hex.EncodeToString(sum[:])}, "\n")
		key := []byte("AWS4" + secret)
		for _, part := range []string{date, a.Region, "codecommit", "aws4_request"} {
			key = hmacSHA256(key, part)
		}
		return hmac.Equal([]byte(hex.EncodeToString(hmacSHA256(key, toSign))), []byte(password[16:]))
	}
}
