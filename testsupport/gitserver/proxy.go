package gitserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"time"
)

// Proxy is a forward HTTP proxy for tests in front of git servers: it
// relays plain HTTP requests and tunnels CONNECT (for HTTPS and anything
// else over TCP), and records what it relayed.
type Proxy struct {
	// Username and Password, when set, require Proxy-Authorization with
	// them (basic); other requests get 407.
	Username, Password string

	srv       *http.Server
	url       string
	transport *http.Transport

	mu       sync.Mutex
	requests []string
	refused  int
	tunnels  map[net.Conn]struct{} // hijacked, which Close does not close
}

// Start serves on addr ("127.0.0.1:0" picks a free port) until Stop.
func (p *Proxy) Start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	// Relay directly, whatever proxy the environment names.
	p.transport = &http.Transport{Proxy: nil, DisableCompression: true}
	p.url = "http://" + ln.Addr().String()
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = p.srv.Serve(ln) }()
	return nil
}

// URL is the proxy's address, e.g. http://127.0.0.1:41234.
func (p *Proxy) URL() string { return p.url }

// Requests lists what the proxy relayed, in order: "CONNECT host:port" for
// a tunnel, "<METHOD> <absolute URL>" for a plain HTTP request.
func (p *Proxy) Requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.requests...)
}

// Refused counts the requests refused for want of the right
// Proxy-Authorization.
func (p *Proxy) Refused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// Stop stops serving and closes the tunnels.
func (p *Proxy) Stop() error {
	if p.srv == nil {
		return nil
	}
	err := p.srv.Close()
	p.transport.CloseIdleConnections()
	p.mu.Lock()
	for c := range p.tunnels {
		_ = c.Close()
	}
	p.mu.Unlock()
	return err
}

// ServeHTTP relays one proxied request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.Username != "" && r.Header.Get("Proxy-Authorization") != "Basic "+basic(p.Username, p.Password) {
		p.mu.Lock()
		p.refused++
		p.mu.Unlock()
		w.Header().Set("Proxy-Authenticate", `Basic realm="proxy"`)
		http.Error(w, "proxy authentication required", http.StatusProxyAuthRequired)
		return
	}
	if r.Method == http.MethodConnect {
		p.record("CONNECT " + r.Host)
		p.tunnel(w, r)
		return
	}
	if !r.URL.IsAbs() {
		http.Error(w, "not a proxy request", http.StatusBadRequest)
		return
	}
	p.record(r.Method + " " + r.URL.String())
	out := r.Clone(r.Context())
	out.RequestURI = ""
	for _, h := range []string{"Proxy-Authorization", "Proxy-Connection", "Connection", "Keep-Alive", "Te", "Trailer", "Upgrade"} {
		out.Header.Del(h)
	}
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// tunnel connects the client to r.Host and copies bytes both ways.
func (p *Proxy) tunnel(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	upstream, err := (&net.Dialer{}).DialContext(ctx, "tcp", r.Host)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		_ = upstream.Close()
		http.Error(w, "cannot tunnel", http.StatusInternalServerError)
		return
	}
	client, buf, err := hj.Hijack()
	if err != nil {
		_ = upstream.Close()
		return
	}
	p.mu.Lock()
	if p.tunnels == nil {
		p.tunnels = map[net.Conn]struct{}{}
	}
	p.tunnels[client], p.tunnels[upstream] = struct{}{}, struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.tunnels, client)
		delete(p.tunnels, upstream)
		p.mu.Unlock()
	}()
	if _, err := client.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		_ = client.Close()
		_ = upstream.Close()
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		// Bytes the server already buffered belong to the tunnel.
		_, _ = io.Copy(upstream, buf)
		_ = closeWrite(upstream)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(client, upstream)
		_ = closeWrite(client)
		done <- struct{}{}
	}()
	<-done
	<-done
	_ = client.Close()
	_ = upstream.Close()
}

func (p *Proxy) record(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests = append(p.requests, s)
}

func basic(user, password string) string {
	return base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
}

// closeWrite half-closes a TCP connection, so the other side sees the end.
func closeWrite(c net.Conn) error {
	if tc, ok := c.(*net.TCPConn); ok {
		return tc.CloseWrite()
	}
	return c.Close()
}
