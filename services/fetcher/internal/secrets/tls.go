package secrets

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
)

// Secret keys Flux reads for TLS (a certSecretRef, or a secretRef that
// also carries TLS material).
const (
	// KeyCA is a PEM CA bundle added to the system roots.
	KeyCA = "ca.crt"
	// KeyCert and KeyKey are a client certificate and its key.
	KeyCert = "tls.crt"
	KeyKey  = "tls.key"
	// KeyCAFile, KeyCertFile and KeyKeyFile are the deprecated spellings
	// Flux still reads when the standard keys are absent.
	KeyCAFile   = "caFile"
	KeyCertFile = "certFile"
	KeyKeyFile  = "keyFile"
)

// HasTLS reports whether data holds any TLS key, standard or deprecated.
func HasTLS(data map[string][]byte) bool {
	for _, k := range []string{KeyCA, KeyCert, KeyKey, KeyCAFile, KeyCertFile, KeyKeyFile} {
		if _, ok := data[k]; ok {
			return true
		}
	}
	return false
}

// TLSConfig builds a client TLS configuration from a Secret's data with
// Flux's rules: ca.crt added to the system roots, tls.crt and tls.key as
// the client certificate; the deprecated caFile, certFile and keyFile are
// read when the standard keys are absent. ref names the Secret in errors.
func TLSConfig(data map[string][]byte, ref string) (*tls.Config, error) {
	ca, cert, key := first(data, KeyCA, KeyCAFile), first(data, KeyCert, KeyCertFile), first(data, KeyKey, KeyKeyFile)
	switch {
	case len(ca) == 0 && len(cert) == 0 && len(key) == 0:
		return nil, fmt.Errorf("secret '%s' must contain either '%s' or both '%s' and '%s'", ref, KeyCA, KeyCert, KeyKey)
	case (len(cert) == 0) != (len(key) == 0):
		return nil, fmt.Errorf("secret '%s' must contain both '%s' and '%s'", ref, KeyCert, KeyKey)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(cert) > 0 {
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("failed to parse TLS certificate and key: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	if len(ca) > 0 {
		pool, err := x509.SystemCertPool()
		if err != nil {
			return nil, fmt.Errorf("cannot retrieve system certificate pool: %w", err)
		}
		if !pool.AppendCertsFromPEM(ca) {
			return nil, errors.New("failed to parse CA certificate")
		}
		c.RootCAs = pool
	}
	return c, nil
}

// first returns the value of the first of keys that data has.
func first(data map[string][]byte, keys ...string) []byte {
	for _, k := range keys {
		if v, ok := data[k]; ok {
			return v
		}
	}
	return nil
}
