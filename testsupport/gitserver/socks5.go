package gitserver

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// SOCKS5Proxy is a SOCKS5 proxy (RFC 1928, CONNECT only) for tests in
// front of git servers, with optional username/password authentication
// (RFC 1929). It records what it connected.
type SOCKS5Proxy struct {
	// Username and Password, when set, are required.
	Username, Password string

	ln net.Listener
	wg sync.WaitGroup

	mu       sync.Mutex
	requests []string
	conns    map[net.Conn]struct{}
	closed   bool
}

// Start serves on addr ("127.0.0.1:0" picks a free port) until Stop.
func (p *SOCKS5Proxy) Start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("socks5 proxy: %w", err)
	}
	p.ln = ln
	p.conns = map[net.Conn]struct{}{}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !p.track(c) {
				_ = c.Close()
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(c)
			}()
		}
	}()
	return nil
}

// URL is the proxy's address, e.g. socks5://127.0.0.1:41234.
func (p *SOCKS5Proxy) URL() string { return "socks5://" + p.ln.Addr().String() }

// Requests lists the connections the proxy made, "CONNECT host:port".
func (p *SOCKS5Proxy) Requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.requests...)
}

// Stop stops serving and closes every connection.
func (p *SOCKS5Proxy) Stop() error {
	if p.ln == nil {
		return nil
	}
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// track registers c to be closed by Stop; false once stopped.
func (p *SOCKS5Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *SOCKS5Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// serve handles one client: negotiation, authentication, CONNECT, relay.
func (p *SOCKS5Proxy) serve(client net.Conn) {
	defer p.untrack(client)
	defer client.Close()
	_ = client.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(client)
	target, err := p.handshake(r, client)
	if err != nil {
		return
	}
	upstream, err := net.DialTimeout("tcp", target, 10*time.Second)
	if err != nil {
		_, _ = client.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0}) // connection refused
		return
	}
	if !p.track(upstream) {
		_ = upstream.Close()
		return
	}
	defer p.untrack(upstream)
	defer upstream.Close()
	p.mu.Lock()
	p.requests = append(p.requests, "CONNECT "+target)
	p.mu.Unlock()
	if _, err := client.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0}); err != nil {
		return
	}
	_ = client.SetDeadline(time.Time{})
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(upstream, r)
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
}

// handshake negotiates the method, authenticates and reads the CONNECT
// request, and returns its host:port.
func (p *SOCKS5Proxy) handshake(r *bufio.Reader, w io.Writer) (string, error) {
	head := make([]byte, 2)
	if _, err := io.ReadFull(r, head); err != nil || head[0] != 5 {
		return "", errors.New("not socks5")
	}
	methods := make([]byte, head[1])
	if _, err := io.ReadFull(r, methods); err != nil {
		return "", err
	}
	want := byte(0) // no authentication
	if p.Username != "" {
		want = 2 // username/password
	}
	if !containsByte(methods, want) {
		_, _ = w.Write([]byte{5, 0xff})
		return "", errors.New("no acceptable method")
	}
	if _, err := w.Write([]byte{5, want}); err != nil {
		return "", err
	}
	if want == 2 {
		user, pass, err := readUserPass(r)
		if err != nil {
			return "", err
		}
		if user != p.Username || pass != p.Password {
			_, _ = w.Write([]byte{1, 1})
			return "", errors.New("wrong credentials")
		}
		if _, err := w.Write([]byte{1, 0}); err != nil {
			return "", err
		}
	}
	req := make([]byte, 4)
	if _, err := io.ReadFull(r, req); err != nil {
		return "", err
	}
	if req[0] != 5 || req[1] != 1 {
		_, _ = w.Write([]byte{5, 7, 0, 1, 0, 0, 0, 0, 0, 0}) // command not supported
		return "", errors.New("only CONNECT is supported")
	}
	var host string
	switch req[3] {
	case 1, 4: // IPv4, IPv6
		ip := make([]byte, map[byte]int{1: 4, 4: 16}[req[3]])
		if _, err := io.ReadFull(r, ip); err != nil {
			return "", err
		}
		host = net.IP(ip).String()
	case 3: // domain name
		n, err := r.ReadByte()
		if err != nil {
			return "", err
		}
		name := make([]byte, n)
		if _, err := io.ReadFull(r, name); err != nil {
			return "", err
		}
		host = string(name)
	default:
		return "", errors.New("unknown address type")
	}
	port := make([]byte, 2)
	if _, err := io.ReadFull(r, port); err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(port)))), nil
}

// readUserPass reads an RFC 1929 username/password request.
func readUserPass(r *bufio.Reader) (user, pass string, err error) {
	ver, err := r.ReadByte()
	if err != nil || ver != 1 {
		return "", "", errors.New("bad authentication version")
	}
	field := func() (string, error) {
		n, err := r.ReadByte()
		if err != nil {
			return "", err
		}
		b := make([]byte, n)
		_, err = io.ReadFull(r, b)
		return string(b), err
	}
	if user, err = field(); err != nil {
		return "", "", err
	}
	pass, err = field()
	return user, pass, err
}

func containsByte(b []byte, c byte) bool {
	for _, x := range b {
		if x == c {
			return true
		}
	}
	return false
}
