package gitserver

import (
	"crypto/tls"
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

	// Lazy is the server's authority: CACert and ClientCert.
	testca.Lazy
}

// Start serves Root over HTTPS on addr ("127.0.0.1:0" picks a free port)
// until Stop.
func (s *TLSServer) Start(addr string) error {
	handler, err := s.handler()
	if err != nil {
		return err
	}
	cfg, err := s.Lazy.ServerConfig("gitserver", s.RequireClientCert)
	if err != nil {
		return err
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
