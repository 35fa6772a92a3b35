// Package egress keeps the requests Headwater makes to tenant-chosen URLs
// (Subscription sinks, HTTPSource URLs, Helm repository and chart URLs,
// Bucket endpoints, git and OCI hosts) off the addresses a tenant must not
// reach through Headwater: the private ranges (RFC 1918, CGNAT's
// 100.64.0.0/10, IPv6 unique local addresses), where the cluster's
// Services and Pods live, the metadata endpoint (169.254.169.254) and the
// rest of link-local, loopback (the pod itself), unspecified and
// multicast addresses, Headwater's own internals (the NATS server), and
// what the operator denies with -denied-destinations (a cluster whose
// Service or Pod CIDRs are public addresses).
//
// The check is made on the address actually dialled, after DNS resolution
// (net.Dialer.Control), not on the URL's host name: a name that resolves
// to an internal address, or is rebound to one after a first check, is
// refused all the same. -allowed-destinations lets through what the
// built-in list refuses (an in-cluster git server, a fetch from loopback
// on one machine, `make run`), never Headwater's internals. The refusal says nothing of the
// destination (ErrRefused), so a tenant learns nothing from its status
// but that the policy refused it.
package egress

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrRefused is the error of a dial the policy refuses. Its message is
// what users see: it names neither the address nor the port.
var ErrRefused = errors.New("destination refused by the egress policy (-allowed-destinations)")

// Builtin are the ranges refused unless allowed: the private ranges (where
// a cluster's Services and Pods, and a company's internal servers, are),
// loopback, link-local (the cloud metadata endpoint), unspecified and
// multicast.
var Builtin = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),     // RFC 1918
	netip.MustParsePrefix("172.16.0.0/12"),  // RFC 1918
	netip.MustParsePrefix("192.168.0.0/16"), // RFC 1918
	netip.MustParsePrefix("100.64.0.0/10"),  // shared address space (CGNAT, some clusters' Pods)
	netip.MustParsePrefix("fc00::/7"),       // IPv6 unique local addresses
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("ff00::/8"),
	netip.MustParsePrefix("fd00:ec2::254/128"), // AWS's IPv6 metadata endpoint
}

// Rule is an address range, optionally narrowed to one port.
type Rule struct {
	Prefix netip.Prefix
	// Port is the only port matched; 0 matches every port.
	Port uint16
}

func (r Rule) matches(a netip.AddrPort) bool {
	return r.Prefix.Contains(a.Addr()) && (r.Port == 0 || r.Port == a.Port())
}

func (r Rule) String() string {
	if r.Port == 0 {
		return r.Prefix.String()
	}
	if r.Prefix.IsSingleIP() {
		return netip.AddrPortFrom(r.Prefix.Addr(), r.Port).String()
	}
	return fmt.Sprintf("%s:%d", r.Prefix, r.Port)
}

// ParseRule reads a CIDR ("10.0.0.0/8"), an address ("10.0.0.1", "::1"),
// or either with a port ("10.0.0.1:443", "[::1]:8080", "10.0.0.0/8:443").
func ParseRule(s string) (Rule, error) {
	s = strings.TrimSpace(s)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return Rule{Prefix: netip.PrefixFrom(ap.Addr().Unmap(), ap.Addr().Unmap().BitLen()), Port: ap.Port()}, nil
	}
	var port uint16
	host := s
	if i := strings.LastIndex(s, ":"); i > 0 && strings.Contains(s, "/") && !strings.Contains(s[i:], "/") {
		p, err := netip.ParseAddrPort("0.0.0.0" + s[i:])
		if err != nil {
			return Rule{}, fmt.Errorf("destination %q: bad port", s)
		}
		host, port = s[:i], p.Port()
	}
	if p, err := netip.ParsePrefix(host); err == nil {
		return Rule{Prefix: p.Masked(), Port: port}, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		return Rule{Prefix: netip.PrefixFrom(a, a.BitLen()), Port: port}, nil
	}
	return Rule{}, fmt.Errorf("destination %q is not an address, a CIDR or either with a port", s)
}

// Rules is a flag.Value of comma-separated rules (repeatable).
type Rules []Rule

func (r *Rules) String() string {
	var s []string
	for _, x := range *r {
		s = append(s, x.String())
	}
	return strings.Join(s, ",")
}

// Set implements flag.Value.
func (r *Rules) Set(v string) error {
	for part := range strings.SplitSeq(v, ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		rule, err := ParseRule(part)
		if err != nil {
			return err
		}
		*r = append(*r, rule)
	}
	return nil
}

// Policy decides which addresses may be dialled for a tenant's URL. The
// zero Policy refuses Builtin only: every address but public ones.
type Policy struct {
	// Allowed lets through what Builtin or Denied refuse.
	Allowed Rules
	// Denied refuses more (the cluster's Service and Pod CIDRs where
	// they are not private, one host's port).
	Denied Rules
	// Internal are Headwater's own endpoints, refused whatever Allowed
	// says (InternalURLs fills it).
	Internal Rules
}

// Options are the policy's flags.
type Options struct {
	Policy Policy
	// Internal are Headwater's own endpoints as given (host:port or
	// URLs), resolved by Resolve.
	Internal []string
}

// Resolve adds the addresses of Headwater's own endpoints to the policy
// (InternalURLs): those of -internal-destinations and of urls (the
// service's -nats-url), and returns the policy.
func (o *Options) Resolve(ctx context.Context, urls ...string) *Policy {
	o.Policy.InternalURLs(ctx, append(slices.Clone(o.Internal), urls...)...)
	return &o.Policy
}

// BindFlags registers -allowed-destinations and -denied-destinations.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.Var(&o.Policy.Allowed, "allowed-destinations",
		"Addresses a tenant's URL (a Subscription's sink, a fetch) may reach although the egress policy refuses them: "+
			"comma-separated CIDRs or addresses, each optionally with :port (e.g. an in-cluster git server's Service, 10.96.12.34:3000). "+
			"The built-in refusals are the private ranges (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, fc00::/7: "+
			"the cluster's Services and Pods), loopback, link-local (the metadata endpoint), unspecified and multicast; "+
			"Headwater's own NATS server is refused whatever this says.")
	fs.Var(&o.Policy.Denied, "denied-destinations",
		"Addresses a tenant's URL may not reach, besides the built-in ones: comma-separated CIDRs or addresses, each optionally "+
			"with :port (e.g. the cluster's Service and Pod CIDRs where they are not private ranges). -allowed-destinations wins over it.")
	fs.Func("internal-destinations",
		"Headwater's own endpoints a tenant's URL may never reach, whatever -allowed-destinations says: comma-separated host:port "+
			"(e.g. the artifact-server's Service), resolved at start; the NATS server of -nats-url is always among them.",
		func(v string) error {
			o.Internal = append(o.Internal, v)
			return nil
		})
}

// Check says whether a may be dialled: nil, or ErrRefused.
func (p *Policy) Check(a netip.AddrPort) error {
	a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	for _, r := range p.Internal {
		if r.matches(a) {
			return ErrRefused
		}
	}
	for _, r := range p.Allowed {
		if r.matches(a) {
			return nil
		}
	}
	for _, r := range p.Denied {
		if r.matches(a) {
			return ErrRefused
		}
	}
	for _, b := range Builtin {
		if b.Contains(a.Addr()) {
			return ErrRefused
		}
	}
	return nil
}

// Control is a net.Dialer.Control that refuses what Check refuses: it
// sees the address the socket is about to connect to, after resolution.
func (p *Policy) Control(_, address string, _ syscall.RawConn) error {
	a, err := netip.ParseAddrPort(address)
	if err != nil {
		return ErrRefused
	}
	return p.Check(a)
}

// Dialer returns a dialer that checks every address it connects to, with
// http.DefaultTransport's timeouts.
func (p *Policy) Dialer() *net.Dialer {
	return &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: p.Control}
}

// Guard makes t dial through p's Dialer and returns it. A transport with
// a proxy dials the proxy, which is then what is checked.
func (p *Policy) Guard(t *http.Transport) *http.Transport {
	t.DialContext = p.DialContext
	return t
}

// DialContext dials through p's Dialer. A refusal is a *net.OpError
// without the address (what a name resolved to is not told) wrapping
// ErrRefused.
func (p *Policy) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return p.dial(ctx, p.Dialer(), network, address)
}

func (p *Policy) dial(ctx context.Context, d *net.Dialer, network, address string) (net.Conn, error) {
	conn, err := d.DialContext(ctx, network, address)
	if errors.Is(err, ErrRefused) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: ErrRefused}
	}
	return conn, err
}

// InternalURLs adds to p.Internal the addresses of the hosts of urls
// (comma-separated lists of URLs or host:port, such as -nats-url) on
// their ports; a nats:// URL's (or a bare host:port's) also on port 8222,
// NATS's monitoring port. A host that does
// not resolve is skipped: the NetworkPolicies keep fetchers off it anyway.
func (p *Policy) InternalURLs(ctx context.Context, urls ...string) {
	for _, list := range urls {
		for raw := range strings.SplitSeq(list, ",") {
			raw = strings.TrimSpace(raw)
			if raw == "" {
				continue
			}
			if !strings.Contains(raw, "://") {
				raw = "nats://" + raw
			}
			u, err := url.Parse(raw)
			if err != nil || u.Hostname() == "" {
				continue
			}
			var ports []uint16
			if pt, err := netip.ParseAddrPort("0.0.0.0:" + u.Port()); err == nil {
				ports = append(ports, pt.Port())
			}
			if u.Scheme == "nats" || u.Scheme == "tls" {
				// NATS's client port by default, and its monitoring port.
				if u.Port() == "" {
					ports = append(ports, 4222)
				}
				ports = append(ports, 8222)
			}
			if len(ports) == 0 {
				continue
			}
			addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", u.Hostname())
			if err != nil {
				continue
			}
			for _, a := range addrs {
				a = a.Unmap()
				for _, port := range ports {
					p.Internal = append(p.Internal, Rule{Prefix: netip.PrefixFrom(a, a.BitLen()), Port: port})
				}
			}
		}
	}
}

// installed is the policy of this process (Install).
var installed atomic.Pointer[Policy]

// Install makes p the process's policy for Guard: the services that fetch
// tenant URLs install theirs at start-up, and each client of a tenant's
// URL guards its transport, so no policy has to be threaded through every
// fetch package. The services' own clients (the API server, NATS, the
// storage, cloud credentials from the metadata endpoint) do not call
// Guard and are not affected.
func Install(p *Policy) { installed.Store(p) }

// Guard makes t dial through the policy installed when it dials (none:
// as http.DefaultTransport does), and returns it.
func Guard(t *http.Transport) *http.Transport {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	t.DialContext = func(ctx context.Context, network, address string) (net.Conn, error) {
		return DialContext(ctx, d, network, address)
	}
	return t
}

// Transport is a clone of http.DefaultTransport guarded by Guard.
func Transport() *http.Transport {
	return Guard(http.DefaultTransport.(*http.Transport).Clone())
}

// DialContext dials through the installed policy, if any: for clients of
// tenant URLs that are not HTTP (git over SSH).
func DialContext(ctx context.Context, d *net.Dialer, network, address string) (net.Conn, error) {
	if p := installed.Load(); p != nil {
		guarded := *d
		guarded.Control = p.Control
		return p.dial(ctx, &guarded, network, address)
	}
	return d.DialContext(ctx, network, address)
}

// Refused reports whether err is a refusal of the policy.
func Refused(err error) bool { return errors.Is(err, ErrRefused) }
