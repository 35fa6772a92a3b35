package secrets

// Configuration built from Secret data with Flux's rules, for every kind
// that names a certSecretRef or a proxySecretRef.

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// Keys Flux reads from a certSecretRef and a proxySecretRef.
const (
	keyCA       = "ca.crt"
	keyCert     = "tls.crt"
	keyKey      = "tls.key"
	keyCAFile   = "caFile"   // deprecated spelling, still read by Flux
	keyCertFile = "certFile" // deprecated spelling, still read by Flux
	keyKeyFile  = "keyFile"  // deprecated spelling, still read by Flux
	keyAddress  = "address"
	keyUsername = "username"
	keyPassword = "password"
)

// proxySchemes are the proxy URL schemes Flux accepts.
var proxySchemes = []string{"http", "https", "socks5"}

// TLSConfig builds a TLS configuration from a certSecretRef's data with
// Flux's rules: ca.crt added to the system roots, tls.crt and tls.key as
// the client certificate; the deprecated caFile, certFile and keyFile are
// read when the standard keys are absent. ref names the Secret in errors.
func TLSConfig(data map[string][]byte, ref string) (*tls.Config, error) {
	ca, cert, key := first(data, keyCA, keyCAFile), first(data, keyCert, keyCertFile), first(data, keyKey, keyKeyFile)
	switch {
	case len(ca) == 0 && len(cert) == 0 && len(key) == 0:
		return nil, fmt.Errorf("secret '%s' must contain either '%s' or both '%s' and '%s'", ref, keyCA, keyCert, keyKey)
	case (len(cert) == 0) != (len(key) == 0):
		return nil, fmt.Errorf("secret '%s' must contain both '%s' and '%s'", ref, keyCert, keyKey)
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

// ProxyURL builds the proxy URL of a proxySecretRef's data with Flux's
// rules: address (http, https or socks5), with username and password.
// ref names the Secret in errors.
func ProxyURL(data map[string][]byte, ref string) (*url.URL, error) {
	address, ok := data[keyAddress]
	if !ok {
		return nil, fmt.Errorf("secret '%s' has no '%s' key", ref, keyAddress)
	}
	if len(address) == 0 {
		return nil, fmt.Errorf("secret '%s': proxy address is empty", ref)
	}
	u, err := url.Parse(string(address))
	if err != nil {
		// The parse error quotes the address, which may hold a password.
		return nil, fmt.Errorf("secret '%s': failed to parse proxy address", ref)
	}
	if !slices.Contains(proxySchemes, u.Scheme) {
		return nil, fmt.Errorf("secret '%s': proxy URL must use one of the supported schemes (%s), got '%s'",
			ref, strings.Join(proxySchemes, ", "), u.Scheme)
	}
	username, hasUsername := data[keyUsername]
	password, hasPassword := data[keyPassword]
	switch {
	case hasUsername && hasPassword:
		u.User = url.UserPassword(string(username), string(password))
	case hasUsername:
		u.User = url.User(string(username))
	}
	return u, nil
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
