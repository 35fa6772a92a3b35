// Package testca is a certificate authority made for one test server: it
// issues server and client certificates that no system trusts, so a client
// connects only when given the authority's certificate (a ca.crt).
package testca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"sync"
	"time"
)

// Authority is a certificate authority.
type Authority struct {
	// Cert is the authority's certificate, CertPEM the same in PEM.
	Cert    *x509.Certificate
	CertPEM []byte

	name string
	key  *ecdsa.PrivateKey
}

// Issued is a certificate with its key.
type Issued struct {
	// Pair is the certificate and key for a tls.Config.
	Pair tls.Certificate
	// CertPEM and KeyPEM are the same in PEM, as a tls.crt and a tls.key.
	CertPEM, KeyPEM []byte
}

// New makes an authority; name appears in its errors and certificates.
func New(name string) (*Authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("%s: generate CA key: %w", name, err)
	}
	tmpl, err := template(name, name+" test CA")
	if err != nil {
		return nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("%s: create CA certificate: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("%s: parse CA certificate: %w", name, err)
	}
	return &Authority{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), name: name, key: key}, nil
}

// Loopback sets a server certificate's names: 127.0.0.1, ::1 and
// localhost.
func Loopback(t *x509.Certificate) {
	t.DNSNames = []string{"localhost"}
	t.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
}

// Issue creates a certificate for usage, adjusted by edit when not nil.
func (a *Authority) Issue(usage x509.ExtKeyUsage, commonName string, edit func(*x509.Certificate)) (*Issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("%s: generate key: %w", a.name, err)
	}
	tmpl, err := template(a.name, commonName)
	if err != nil {
		return nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
	if edit != nil {
		edit(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, fmt.Errorf("%s: create certificate: %w", a.name, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("%s: marshal key: %w", a.name, err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: key pair: %w", a.name, err)
	}
	return &Issued{Pair: pair, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// template is a certificate valid from an hour ago for a day.
func template(name, commonName string) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("%s: serial number: %w", name, err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName, Organization: []string{"Headwater tests"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
	}, nil
}

// ServerConfig returns a TLS configuration serving a certificate for the
// loopback addresses; with clientCerts, it requires a client certificate
// issued by the authority (mutual TLS).
func (a *Authority) ServerConfig(commonName string, clientCerts bool) (*tls.Config, error) {
	leaf, err := a.Issue(x509.ExtKeyUsageServerAuth, commonName, Loopback)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{leaf.Pair}, MinVersion: tls.VersionTLS12}
	if clientCerts {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = x509.NewCertPool()
		cfg.ClientCAs.AddCert(a.Cert)
	}
	return cfg, nil
}

// Lazy is the authority of one test server, made on first use: embedded
// in a server, it gives it CACert and ClientCert.
type Lazy struct {
	// Name names the authority (see New).
	Name string

	mu sync.Mutex
	ca *Authority
}

// Authority returns the authority, making it on first use.
func (l *Lazy) Authority() (*Authority, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ca == nil {
		ca, err := New(l.Name)
		if err != nil {
			return nil, err
		}
		l.ca = ca
	}
	return l.ca, nil
}

// ServerConfig is Authority.ServerConfig of the authority.
func (l *Lazy) ServerConfig(commonName string, clientCerts bool) (*tls.Config, error) {
	ca, err := l.Authority()
	if err != nil {
		return nil, err
	}
	return ca.ServerConfig(commonName, clientCerts)
}

// CACert is the PEM certificate of the authority, as a client's ca.crt.
func (l *Lazy) CACert() ([]byte, error) {
	ca, err := l.Authority()
	if err != nil {
		return nil, err
	}
	return ca.CertPEM, nil
}

// ClientCert issues a client certificate for commonName from the
// authority and returns it and its private key in PEM, as a client's
// tls.crt and tls.key.
func (l *Lazy) ClientCert(commonName string) (certPEM, keyPEM []byte, err error) {
	ca, err := l.Authority()
	if err != nil {
		return nil, nil, err
	}
	c, err := ca.Issue(x509.ExtKeyUsageClientAuth, commonName, nil)
	if err != nil {
		return nil, nil, err
	}
	return c.CertPEM, c.KeyPEM, nil
}
