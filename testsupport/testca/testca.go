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
