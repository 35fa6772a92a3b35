package gitfetch

import (
	"crypto/rand"
	"crypto/rsa"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"github.com/skeema/knownhosts"
	gossh "golang.org/x/crypto/ssh"

	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// testPEMs are a CA certificate and a client certificate with its key.
func testPEMs(t *testing.T) (ca, cert, key string) {
	t.Helper()
	srv := &gitserver.TLSServer{}
	caPEM, err := srv.CACert()
	must(t, err)
	certPEM, keyPEM, err := srv.ClientCert("test")
	must(t, err)
	return string(caPEM), string(certPEM), string(keyPEM)
}

func TestCredentialsFor(t *testing.T) {
	ca, cert, key := testPEMs(t)
	_, otherCert, _ := testPEMs(t)
	cases := []struct {
		name      string
		url       string
		data      map[string]string
		method    transport.AuthMethod
		ca        string
		cert, key string
		err       string
	}{
		{name: "no secret", url: "https://example.com/r.git"},
		{name: "basic auth", url: "https://example.com/r.git", data: map[string]string{"username": "u", "password": "p"},
			method: &githttp.BasicAuth{Username: "u", Password: "p"}},
		{name: "bearer token wins over basic auth keys", url: "https://example.com/r.git",
			data: map[string]string{"bearerToken": "tok", "username": "u", "password": "p"}, method: &githttp.TokenAuth{Token: "tok"}},
		{name: "bearer token over http", url: "http://example.com/r.git",
			data: map[string]string{"bearerToken": "tok"}, method: &githttp.TokenAuth{Token: "tok"}},
		{name: "ca.crt over caFile", url: "https://example.com/r.git", data: map[string]string{"ca.crt": ca, "caFile": "B"}, ca: ca},
		{name: "caFile", url: "https://example.com/r.git", data: map[string]string{"caFile": ca, "username": "u"}, ca: ca,
			method: &githttp.BasicAuth{Username: "u"}},
		{name: "client certificate", url: "https://example.com/r.git",
			data: map[string]string{"tls.crt": cert, "tls.key": key, "ca.crt": ca}, ca: ca, cert: cert, key: key},
		{name: "user-info of the URL", url: "https://u:p@example.com/r.git", method: &githttp.BasicAuth{Username: "u", Password: "p"}},
		{name: "secret over user-info", url: "https://x:y@example.com/r.git", data: map[string]string{"username": "u", "password": "p"},
			method: &githttp.BasicAuth{Username: "u", Password: "p"}},
		{name: "password without username", url: "https://example.com/r.git", data: map[string]string{"password": "p"},
			err: "invalid 'https' auth option: 'password' requires 'username' to be set"},
		{name: "token and user-info", url: "https://u:p@example.com/r.git", data: map[string]string{"bearerToken": "tok"},
			err: "basic auth and bearer token cannot be set at the same time"},
		{name: "certificate without key", url: "https://example.com/r.git", data: map[string]string{"tls.crt": cert},
			err: "secret contains 'tls.crt' but misses 'tls.key'"},
		{name: "key without certificate", url: "https://example.com/r.git", data: map[string]string{"tls.key": key},
			err: "secret contains 'tls.key' but misses 'tls.crt'"},
		{name: "key of another certificate", url: "https://example.com/r.git", data: map[string]string{"tls.crt": otherCert, "tls.key": key},
			err: "invalid TLS certificate and key pair: tls: private key does not match public key"},
		{name: "CA that is not PEM", url: "https://example.com/r.git", data: map[string]string{"ca.crt": "not a certificate"},
			err: "failed to parse CA certificate in 'ca.crt'"},
		{name: "TLS keys are not checked for http", url: "http://example.com/r.git", data: map[string]string{"ca.crt": "x", "tls.crt": "y"},
			ca: "x", cert: "y"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, err := url.Parse(tc.url)
			must(t, err)
			c, err := credentialsFor(u, bytesMap(tc.data))
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("error = %v, want %q", err, tc.err)
				}
				return
			}
			must(t, err)
			if !reflect.DeepEqual(c.method, tc.method) || string(c.ca) != tc.ca || string(c.cert) != tc.cert || string(c.key) != tc.key {
				t.Errorf("credentials = %#v, ca %q, cert %q, key %q; want %#v, ca %q, cert %q, key %q",
					c.method, c.ca, c.cert, c.key, tc.method, tc.ca, tc.cert, tc.key)
			}
			if c.ssh {
				t.Error("http credentials marked ssh")
			}
		})
	}
}

func TestSSHCredentials(t *testing.T) {
	key, pub, err := gitserver.NewSSHKey("")
	must(t, err)
	encrypted, _, err := gitserver.NewSSHKey("p4ss")
	must(t, err)
	_, hostEd25519, err := gitserver.NewSSHKey("")
	must(t, err)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	must(t, err)
	hostRSA, err := gossh.NewPublicKey(&rsaKey.PublicKey)
	must(t, err)
	hosts := knownhosts.Line([]string{"[example.com]:2222"}, hostEd25519) + "\n" +
		"# a comment\n" + knownhosts.Line([]string{"example.com"}, hostRSA) + "\n"
	cases := []struct {
		name  string
		url   string
		data  map[string]string
		user  string
		algos []string // host key algorithms offered
		err   string
	}{
		{name: "user from the URL, port", url: "ssh://flux@example.com:2222/r.git", data: map[string]string{"identity": string(key), "known_hosts": hosts},
			user: "flux", algos: []string{"ssh-ed25519"}},
		{name: "default user and port", url: "ssh://example.com/r.git", data: map[string]string{"identity": string(key), "known_hosts": hosts, "username": "ignored"},
			user: "git", algos: []string{"rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"}},
		{name: "encrypted identity with password", url: "ssh://git@example.com/r.git",
			data: map[string]string{"identity": string(encrypted), "password": "p4ss", "known_hosts": hosts, "identity.pub": "whatever"},
			user: "git", algos: []string{"rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"}},
		{name: "encrypted identity with the URL's password", url: "ssh://git:p4ss@example.com/r.git",
			data: map[string]string{"identity": string(encrypted), "known_hosts": hosts},
			user: "git", algos: []string{"rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"}},
		{name: "host without known key", url: "ssh://git@other.example.com/r.git",
			data: map[string]string{"identity": string(key), "known_hosts": hosts}, user: "git"},
		{name: "no secret", url: "ssh://git@example.com/r.git", err: "invalid 'ssh' auth option: 'identity' is required"},
		{name: "no identity", url: "ssh://git@example.com/r.git", data: map[string]string{"known_hosts": hosts},
			err: "invalid 'ssh' auth option: 'identity' is required"},
		{name: "no known_hosts", url: "ssh://git@example.com/r.git", data: map[string]string{"identity": string(key)},
			err: "invalid 'ssh' auth option: 'known_hosts' is required"},
		{name: "empty known_hosts", url: "ssh://git@example.com/r.git", data: map[string]string{"identity": string(key), "known_hosts": ""},
			err: "invalid 'ssh' auth option: 'known_hosts' is required"},
		{name: "identity that is not a key", url: "ssh://git@example.com/r.git", data: map[string]string{"identity": "nope", "known_hosts": hosts},
			err: "invalid 'identity': ssh: no key found"},
		{name: "encrypted identity without password", url: "ssh://git@example.com/r.git",
			data: map[string]string{"identity": string(encrypted), "known_hosts": hosts}, err: "invalid 'identity': "},
		{name: "encrypted identity with a wrong password", url: "ssh://git@example.com/r.git",
			data: map[string]string{"identity": string(encrypted), "password": "guess", "known_hosts": hosts}, err: "invalid 'identity': "},
		{name: "known_hosts that does not parse", url: "ssh://git@example.com/r.git",
			data: map[string]string{"identity": string(key), "known_hosts": "example.com ssh-ed25519 %%%\n"}, err: "invalid 'known_hosts': knownhosts: known_hosts:1: "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, err := url.Parse(tc.url)
			must(t, err)
			c, err := credentialsFor(u, bytesMap(tc.data))
			if tc.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
					t.Fatalf("error = %v, want %q", err, tc.err)
				}
				if strings.Contains(err.Error(), "p4ss") || strings.Contains(err.Error(), "PRIVATE KEY") {
					t.Errorf("error leaks a secret: %v", err)
				}
				return
			}
			must(t, err)
			keys, ok := c.method.(*gitssh.PublicKeys)
			if !ok || !c.ssh {
				t.Fatalf("method %T, ssh %v; want *ssh.PublicKeys", c.method, c.ssh)
			}
			if keys.User != tc.user || keys.HostKeyCallback == nil {
				t.Errorf("user %q, host key callback set %v; want %q and a callback", keys.User, keys.HostKeyCallback != nil, tc.user)
			}
			if tc.data["password"] == "" && !strings.Contains(tc.url, "p4ss") && string(keys.Signer.PublicKey().Marshal()) != string(pub.Marshal()) {
				t.Error("signer is not the identity")
			}
			if !reflect.DeepEqual(keys.HostKeyAlgorithms, tc.algos) {
				t.Errorf("host key algorithms %v, want %v", keys.HostKeyAlgorithms, tc.algos)
			}
		})
	}
}

func TestProxyOptions(t *testing.T) {
	cases := []struct {
		name   string
		data   map[string]string
		scheme string
		want   transport.ProxyOptions
		err    string
	}{
		{name: "address", data: map[string]string{"address": "http://proxy.example.com:3128"},
			want: transport.ProxyOptions{URL: "http://proxy.example.com:3128"}},
		{name: "credentials", data: map[string]string{"address": "https://proxy.example.com", "username": "u", "password": "p"},
			want: transport.ProxyOptions{URL: "https://proxy.example.com", Username: "u", Password: "p"}},
		{name: "credentials in the address", data: map[string]string{"address": "http://u:p@proxy.example.com"},
			want: transport.ProxyOptions{URL: "http://proxy.example.com", Username: "u", Password: "p"}},
		{name: "socks5 for ssh", scheme: "ssh", data: map[string]string{"address": "socks5://proxy.example.com:1080"},
			want: transport.ProxyOptions{URL: "socks5://proxy.example.com:1080"}},
		{name: "no address", data: map[string]string{"username": "u"}, err: "secret 'default/proxy': key 'address' not found"},
		{name: "empty address", data: map[string]string{"address": ""}, err: "secret 'default/proxy': proxy address is empty"},
		{name: "unsupported scheme", data: map[string]string{"address": "ftp://proxy.example.com"},
			err: "secret 'default/proxy': proxy URL must use one of the supported schemes (http, https, socks5), got 'ftp'"},
		{name: "no scheme", data: map[string]string{"address": "proxy.example.com:3128"},
			err: "secret 'default/proxy': proxy URL must use one of the supported schemes (http, https, socks5), got 'proxy.example.com'"},
		{name: "http proxy for ssh", scheme: "ssh", data: map[string]string{"address": "http://proxy.example.com"},
			err: "secret 'default/proxy': an ssh URL can only be fetched through a socks5 proxy, got 'http'"},
		{name: "no host", data: map[string]string{"address": "http://u:s3cr3t@"}, err: "secret 'default/proxy': proxy address 'http://' has no host"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			scheme := tc.scheme
			if scheme == "" {
				scheme = "https"
			}
			got, err := proxyOptions("default/proxy", bytesMap(tc.data), scheme)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("error = %v, want %q", err, tc.err)
				}
				return
			}
			must(t, err)
			if got != tc.want {
				t.Errorf("proxy options %+v, want %+v", got, tc.want)
			}
		})
	}
}

func bytesMap(m map[string]string) map[string][]byte {
	if m == nil {
		return nil
	}
	b := map[string][]byte{}
	for k, v := range m {
		b[k] = []byte(v)
	}
	return b
}
