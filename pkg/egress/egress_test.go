package egress

import (
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	var o Options
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	o.BindFlags(fs)
	if err := fs.Parse([]string{"-denied-destinations", "203.0.113.0/24, 198.51.100.5:8080", "-allowed-destinations",
		"10.1.2.3,127.0.0.1:9000,[::1]:9001,192.168.7.0/24:443,203.0.113.9"}); err != nil {
		t.Fatal(err)
	}
	p := o.Policy
	p.Internal = Rules{{Prefix: netip.MustParsePrefix("127.0.0.1/32"), Port: 4222}, {Prefix: netip.MustParsePrefix("10.1.2.3/32"), Port: 8222}}
	for addr, refused := range map[string]bool{
		"169.254.169.254:80":          true, // the metadata endpoint
		"[::ffff:169.254.169.254]:80": true, // the same, v4-mapped
		"[fe80::1]:80":                true,
		"127.0.0.1:8080":              true, // loopback
		"127.9.9.9:80":                true,
		"[::1]:80":                    true,
		"0.0.0.0:80":                  true,
		"224.0.0.1:80":                true,
		"127.0.0.1:9000":              false, // allowed with its port
		"[::1]:9001":                  false,
		"127.0.0.1:4222":              true, // internal: never allowed
		"10.9.9.9:443":                true, // private, as the cluster's Services and Pods
		"172.16.0.1:443":              true,
		"172.31.255.255:443":          true,
		"192.168.1.5:443":             true,
		"100.64.0.1:443":              true, // CGNAT
		"100.127.255.1:443":           true,
		"[fd12:3456::1]:443":          true,  // unique local
		"[::ffff:10.9.9.9]:443":       true,  // v4-mapped
		"172.32.0.1:443":              false, // just past the private ranges
		"100.128.0.1:443":             false,
		"10.1.2.3:443":                false, // allowed inside a private range
		"192.168.7.8:443":             false, // allowed with its port
		"192.168.7.8:80":              true,
		"10.1.2.3:8222":               true,  // internal wins over allowed
		"203.0.113.1:443":             true,  // denied
		"203.0.113.9:443":             false, // allowed inside the denied range
		"198.51.100.5:8080":           true,
		"198.51.100.5:443":            false,
		"93.184.216.34:443":           false,
		"[2606:2800:220:1::1]:443":    false,
	} {
		err := p.Check(netip.MustParseAddrPort(addr))
		if got := errors.Is(err, ErrRefused); got != refused {
			t.Errorf("Check(%s) = %v, want refused %t", addr, err, refused)
		}
	}
	if got := o.Policy.Denied.String(); got != "203.0.113.0/24,198.51.100.5:8080" {
		t.Errorf("Denied = %q", got)
	}
	for _, bad := range []string{"example.com", "10.0.0.0/33", "1.2.3.4:x", "10.0.0.0/8:99999"} {
		if _, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) accepted", bad)
		}
	}
}

// TestGuardChecksTheDialledAddress: a real server on loopback is refused
// through a name that resolves to it ("localhost") as through its address,
// the error names neither, and an allowed port is reached.
func TestGuardChecksTheDialledAddress(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	client := func(p *Policy) *http.Client {
		return &http.Client{Transport: p.Guard(http.DefaultTransport.(*http.Transport).Clone())}
	}
	for _, host := range []string{"127.0.0.1", "localhost"} {
		u := "http://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/x"
		_, err := client(&Policy{}).Get(u)
		if !Refused(err) {
			t.Errorf("GET %s: %v, want refused", u, err)
			continue
		}
		if msg := strings.ReplaceAll(err.Error(), u, ""); strings.Contains(msg, "127.0.0.1") || strings.Contains(msg, strconv.Itoa(port)) {
			t.Errorf("the refusal tells the address: %v", err)
		}
	}
	allowed := &Policy{}
	if err := allowed.Allowed.Set("127.0.0.1:" + strconv.Itoa(port) + ",::1"); err != nil {
		t.Fatal(err)
	}
	resp, err := client(allowed).Get(srv.URL)
	if err != nil {
		t.Fatalf("allowed: %v", err)
	}
	_ = resp.Body.Close()
	// Internal wins: the same address as Headwater's own.
	allowed.InternalURLs(context.Background(), "nats://localhost:"+strconv.Itoa(port))
	if _, err := client(allowed).Get(srv.URL); !Refused(err) {
		t.Errorf("an internal endpoint: %v, want refused", err)
	}
}

// TestInstalledPolicy: Guard and DialContext follow the installed policy,
// and leave transports alone without one.
func TestInstalledPolicy(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer srv.Close()
	defer Install(nil)
	Install(nil)
	// One client, made before the policy is installed, as a fetch
	// package's may be.
	client := &http.Client{Transport: Transport()}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatalf("without a policy: %v", err)
	}
	_ = resp.Body.Close()
	client.CloseIdleConnections()
	Install(&Policy{})
	if _, err := client.Get(srv.URL); !Refused(err) {
		t.Errorf("with the policy: %v, want refused", err)
	}
	if _, err := DialContext(context.Background(), &net.Dialer{}, "tcp", srv.Listener.Addr().String()); !Refused(err) {
		t.Errorf("DialContext with the policy: %v, want refused", err)
	}
}
