package gitfetch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-git/go-git/v5/plumbing/transport"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"github.com/skeema/knownhosts"
	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/net/proxy"

	"github.com/headwater-gitops/headwater/pkg/egress"
)

// defaultSSHUser is the user of an ssh URL that names none, as in Flux.
const defaultSSHUser = "git"

// errHostKey is wrapped by every host key verification failure.
var errHostKey = errors.New("host key verification failed")

// sshCredentials builds public key authentication for an ssh URL from a
// Secret's identity, password and known_hosts. The Secret's username and
// identity.pub are not used (as in Flux): the user comes from the URL.
func sshCredentials(u *url.URL, data map[string][]byte) (*credentials, error) {
	identity, hosts := data[keyIdentity], data[keyKnownHosts]
	switch {
	case len(identity) == 0:
		return nil, fmt.Errorf("invalid 'ssh' auth option: '%s' is required", keyIdentity)
	case len(hosts) == 0:
		return nil, fmt.Errorf("invalid 'ssh' auth option: '%s' is required", keyKnownHosts)
	}
	user := u.User.Username()
	if user == "" {
		user = defaultSSHUser
	}
	passphrase := string(data[keyPassword])
	if passphrase == "" {
		passphrase, _ = u.User.Password()
	}
	keys, err := gitssh.NewPublicKeys(user, identity, passphrase)
	if err != nil {
		return nil, fmt.Errorf("invalid '%s': %w", keyIdentity, err)
	}
	db, err := knownHostsDB(hosts)
	if err != nil {
		return nil, err
	}
	port := u.Port()
	if port == "" {
		port = "22"
	}
	keys.HostKeyCallback = checkHostKey(db.HostKeyCallback())
	// Offer only the algorithms of the keys known for the host, so a
	// server with several host keys shows one known_hosts can check.
	keys.HostKeyAlgorithms = db.HostKeyAlgorithms(net.JoinHostPort(u.Hostname(), port))
	return &credentials{method: keys, ssh: true}, nil
}

// knownHostsDB parses known_hosts content. The parser reads files, so the
// content goes through a temporary one.
func knownHostsDB(content []byte) (*knownhosts.HostKeyDB, error) {
	dir, err := os.MkdirTemp("", "headwater-known-hosts-")
	if err != nil {
		return nil, fmt.Errorf("cannot read '%s': %w", keyKnownHosts, err)
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, keyKnownHosts)
	if err := os.WriteFile(file, content, 0o600); err != nil {
		return nil, fmt.Errorf("cannot read '%s': %w", keyKnownHosts, err)
	}
	db, err := knownhosts.NewDB(file)
	if err != nil {
		// Name the key, not the temporary file.
		return nil, fmt.Errorf("invalid '%s': %s", keyKnownHosts, strings.ReplaceAll(err.Error(), dir+string(filepath.Separator), ""))
	}
	return db, nil
}

// checkHostKey wraps a known_hosts callback so that a refused host key
// says which host and key were refused, and wraps errHostKey.
func checkHostKey(check gossh.HostKeyCallback) gossh.HostKeyCallback {
	return func(hostname string, remote net.Addr, key gossh.PublicKey) error {
		err := check(hostname, remote, key)
		if err == nil {
			return nil
		}
		host := knownhosts.Normalize(hostname)
		offered := key.Type() + " " + gossh.FingerprintSHA256(key)
		switch {
		case knownhosts.IsHostUnknown(err):
			return fmt.Errorf("%w: known_hosts has no key for '%s', which offered %s: %w", errHostKey, host, offered, err)
		case knownhosts.IsHostKeyChanged(err):
			return fmt.Errorf("%w: the host key of '%s' (%s) does not match known_hosts: %w", errHostKey, host, offered, err)
		default:
			return fmt.Errorf("%w: '%s' offered %s: %w", errHostKey, host, offered, err)
		}
	}
}

// deadlineScheme names the dialer deadlineProxy installs in
// golang.org/x/net/proxy, which go-git's SSH transport dials through.
const deadlineScheme = "headwater-deadline"

var registerDeadlineDialer sync.Once

// deadlineProxy returns proxy options under which go-git's SSH transport
// connects through a dialer that sets deadline on the connection, through
// the socks5 proxy via when it has a URL. Without it a server that accepts
// the connection and never answers would hold the fetch forever: go-git
// connects and shakes hands without the fetch's context.
func deadlineProxy(deadline time.Time, via transport.ProxyOptions) transport.ProxyOptions {
	registerDeadlineDialer.Do(func() { proxy.RegisterDialerType(deadlineScheme, newDeadlineDialer) })
	q := url.Values{"deadline": {deadline.Format(time.RFC3339Nano)}}
	if via.URL != "" {
		if full, err := via.FullURL(); err == nil {
			q.Set("via", full.String())
		}
	}
	return transport.ProxyOptions{URL: (&url.URL{Scheme: deadlineScheme, Host: "dialer", RawQuery: q.Encode()}).String()}
}

// deadlineDialer dials connections that end at a deadline.
type deadlineDialer struct {
	deadline time.Time
	forward  proxy.ContextDialer
}

// newDeadlineDialer builds the dialer a deadlineProxy URL describes.
func newDeadlineDialer(u *url.URL, _ proxy.Dialer) (proxy.Dialer, error) {
	q := u.Query()
	deadline, err := time.Parse(time.RFC3339Nano, q.Get("deadline"))
	if err != nil {
		return nil, fmt.Errorf("ssh dialer: invalid deadline: %w", err)
	}
	d := &deadlineDialer{deadline: deadline, forward: guardedDialer{}}
	if via := q.Get("via"); via != "" {
		vu, err := url.Parse(via)
		if err != nil {
			return nil, errors.New("ssh dialer: invalid proxy URL")
		}
		pd, err := proxy.FromURL(vu, proxy.Direct)
		if err != nil {
			return nil, fmt.Errorf("ssh dialer: %w", err)
		}
		cd, ok := pd.(proxy.ContextDialer)
		if !ok {
			return nil, fmt.Errorf("ssh dialer: proxy scheme '%s' cannot dial with a context", vu.Scheme)
		}
		d.forward = cd
	}
	return d, nil
}

// guardedDialer dials directly, through the installed egress policy.
type guardedDialer struct{}

func (guardedDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return egress.DialContext(ctx, &net.Dialer{}, network, addr)
}

// Dial dials addr on network.
func (d *deadlineDialer) Dial(network, addr string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, addr)
}

// DialContext dials addr on network by the deadline and returns a
// connection whose reads and writes fail after it.
func (d *deadlineDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithDeadline(ctx, d.deadline)
	defer cancel()
	conn, err := d.forward.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if err := conn.SetDeadline(d.deadline); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}
