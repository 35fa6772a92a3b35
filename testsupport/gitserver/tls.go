package gitserver

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/headwater-gitops/headwater/testsupport/testca"
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

	ca *testca.Authority
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
	leaf, err := s.ca.Issue(x509.ExtKeyUsageServerAuth, "gitserver", testca.Loopback)
	if err != nil {
		return err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{leaf.Pair}, MinVersion: tls.VersionTLS12}
	if s.RequireClientCert {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = x509.NewCertPool()
		cfg.ClientCAs.AddCert(s.ca.Cert)
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
	return s.ca.CertPEM, nil
}

// ClientCert issues a client certificate for commonName from the server's
// authority and returns it and its private key in PEM, as a client's
// tls.crt and tls.key.
func (s *TLSServer) ClientCert(commonName string) (certPEM, keyPEM []byte, err error) {
	if err := s.ensureCA(); err != nil {
		return nil, nil, err
	}
	c, err := s.ca.Issue(x509.ExtKeyUsageClientAuth, commonName, nil)
	if err != nil {
		return nil, nil, err
	}
	return c.CertPEM, c.KeyPEM, nil
}

func (s *TLSServer) ensureCA() error {
	if s.ca != nil {
		return nil
	}
	ca, err := testca.New("git server")
	if err != nil {
		return err
	}
	s.ca = ca
	return nil
}
