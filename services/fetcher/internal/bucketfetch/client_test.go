package bucketfetch

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
)

// selfSigned returns a PEM certificate and key for a client.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "headwater-fetcher"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	must(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// TestTLS serves MinIO over HTTPS (a TLS proxy in front of it) that
// requires a client certificate, and fetches with the certSecretRef.
func TestTLS(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "testbucket")
	put(t, srv, "testbucket", "TESTFILE.md", "11111")
	target, err := url.Parse(srv.URL())
	must(t, err)
	clientCert, clientKey := selfSigned(t)
	clientCAs := x509.NewCertPool()
	clientCAs.AppendCertsFromPEM(clientCert)
	front := httptest.NewUnstartedServer(httputil.NewSingleHostReverseProxy(target))
	front.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCAs}
	front.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes refused on purpose
	front.StartTLS()
	t.Cleanup(front.Close)
	serverCA := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: front.Certificate().Raw})

	src := &Source{
		Secrets: kube(t, map[string]map[string]string{
			"creds":    credsSecret(srv),
			"tls":      {"ca.crt": string(serverCA), "tls.crt": string(clientCert), "tls.key": string(clientKey)},
			"legacy":   {"caFile": string(serverCA), "certFile": string(clientCert), "keyFile": string(clientKey)},
			"ca-only":  {"ca.crt": string(serverCA)},
			"cert":     {"tls.crt": string(clientCert)},
			"empty":    {"foo": "bar"},
			"bad-ca":   {"ca.crt": "not a certificate"},
			"bad-pair": {"ca.crt": string(serverCA), "tls.crt": string(clientCert), "tls.key": string(serverCA)},
		}),
		MaxRetries: 1,
	}
	cases := []struct {
		name     string
		secret   string
		reason   string
		handling failure.Handling
		message  string
	}{
		{name: "ca and client certificate", secret: "tls"},
		{name: "deprecated keys", secret: "legacy"},
		{name: "no client certificate", secret: "ca-only", reason: sourcev1.BucketOperationFailedReason, handling: failure.Transient,
			message: "failed to confirm existence of 'testbucket' bucket: "},
		{name: "unknown server certificate", reason: sourcev1.BucketOperationFailedReason, handling: failure.Transient,
			message: "certificate signed by unknown authority"},
		{name: "certificate without key", secret: "cert", reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
			message: "failed to get TLS config: secret 'default/cert' must contain both 'tls.crt' and 'tls.key'"},
		{name: "no TLS keys", secret: "empty", reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
			message: "failed to get TLS config: secret 'default/empty' must contain either 'ca.crt' or both 'tls.crt' and 'tls.key'"},
		{name: "unparseable CA", secret: "bad-ca", reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
			message: "failed to get TLS config: failed to parse CA certificate"},
		{name: "mismatched key", secret: "bad-pair", reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
			message: "failed to get TLS config: failed to parse TLS certificate and key: "},
		{name: "missing secret", secret: "absent", reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient,
			message: `failed to get TLS config: failed to get secret 'default/absent': secrets "absent" not found`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := request(sourcev1.BucketSpec{BucketName: "testbucket", Endpoint: front.Listener.Addr().String(),
				SecretRef: &meta.LocalObjectReference{Name: "creds"}})
			if tc.secret != "" {
				req.Bucket.CertSecretRef = &meta.LocalObjectReference{Name: tc.secret}
			}
			_, _, got, err := sourcetest.Fetch(t, src, req)
			if tc.reason != "" {
				sourcetest.CheckFailure(t, err, tc.reason, tc.handling, tc.message)
				return
			}
			must(t, err)
			if want := map[string]string{"TESTFILE.md": "11111"}; !reflect.DeepEqual(got, want) {
				t.Errorf("files = %v, want %v", got, want)
			}
		})
	}
}

// TestProxy fetches through an HTTP proxy that requires basic
// authentication.
func TestProxy(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "testbucket")
	put(t, srv, "testbucket", "TESTFILE.md", "11111")
	var proxied, refused atomic.Int64
	wantAuth := "Basic " + base64.StdEncoding.EncodeToString([]byte("proxy-user:proxy-pass"))
	forward := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		// A forward proxy receives absolute URLs: send them on as they are.
		pr.Out.URL = pr.In.URL
		pr.Out.Host = pr.In.Host
	}}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") != wantAuth {
			refused.Add(1)
			http.Error(w, "proxy authentication required", http.StatusProxyAuthRequired)
			return
		}
		proxied.Add(1)
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	_, port, err := net.SplitHostPort(proxy.Listener.Addr().String())
	must(t, err)
	src := &Source{
		Secrets: kube(t, map[string]map[string]string{
			"creds":     credsSecret(srv),
			"proxy":     {"address": "http://127.0.0.1:" + port, "username": "proxy-user", "password": "proxy-pass"},
			"anonymous": {"address": "http://127.0.0.1:" + port},
			"socks4":    {"address": "socks4://127.0.0.1:" + port},
		}),
		MaxRetries: 1,
	}
	withProxy := func(secret string) *events.FetchRequested {
		return request(sourcev1.BucketSpec{BucketName: "testbucket", Endpoint: srv.Endpoint, Insecure: true,
			SecretRef: &meta.LocalObjectReference{Name: "creds"}, ProxySecretRef: &meta.LocalObjectReference{Name: secret}})
	}

	_, _, got, err := sourcetest.Fetch(t, src, withProxy("proxy"))
	must(t, err)
	if want := map[string]string{"TESTFILE.md": "11111"}; !reflect.DeepEqual(got, want) {
		t.Errorf("files = %v, want %v", got, want)
	}
	if proxied.Load() == 0 {
		t.Error("no request went through the proxy")
	}

	_, _, _, err = sourcetest.Fetch(t, src, withProxy("anonymous"))
	sourcetest.CheckFailure(t, err, sourcev1.BucketOperationFailedReason, failure.Transient, "failed to confirm existence of 'testbucket' bucket: ")
	if refused.Load() == 0 {
		t.Error("the proxy refused no request")
	}
	_, _, _, err = sourcetest.Fetch(t, src, withProxy("socks4"))
	sourcetest.CheckFailure(t, err, sourcev1.AuthenticationFailedReason, failure.Stalling,
		"failed to get proxy URL: secret 'default/socks4': proxy URL must use one of the supported schemes (http, https, socks5), got 'socks4'")
}
