package gitserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"time"
)

// TLSServer serves like Server, over HTTPS: its certificate, for 127.0.0.1,
// ::1 and localhost, is issued by a certificate authority of its own that no
// system trusts, so a client must be given CACert to connect.
type TLSServer struct {
	// Server holds the root and the credentials the server requires.
	Server
	// RequireClientCert, when true, requires a client certificate issued by
	// the server's authority (see ClientCert): mutual TLS.
	RequireClientCert bool

	ca *authority
}

// Start serves Root over HTTPS on addr ("127.0.0.1:0" picks a free port)
// until Stop.
func (s *TLSServer) Start(addr string) error {
	if err := s.ensureCA(); err != nil {
		return err
	}
	handler, err := s.handler()
	if err != nil {
		return err
	}
	leaf, err := s.ca.issue(x509.ExtKeyUsageServerAuth, "gitserver", func(t *x509.Certificate) {
		t.DNSNames = []string{"localhost"}
		t.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	})
	if err != nil {
		return err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{leaf.pair}, MinVersion: tls.VersionTLS12}
	if s.RequireClientCert {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = x509.NewCertPool()
		cfg.ClientCAs.AddCert(s.ca.cert)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("git server: %w", err)
	}
	s.url = "https://" + ln.Addr().String()
	s.srv = &http.Server{
		Handler:           handler,
		TLSConfig:         cfg,
		ReadHeaderTimeout: 10 * time.Second,
		// Clients that do not trust the authority are expected in tests;
		// their failed handshakes are not worth a log line.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go func() { _ = s.srv.Serve(tls.NewListener(ln, cfg)) }()
	return nil
}

// CACert is the PEM certificate of the authority that issued the server's
// certificate, as a client's ca.crt. It is generated on first use.
func (s *TLSServer) CACert() ([]byte, error) {
	if err := s.ensureCA(); err != nil {
		return nil, err
	}
	return s.ca.certPEM, nil
}

// ClientCert issues a client certificate for commonName from the server's
// authority and returns it and its private key in PEM, as a client's
// tls.crt and tls.key.
func (s *TLSServer) ClientCert(commonName string) (certPEM, keyPEM []byte, err error) {
	if err := s.ensureCA(); err != nil {
		return nil, nil, err
	}
	c, err := s.ca.issue(x509.ExtKeyUsageClientAuth, commonName, nil)
	if err != nil {
		return nil, nil, err
	}
	return c.certPEM, c.keyPEM, nil
}

func (s *TLSServer) ensureCA() error {
	if s.ca != nil {
		return nil
	}
	ca, err := newAuthority()
	if err != nil {
		return err
	}
	s.ca = ca
	return nil
}

// authority is a certificate authority made for one server.
type authority struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

// issued is a certificate with its key.
type issued struct {
	pair            tls.Certificate
	certPEM, keyPEM []byte
}

func newAuthority() (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("git server: generate CA key: %w", err)
	}
	tmpl, err := template("gitserver test CA")
	if err != nil {
		return nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("git server: create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("git server: parse CA certificate: %w", err)
	}
	return &authority{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// issue creates a certificate for usage, adjusted by edit when not nil.
func (a *authority) issue(usage x509.ExtKeyUsage, commonName string, edit func(*x509.Certificate)) (*issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("git server: generate key: %w", err)
	}
	tmpl, err := template(commonName)
	if err != nil {
		return nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
	if edit != nil {
		edit(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, fmt.Errorf("git server: create certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("git server: marshal key: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("git server: key pair: %w", err)
	}
	return &issued{pair: pair, certPEM: certPEM, keyPEM: keyPEM}, nil
}

// template is a certificate valid from an hour ago for a day.
func template(commonName string) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("git server: serial number: %w", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName, Organization: []string{"Headwater tests"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
	}, nil
}
