package gitserver

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	gliderssh "github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// SSHServer serves every bare repository under Root over SSH, at
// ssh://git@<addr>/<name>.git, by running the real git-upload-pack and
// git-receive-pack for clients that log in with an authorized public key.
type SSHServer struct {
	// Root holds the bare repositories, <name>.git.
	Root string
	// AuthorizedKeys are the public keys allowed to log in, whatever the
	// user name.
	AuthorizedKeys []gossh.PublicKey
	// HostKey is the server's host key; Start generates an ed25519 key
	// when it is nil.
	HostKey gossh.Signer

	srv  *gliderssh.Server
	addr string
}

// Start serves Root on addr ("127.0.0.1:0" picks a free port) until Stop.
func (s *SSHServer) Start(addr string) error {
	if s.HostKey == nil {
		_, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return fmt.Errorf("git ssh server: generate host key: %w", err)
		}
		if s.HostKey, err = gossh.NewSignerFromKey(key); err != nil {
			return fmt.Errorf("git ssh server: host key: %w", err)
		}
	}
	s.srv = &gliderssh.Server{
		Handler: s.serve,
		PublicKeyHandler: func(_ gliderssh.Context, key gliderssh.PublicKey) bool {
			for _, k := range s.AuthorizedKeys {
				if gliderssh.KeysEqual(k, key) {
					return true
				}
			}
			return false
		},
	}
	s.srv.AddHostKey(s.HostKey)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("git ssh server: %w", err)
	}
	s.addr = ln.Addr().String()
	go func() { _ = s.srv.Serve(ln) }()
	return nil
}

// Addr is the host:port the server listens on.
func (s *SSHServer) Addr() string { return s.addr }

// RepoURL is the clone URL of a repository, e.g.
// ssh://git@127.0.0.1:41234/podinfo.git.
func (s *SSHServer) RepoURL(name string) string { return "ssh://git@" + s.addr + "/" + name + ".git" }

// KnownHosts is the known_hosts line that trusts the server's host key at
// its address, e.g. "[127.0.0.1]:41234 ssh-ed25519 AAAA...".
func (s *SSHServer) KnownHosts() string {
	return knownhosts.Line([]string{knownhosts.Normalize(s.addr)}, s.HostKey.PublicKey()) + "\n"
}

// Stop stops serving and closes every connection.
func (s *SSHServer) Stop() error {
	if s.srv == nil {
		return nil
	}
	if err := s.srv.Close(); err != nil && !errors.Is(err, gliderssh.ErrServerClosed) {
		return err
	}
	return nil
}

// serve runs the git command a session asks for on the repository it names.
func (s *SSHServer) serve(sess gliderssh.Session) {
	args := sess.Command()
	if len(args) != 2 || (args[0] != "git-upload-pack" && args[0] != "git-receive-pack") {
		fmt.Fprintf(sess.Stderr(), "only git-upload-pack and git-receive-pack are served, not %q\n", strings.Join(args, " "))
		_ = sess.Exit(1)
		return
	}
	// The path is relative to Root whether or not it starts with a slash,
	// and cannot leave it.
	repo := filepath.Join(s.Root, filepath.FromSlash(path.Clean("/"+args[1])))
	cmd := exec.CommandContext(sess.Context(), args[0], repo)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		_ = sess.Exit(1)
		return
	}
	cmd.Stdout, cmd.Stderr = sess, sess.Stderr()
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(sess.Stderr(), "%s: %v\n", args[0], err)
		_ = sess.Exit(1)
		return
	}
	// Copy the client's input until the command has exited; the client
	// may keep its side open after the command needs no more.
	go func() {
		_, _ = io.Copy(stdin, sess)
		_ = stdin.Close()
	}()
	code := 0
	if err := cmd.Wait(); err != nil {
		code = 1
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() > 0 {
			code = ee.ExitCode()
		}
	}
	_ = sess.Exit(code)
}

// NewSSHKey generates an ed25519 key pair for an SSH client and returns the
// private key in OpenSSH PEM format, encrypted with passphrase when it is
// not empty, and the public key to authorize.
func NewSSHKey(passphrase string) (privatePEM []byte, public gossh.PublicKey, err error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate ssh key: %w", err)
	}
	public, err = gossh.NewPublicKey(pub)
	if err != nil {
		return nil, nil, fmt.Errorf("ssh public key: %w", err)
	}
	var block *pem.Block
	if passphrase == "" {
		block, err = gossh.MarshalPrivateKey(key, "headwater test key")
	} else {
		block, err = gossh.MarshalPrivateKeyWithPassphrase(key, "headwater test key", []byte(passphrase))
	}
	if err != nil {
		return nil, nil, fmt.Errorf("marshal ssh key: %w", err)
	}
	return pem.EncodeToMemory(block), public, nil
}
