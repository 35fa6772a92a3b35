package tokenserver

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/xml"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/headwater-gitops/headwater/testsupport/testca"
)

// AWSSTS is AWS Security Token Service's AssumeRoleWithWebIdentity, the
// exchange of IAM Roles for Service Accounts (a pod's projected service
// account token for a role's temporary credentials), over HTTPS with a
// certificate for AWS's STS host names:
//
//	POST /  Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=...&RoleSessionName=...&WebIdentityToken=...
//
// It accepts exactly RoleARN with Token, and answers with the credentials
// Mint makes (real ones of the object store under test), in STS's XML.
// Refusals are STS's: 403 AccessDenied for another role, 400
// InvalidIdentityToken for another token, 400 for a malformed request.
type AWSSTS struct {
	// RoleARN is the only role that may be assumed.
	RoleARN string
	// Token is the only web identity token accepted, unless Trust is set.
	Token string
	// Trust, when set, decides which web identity tokens are accepted
	// for which role instead of Token and RoleARN (cloudid's
	// ServiceAccountTrust checks a ServiceAccount token's subject and
	// audience, as an IAM role's trust policy does).
	Trust func(role, token string) error
	// Mint makes the temporary credentials returned.
	Mint func() (accessKey, secretKey, sessionToken string, expires time.Time, err error)

	srv  *http.Server
	addr string
	ca   *testca.Authority

	mu       sync.Mutex
	status   int
	sessions []string
}

// Start serves on addr ("127.0.0.1:0" picks a free port) until Stop, with
// a certificate for hosts (e.g. "sts.us-east-1.amazonaws.com").
func (s *AWSSTS) Start(addr string, hosts ...string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("token server: %w", err)
	}
	if s.ca, err = testca.New("aws-sts"); err != nil {
		_ = ln.Close()
		return err
	}
	leaf, err := s.ca.Issue(x509.ExtKeyUsageServerAuth, "sts", func(c *x509.Certificate) { c.DNSNames = hosts })
	if err != nil {
		_ = ln.Close()
		return err
	}
	s.addr = ln.Addr().String()
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	s.srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{leaf.Pair}, MinVersion: tls.VersionTLS12}
	go func() { _ = s.srv.ServeTLS(ln, "", "") }()
	return nil
}

// Addr is host:port the server listens on.
func (s *AWSSTS) Addr() string { return s.addr }

// CAPool holds the authority of the server's certificate.
func (s *AWSSTS) CAPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(s.ca.Cert)
	return p
}

// CACertPEM is the PEM certificate of the server's authority.
func (s *AWSSTS) CACertPEM() []byte { return s.ca.CertPEM }

// Stop stops serving.
func (s *AWSSTS) Stop() error {
	if s.srv == nil {
		return nil
	}
	return s.srv.Close()
}

// FailWith makes every request answer status (STS's ServiceUnavailable)
// until called with 0.
func (s *AWSSTS) FailWith(status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = status
}

// Sessions are the role session names of the credentials issued.
func (s *AWSSTS) Sessions() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.sessions...)
}

func (s *AWSSTS) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	status := s.status
	s.mu.Unlock()
	if status != 0 {
		stsError(w, status, "Receiver", "ServiceUnavailable", "Service is unable to handle request.")
		return
	}
	if r.Method != http.MethodPost || r.ParseForm() != nil {
		stsError(w, http.StatusBadRequest, "Sender", "InvalidAction", "Could not find operation for the request.")
		return
	}
	f := r.PostForm
	switch {
	case f.Get("Action") != "AssumeRoleWithWebIdentity" || f.Get("Version") != "2011-06-15":
		stsError(w, http.StatusBadRequest, "Sender", "InvalidAction", fmt.Sprintf("Could not find operation %s for version %s.", f.Get("Action"), f.Get("Version")))
	case f.Get("RoleSessionName") == "":
		stsError(w, http.StatusBadRequest, "Sender", "ValidationError", "1 validation error detected: Value null at 'roleSessionName' failed to satisfy constraint: Member must not be null")
	case s.Trust != nil && s.Trust(f.Get("RoleArn"), f.Get("WebIdentityToken")) != nil:
		stsError(w, http.StatusForbidden, "Sender", "AccessDenied", "Not authorized to perform sts:AssumeRoleWithWebIdentity: "+
			s.Trust(f.Get("RoleArn"), f.Get("WebIdentityToken")).Error())
	case s.Trust != nil:
		s.issue(w, f.Get("RoleSessionName"))
	case f.Get("WebIdentityToken") != s.Token:
		stsError(w, http.StatusBadRequest, "Sender", "InvalidIdentityToken", "Couldn't retrieve verification key from your identity provider,  please reference AssumeRoleWithWebIdentity documentation for requirements")
	case f.Get("RoleArn") != s.RoleARN:
		stsError(w, http.StatusForbidden, "Sender", "AccessDenied", "Not authorized to perform sts:AssumeRoleWithWebIdentity")
	default:
		s.issue(w, f.Get("RoleSessionName"))
	}
}

// issue answers with credentials Mint makes for the role session name.
func (s *AWSSTS) issue(w http.ResponseWriter, name string) {
	{
		access, secret, session, expires, err := s.Mint()
		if err != nil {
			stsError(w, http.StatusInternalServerError, "Receiver", "InternalFailure", err.Error())
			return
		}
		s.mu.Lock()
		s.sessions = append(s.sessions, name)
		s.mu.Unlock()
		type creds struct {
			AccessKeyID     string `xml:"AccessKeyId"`
			SecretAccessKey string `xml:"SecretAccessKey"`
			SessionToken    string `xml:"SessionToken"`
			Expiration      string `xml:"Expiration"`
		}
		type result struct {
			Credentials creds `xml:"Credentials"`
		}
		type response struct {
			XMLName xml.Name `xml:"https://sts.amazonaws.com/doc/2011-06-15/ AssumeRoleWithWebIdentityResponse"`
			Result  result   `xml:"AssumeRoleWithWebIdentityResult"`
		}
		w.Header().Set("Content-Type", "text/xml")
		_ = xml.NewEncoder(w).Encode(response{Result: result{Credentials: creds{AccessKeyID: access, SecretAccessKey: secret,
			SessionToken: session, Expiration: expires.UTC().Format(time.RFC3339)}}})
	}
}

// stsError answers as STS does.
func stsError(w http.ResponseWriter, status int, typ, code, message string) {
	type detail struct {
		Type    string `xml:"Type"`
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
	type response struct {
		XMLName   xml.Name `xml:"https://sts.amazonaws.com/doc/2011-06-15/ ErrorResponse"`
		Error     detail   `xml:"Error"`
		RequestID string   `xml:"RequestId"`
	}
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	_ = xml.NewEncoder(w).Encode(response{Error: detail{Type: typ, Code: code, Message: message}, RequestID: "00000000-0000-0000-0000-000000000000"})
}
