package gitfetch

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"sync"

	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/client"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"

	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
)

// LimitHTTP installs, for the whole process, go-git's HTTP and HTTPS
// transport behind l: every request a clone, a fetch or a reference
// listing makes passes the limits of its host (see package hostlimit).
//
// go-git configures TLS and proxies itself only on an *http.Transport it
// clones, which a limiter cannot be; so the session's transport is
// configured here, as go-git would (client certificate, CA bundle added
// to the system's, insecure, proxy), and go-git gets an endpoint without
// those settings.
func LimitHTTP(l *hostlimit.Limiter) {
	t := &limitedHTTP{limiter: l}
	client.InstallProtocol("http", t)
	client.InstallProtocol("https", t)
}

// limitedHTTP is a go-git transport.Transport over HTTP behind a limiter.
type limitedHTTP struct {
	limiter *hostlimit.Limiter
	once    sync.Once
	shared  transport.Transport
}

// NewUploadPackSession implements transport.Transport.
func (t *limitedHTTP) NewUploadPackSession(ep *transport.Endpoint, auth transport.AuthMethod) (transport.UploadPackSession, error) {
	c, plain, err := t.client(ep)
	if err != nil {
		return nil, err
	}
	return c.NewUploadPackSession(plain, auth)
}

// NewReceivePackSession implements transport.Transport.
func (t *limitedHTTP) NewReceivePackSession(ep *transport.Endpoint, auth transport.AuthMethod) (transport.ReceivePackSession, error) {
	c, plain, err := t.client(ep)
	if err != nil {
		return nil, err
	}
	return c.NewReceivePackSession(plain, auth)
}

// client returns go-git's HTTP client for ep, behind the limiter, and ep
// without the settings that client already applies. An endpoint without
// TLS settings or proxy shares one connection pool.
func (t *limitedHTTP) client(ep *transport.Endpoint) (transport.Transport, *transport.Endpoint, error) {
	if len(ep.ClientCert) == 0 && len(ep.ClientKey) == 0 && len(ep.CaBundle) == 0 && !ep.InsecureSkipTLS && ep.Proxy.URL == "" {
		t.once.Do(func() {
			base := egress.Transport()
			t.shared = githttp.NewClient(&http.Client{Transport: hostlimit.Wrap(base, t.limiter)})
		})
		return t.shared, ep, nil
	}
	own := egress.Transport()
	if err := configureHTTP(own, ep); err != nil {
		return nil, nil, err
	}
	plain := *ep
	plain.ClientCert, plain.ClientKey, plain.CaBundle, plain.InsecureSkipTLS = nil, nil, nil, false
	plain.Proxy = transport.ProxyOptions{}
	return githttp.NewClient(&http.Client{Transport: hostlimit.Wrap(own, t.limiter)}), &plain, nil
}

// configureHTTP applies ep's TLS settings and proxy to tr as go-git does.
func configureHTTP(tr *http.Transport, ep *transport.Endpoint) error {
	tlsConfig := &tls.Config{}
	if len(ep.ClientCert) > 0 && len(ep.ClientKey) > 0 {
		pair, err := tls.X509KeyPair(ep.ClientCert, ep.ClientKey)
		if err != nil {
			return fmt.Errorf("client certificate: %w", err)
		}
		tlsConfig.Certificates = []tls.Certificate{pair}
	}
	if len(ep.CaBundle) > 0 {
		roots, err := x509.SystemCertPool()
		if err != nil || roots == nil {
			roots = x509.NewCertPool()
		}
		roots.AppendCertsFromPEM(ep.CaBundle)
		tlsConfig.RootCAs = roots
	}
	tlsConfig.InsecureSkipVerify = ep.InsecureSkipTLS //nolint:gosec // the spec asks for it, as go-git honours it
	tr.TLSClientConfig = tlsConfig
	if ep.Proxy.URL != "" {
		u, err := ep.Proxy.FullURL()
		if err != nil {
			return fmt.Errorf("proxy: %w", err)
		}
		tr.Proxy = http.ProxyURL(u)
	}
	return nil
}
