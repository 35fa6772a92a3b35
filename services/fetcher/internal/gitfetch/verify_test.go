package gitfetch

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/hiddeco/sshsig"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// pgpKey is an OpenPGP key made for a test: the private entity signs, the
// armored public key ring goes into a Secret.
type pgpKey struct {
	entity *openpgp.Entity
	public string
	id     string
}

func newPGPKey(t *testing.T, name string) *pgpKey {
	t.Helper()
	e, err := openpgp.NewEntity(name, "", name+"@example.com", &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA})
	must(t, err)
	var b bytes.Buffer
	w, err := armor.Encode(&b, openpgp.PublicKeyType, nil)
	must(t, err)
	must(t, e.Serialize(w))
	must(t, w.Close())
	return &pgpKey{entity: e, public: b.String(), id: e.PrimaryKey.KeyIdString()}
}

// sshKey is an SSH key made for a test: it signs as git does with
// gpg.format=ssh; its authorized_keys line goes into a Secret.
type sshKey struct {
	signer      ssh.Signer
	authorized  string
	fingerprint string
}

func newSSHKey(t *testing.T) *sshKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	must(t, err)
	s, err := ssh.NewSignerFromKey(priv)
	must(t, err)
	return &sshKey{signer: s, authorized: string(ssh.MarshalAuthorizedKey(s.PublicKey())), fingerprint: ssh.FingerprintSHA256(s.PublicKey())}
}

// Sign makes an armored SSH signature in git's namespace (go-git's Signer).
func (k *sshKey) Sign(message io.Reader) ([]byte, error) {
	sig, err := sshsig.Sign(message, k.signer, sshsig.HashSHA512, "git")
	if err != nil {
		return nil, err
	}
	return sshsig.Armor(sig), nil
}

// signedRepo is a served repository whose commits and tags are made with
// go-git, so they can be signed without gpg or ssh-keygen.
type signedRepo struct {
	t    *testing.T
	repo *gitserver.Repo
	git  *git.Repository
}

func newSignedRepo(t *testing.T, root, name string) *signedRepo {
	t.Helper()
	repo, err := gitserver.NewRepo(root, name, t.TempDir(), "master")
	must(t, err)
	g, err := git.PlainOpen(repo.Dir)
	must(t, err)
	return &signedRepo{t: t, repo: repo, git: g}
}

var author = &object.Signature{Name: "Headwater", Email: "headwater@example.com"}

func now() *object.Signature {
	s := *author
	s.When = time.Now()
	return &s
}

// commit writes files and commits them signed with sign (a *pgpKey, a
// *sshKey or nil), pushes and returns the commit.
func (r *signedRepo) commit(files map[string]string, message string, sign any) string {
	r.t.Helper()
	must(r.t, r.repo.Write(files))
	wt, err := r.git.Worktree()
	must(r.t, err)
	must(r.t, wt.AddWithOptions(&git.AddOptions{All: true}))
	opts := &git.CommitOptions{Author: now()}
	switch k := sign.(type) {
	case *pgpKey:
		opts.SignKey = k.entity
	case *sshKey:
		opts.Signer = k
	}
	h, err := wt.Commit(message, opts)
	must(r.t, err)
	must(r.t, r.repo.Git("push", "--quiet", "--all", "origin"))
	return h.String()
}

// tag makes an annotated tag at commit signed with sign (as for commit),
// pushes it and returns the tag object's hash.
func (r *signedRepo) tag(name, commit string, sign any) string {
	r.t.Helper()
	tag := &object.Tag{Name: name, Tagger: *now(), Message: "release " + name + "\n",
		TargetType: plumbing.CommitObject, Target: plumbing.NewHash(commit)}
	switch k := sign.(type) {
	case *pgpKey:
		var b bytes.Buffer
		payload, err := encodeWithoutSignature(tag)
		must(r.t, err)
		must(r.t, openpgp.ArmoredDetachSign(&b, k.entity, bytes.NewReader(payload), nil))
		tag.PGPSignature = b.String()
	case *sshKey:
		payload, err := encodeWithoutSignature(tag)
		must(r.t, err)
		sig, err := k.Sign(bytes.NewReader(payload))
		must(r.t, err)
		tag.PGPSignature = string(sig)
	}
	obj := r.git.Storer.NewEncodedObject()
	must(r.t, tag.Encode(obj))
	h, err := r.git.Storer.SetEncodedObject(obj)
	must(r.t, err)
	must(r.t, r.git.Storer.SetReference(plumbing.NewHashReference(plumbing.NewTagReferenceName(name), h)))
	must(r.t, r.repo.Git("push", "--quiet", "origin", "refs/tags/"+name))
	return h.String()
}

// fakeSecrets serves Secrets from a fake API server.
func fakeSecrets(t *testing.T, data map[string]map[string]string) secrets.Reader {
	t.Helper()
	scheme := runtime.NewScheme()
	must(t, corev1.AddToScheme(scheme))
	b := fake.NewClientBuilder().WithScheme(scheme)
	for name, entries := range data {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Data: map[string][]byte{}}
		for k, v := range entries {
			s.Data[k] = []byte(v)
		}
		b = b.WithObjects(s)
	}
	return secrets.NewKube(b.Build())
}

// TestVerify fetches signed and unsigned commits and tags with every mode
// of spec.verify, against keys in Secrets.
//
//	master: c1 (PGP, trusted) <- c2 (PGP, other key) <- c3 (unsigned) <- c4 (SSH, trusted)
//	branches pgp, other, unsigned at c1, c2, c3
//	v1.0.0 -> c1 annotated, PGP trusted     v1.1.0 -> c2 annotated, PGP other key
//	v1.2.0 -> c3 annotated, unsigned        v1.3.0 -> c3 lightweight
//	v1.4.0 -> c3 annotated, PGP trusted     v2.0.0 -> c4 annotated, SSH trusted
func TestVerify(t *testing.T) {
	trusted, other := newPGPKey(t, "trusted"), newPGPKey(t, "other")
	trustedSSH, otherSSH := newSSHKey(t), newSSHKey(t)

	root := t.TempDir()
	r := newSignedRepo(t, root, "signed")
	c1 := r.commit(map[string]string{"README.md": "one"}, "signed by a trusted key", trusted)
	c2 := r.commit(map[string]string{"README.md": "two"}, "signed by another key", other)
	c3 := r.commit(map[string]string{"README.md": "three"}, "not signed", nil)
	c4 := r.commit(map[string]string{"README.md": "four"}, "signed with ssh", trustedSSH)
	for branch, c := range map[string]string{"pgp": c1, "other": c2, "unsigned": c3} {
		must(t, r.repo.Git("branch", branch, c))
	}
	must(t, r.repo.Git("push", "--quiet", "--all", "origin"))
	v100 := r.tag("v1.0.0", c1, trusted)
	v110 := r.tag("v1.1.0", c2, other)
	v120 := r.tag("v1.2.0", c3, nil)
	must(t, r.repo.Git("tag", "v1.3.0", c3))
	must(t, r.repo.Git("push", "--quiet", "origin", "refs/tags/v1.3.0"))
	v140 := r.tag("v1.4.0", c3, trusted)
	v200 := r.tag("v2.0.0", c4, trustedSSH)

	srv := &gitserver.Server{Root: root}
	must(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = srv.Stop() })
	url := srv.RepoURL("signed")

	src := &Source{Secrets: fakeSecrets(t, map[string]map[string]string{
		"trusted":   {"author.asc": trusted.public, "author.sshpub": "# trusted signers\n\n" + trustedSSH.authorized},
		"pgp-only":  {"author.asc": trusted.public},
		"ssh-other": {"author.asc": trusted.public, "other.sshpub": otherSSH.authorized},
		// A key ring that does not parse is skipped when another one does.
		"with-garbage": {"a.asc": "not a key ring", "b.asc": trusted.public},
		"garbage":      {"a.asc": "not a key ring"},
		"other":        {"other.asc": other.public},
		"empty":        {},
	})}

	commitOK := func(c, key string) string {
		return "verified signature of\n\t- commit '" + c + "' with key '" + key + "'"
	}
	commitFailed := func(c, cause string) string {
		return "signature verification of commit '" + c + "' failed: " + cause
	}
	const noPGPKey = "unable to verify Git commit: unable to verify payload with any of the given key rings: no matching key"

	cases := []struct {
		name   string
		mode   sourcev1.GitVerificationMode
		ref    sourcev1.GitRepositoryRef
		secret string
		// readme is the content fetched when verification succeeds.
		readme string
		// message is the SourceVerified message, reason its reason when
		// verification fails (Succeeded when it passes).
		message  string
		reason   string
		handling failure.Handling
	}{
		{name: "HEAD signed by a trusted key", mode: sourcev1.ModeGitHEAD, ref: sourcev1.GitRepositoryRef{Branch: "pgp"},
			secret: "trusted", readme: "one", message: commitOK(c1, trusted.id)},
		{name: "legacy mode head is HEAD", mode: "head", ref: sourcev1.GitRepositoryRef{Branch: "pgp"},
			secret: "pgp-only", readme: "one", message: commitOK(c1, trusted.id)},
		{name: "HEAD with an unparseable key ring beside the right one", mode: sourcev1.ModeGitHEAD, ref: sourcev1.GitRepositoryRef{Branch: "pgp"},
			secret: "with-garbage", readme: "one", message: commitOK(c1, trusted.id)},
		{name: "HEAD of a commit", mode: sourcev1.ModeGitHEAD, ref: sourcev1.GitRepositoryRef{Commit: c1, Branch: "master"},
			secret: "trusted", readme: "one", message: commitOK(c1, trusted.id)},
		{name: "HEAD signed with SSH by a trusted key", mode: sourcev1.ModeGitHEAD, ref: sourcev1.GitRepositoryRef{Branch: "master"},
			secret: "trusted", readme: "four", message: commitOK(c4, trustedSSH.fingerprint)},
		{name: "HEAD signed by another key", mode: sourcev1.ModeGitHEAD, ref: sourcev1.GitRepositoryRef{Branch: "other"},
			secret: "trusted", reason: InvalidCommitSignatureReason, handling: failure.Final, message: commitFailed(c2, noPGPKey)},
		{name: "HEAD not signed", mode: sourcev1.ModeGitHEAD, ref: sourcev1.GitRepositoryRef{Branch: "unsigned"},
			secret: "trusted", reason: InvalidCommitSignatureReason, handling: failure.Final,
			message: commitFailed(c3, "unable to verify Git commit: unable to verify payload: signature is empty")},
		{name: "HEAD signed with SSH, no SSH key trusted", mode: sourcev1.ModeGitHEAD, ref: sourcev1.GitRepositoryRef{Branch: "master"},
			secret: "pgp-only", reason: InvalidCommitSignatureReason, handling: failure.Final,
			message: commitFailed(c4, "unable to verify Git commit SSH signature: unable to verify payload with any of the given authorized keys: no matching key")},
		{name: "HEAD signed with SSH by another key", mode: sourcev1.ModeGitHEAD, ref: sourcev1.GitRepositoryRef{Branch: "master"},
			secret: "ssh-other", reason: InvalidCommitSignatureReason, handling: failure.Final,
			message: commitFailed(c4, "unable to verify Git commit SSH signature: unable to verify payload with any of the given authorized keys: no matching key")},
		{name: "Secret with only another key", mode: sourcev1.ModeGitHEAD, ref: sourcev1.GitRepositoryRef{Branch: "pgp"},
			secret: "other", reason: InvalidCommitSignatureReason, handling: failure.Final, message: commitFailed(c1, noPGPKey)},
		{name: "Secret without keys", mode: sourcev1.ModeGitHEAD, ref: sourcev1.GitRepositoryRef{Branch: "pgp"},
			secret: "empty", reason: InvalidCommitSignatureReason, handling: failure.Final, message: commitFailed(c1, noPGPKey)},
		{name: "Secret with no key ring that parses", mode: sourcev1.ModeGitHEAD, ref: sourcev1.GitRepositoryRef{Branch: "pgp"},
			secret: "garbage", reason: InvalidCommitSignatureReason, handling: failure.Final,
			message: commitFailed(c1, "unable to verify Git commit: unable to read armored key ring: ")},
		{name: "missing Secret", mode: sourcev1.ModeGitHEAD, ref: sourcev1.GitRepositoryRef{Branch: "pgp"},
			secret: "absent", reason: sourcev1.VerificationError, handling: failure.Transient,
			message: `PGP public keys secret error: secrets "absent" not found`},

		{name: "Tag signed by a trusted key", mode: sourcev1.ModeGitTag, ref: sourcev1.GitRepositoryRef{Tag: "v1.0.0"},
			secret: "trusted", readme: "one", message: "verified signature of\n\t- tag 'v1.0.0@" + v100 + "' with key '" + trusted.id + "'"},
		{name: "Tag verifies the tag only", mode: sourcev1.ModeGitTag, ref: sourcev1.GitRepositoryRef{Tag: "v1.4.0"},
			secret: "trusted", readme: "three", message: "verified signature of\n\t- tag 'v1.4.0@" + v140 + "' with key '" + trusted.id + "'"},
		{name: "Tag signed with SSH, by semver", mode: sourcev1.ModeGitTag, ref: sourcev1.GitRepositoryRef{SemVer: ">=2.0.0"},
			secret: "trusted", readme: "four", message: "verified signature of\n\t- tag 'v2.0.0@" + v200 + "' with key '" + trustedSSH.fingerprint + "'"},
		{name: "Tag named by ref.name", mode: sourcev1.ModeGitTag, ref: sourcev1.GitRepositoryRef{Name: "refs/tags/v1.0.0"},
			secret: "trusted", readme: "one", message: "verified signature of\n\t- tag 'v1.0.0@" + v100 + "' with key '" + trusted.id + "'"},
		{name: "Tag named with a commit", mode: sourcev1.ModeGitTag, ref: sourcev1.GitRepositoryRef{Name: "refs/tags/v1.0.0", Commit: c1},
			secret: "trusted", readme: "one", message: "verified signature of\n\t- tag 'v1.0.0@" + v100 + "' with key '" + trusted.id + "'"},
		{name: "Tag signed by another key", mode: sourcev1.ModeGitTag, ref: sourcev1.GitRepositoryRef{Tag: "v1.1.0"},
			secret: "trusted", reason: InvalidTagSignatureReason, handling: failure.Final,
			message: "signature verification of tag 'v1.1.0@" + v110 + "' failed: unable to verify Git tag: unable to verify payload with any of the given key rings: no matching key"},
		{name: "Tag not signed", mode: sourcev1.ModeGitTag, ref: sourcev1.GitRepositoryRef{Tag: "v1.2.0"},
			secret: "trusted", reason: InvalidGitObjectReason, handling: failure.Final,
			message: "cannot verify signature of tag 'v1.2.0@" + v120 + "' since it is not signed"},
		{name: "Tag lightweight", mode: sourcev1.ModeGitTag, ref: sourcev1.GitRepositoryRef{Tag: "v1.3.0"},
			secret: "trusted", reason: InvalidGitObjectReason, handling: failure.Final,
			message: "cannot verify signature of tag 'v1.3.0' since it is not signed"},
		{name: "Tag with a branch", mode: sourcev1.ModeGitTag, ref: sourcev1.GitRepositoryRef{Branch: "pgp"},
			secret: "trusted", reason: InvalidVerificationModeReason, handling: failure.Stalling,
			message: "cannot verify tag object's signature if a tag reference is not specified"},
		{name: "Tag with a peeled tag name", mode: sourcev1.ModeGitTag, ref: sourcev1.GitRepositoryRef{Name: "refs/tags/v1.0.0^{}"},
			secret: "trusted", reason: InvalidVerificationModeReason, handling: failure.Stalling,
			message: "cannot verify tag object's signature if a tag reference is not specified"},
		{name: "Tag with a missing Secret", mode: sourcev1.ModeGitTag, ref: sourcev1.GitRepositoryRef{Tag: "v1.0.0"},
			secret: "absent", reason: sourcev1.VerificationError, handling: failure.Transient,
			message: `PGP public keys secret error: secrets "absent" not found`},

		{name: "TagAndHEAD both signed", mode: sourcev1.ModeGitTagAndHEAD, ref: sourcev1.GitRepositoryRef{Tag: "v1.0.0"},
			secret: "trusted", readme: "one",
			message: "verified signature of\n\t- tag 'v1.0.0@" + v100 + "' with key '" + trusted.id + "'\n\t- commit '" + c1 + "' with key '" + trusted.id + "'"},
		{name: "TagAndHEAD signed with SSH", mode: sourcev1.ModeGitTagAndHEAD, ref: sourcev1.GitRepositoryRef{Tag: "v2.0.0"},
			secret: "trusted", readme: "four",
			message: "verified signature of\n\t- tag 'v2.0.0@" + v200 + "' with key '" + trustedSSH.fingerprint + "'\n\t- commit '" + c4 + "' with key '" + trustedSSH.fingerprint + "'"},
		{name: "TagAndHEAD with a signed tag of an unsigned commit", mode: sourcev1.ModeGitTagAndHEAD, ref: sourcev1.GitRepositoryRef{Tag: "v1.4.0"},
			secret: "trusted", reason: InvalidCommitSignatureReason, handling: failure.Final,
			message: commitFailed(c3, "unable to verify Git commit: unable to verify payload: signature is empty")},
		{name: "TagAndHEAD with a tag signed by another key", mode: sourcev1.ModeGitTagAndHEAD, ref: sourcev1.GitRepositoryRef{Tag: "v1.1.0"},
			secret: "trusted", reason: InvalidTagSignatureReason, handling: failure.Final,
			message: "signature verification of tag 'v1.1.0@" + v110 + "' failed: unable to verify Git tag: unable to verify payload with any of the given key rings: no matching key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ref := tc.ref
			req := request(url, &ref)
			req.GitRepository.Verification = &sourcev1.GitRepositoryVerification{Mode: tc.mode, SecretRef: meta.LocalObjectReference{Name: tc.secret}}
			ctx := context.Background()
			res, err := src.Resolve(ctx, req)
			if err != nil {
				t.Fatalf("resolve: %v", err)
			}
			content, err := res.Download(ctx, t.TempDir())
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("download: %v", err)
				}
				want := events.Verification{Mode: string(tc.mode), Verified: true, Reason: meta.SucceededReason, Message: tc.message}
				if tc.mode == "head" {
					want.Mode = string(sourcev1.ModeGitHEAD)
				}
				if content.Verification == nil || *content.Verification != want {
					t.Errorf("verification = %+v\nwant           %+v", content.Verification, want)
				}
				b, err := fs.ReadFile(content.Tree(), "README.md")
				if err != nil || string(b) != tc.readme {
					t.Errorf("README.md = %q (%v), want %q", b, err, tc.readme)
				}
				return
			}
			if content != nil {
				t.Fatalf("a failed verification gave content %+v", content)
			}
			checkVerificationFailure(t, err, string(tc.mode), tc.reason, tc.handling, tc.message)
		})
	}

	t.Run("no verification asked for", func(t *testing.T) {
		for _, v := range []*sourcev1.GitRepositoryVerification{nil, {SecretRef: meta.LocalObjectReference{Name: "absent"}}} {
			req := request(url, &sourcev1.GitRepositoryRef{Branch: "unsigned"})
			req.GitRepository.Verification = v
			res, err := src.Resolve(context.Background(), req)
			must(t, err)
			content, err := res.Download(context.Background(), t.TempDir())
			must(t, err)
			if content.Verification != nil {
				t.Errorf("verify %+v: verification = %+v, want none", v, content.Verification)
			}
		}
	})

	t.Run("no cluster to read the Secret from", func(t *testing.T) {
		req := request(url, &sourcev1.GitRepositoryRef{Branch: "pgp"})
		req.GitRepository.Verification = &sourcev1.GitRepositoryVerification{Mode: sourcev1.ModeGitHEAD, SecretRef: meta.LocalObjectReference{Name: "keys"}}
		for _, s := range []secrets.Reader{nil, secrets.Unavailable{Err: errors.New("no kubeconfig")}} {
			res, err := (&Source{Secrets: s}).Resolve(context.Background(), req)
			must(t, err)
			_, err = res.Download(context.Background(), t.TempDir())
			checkVerificationFailure(t, err, "HEAD", sourcev1.VerificationError, failure.Transient,
				"PGP public keys secret error: no Kubernetes API server is configured")
		}
	})
}

// TestVerifyGitSSHSignature verifies a commit and a tag signed by git
// itself with an SSH key (gpg.format=ssh), so the payload Headwater checks
// is the one real git signs.
func TestVerifyGitSSHSignature(t *testing.T) {
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		t.Skip("ssh-keygen is not installed: git cannot make SSH signatures")
	}
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id_ed25519")
	out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "signer", "-f", keyFile).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	pub, err := os.ReadFile(keyFile + ".pub")
	must(t, err)
	key, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	must(t, err)

	root := t.TempDir()
	repo, err := gitserver.NewRepo(root, "gitsigned", t.TempDir(), "master")
	must(t, err)
	must(t, repo.Git("config", "gpg.format", "ssh"))
	must(t, repo.Git("config", "user.signingkey", keyFile))
	must(t, repo.Write(map[string]string{"README.md": "signed by git"}))
	must(t, repo.Git("add", "--all"))
	must(t, repo.Git("commit", "--quiet", "-S", "-m", "signed by git"))
	must(t, repo.Git("tag", "-s", "v1.0.0", "-m", "signed tag"))
	must(t, repo.Git("push", "--quiet", "--all", "origin"))
	must(t, repo.Git("push", "--quiet", "origin", "refs/tags/v1.0.0"))
	c, err := repo.Output("rev-parse", "HEAD")
	must(t, err)
	tagHash, err := repo.Output("rev-parse", "refs/tags/v1.0.0")
	must(t, err)

	srv := &gitserver.Server{Root: root}
	must(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = srv.Stop() })
	src := &Source{Secrets: fakeSecrets(t, map[string]map[string]string{"keys": {"signer.sshpub": string(pub)}})}

	req := request(srv.RepoURL("gitsigned"), &sourcev1.GitRepositoryRef{Tag: "v1.0.0"})
	req.GitRepository.Verification = &sourcev1.GitRepositoryVerification{Mode: sourcev1.ModeGitTagAndHEAD, SecretRef: meta.LocalObjectReference{Name: "keys"}}
	res, err := src.Resolve(context.Background(), req)
	must(t, err)
	content, err := res.Download(context.Background(), t.TempDir())
	if err != nil {
		t.Fatalf("download: %v", err)
	}
	fp := ssh.FingerprintSHA256(key)
	want := "verified signature of\n\t- tag 'v1.0.0@" + tagHash + "' with key '" + fp + "'\n\t- commit '" + c + "' with key '" + fp + "'"
	if content.Verification == nil || !content.Verification.Verified || content.Verification.Message != want {
		t.Errorf("verification = %+v, want verified with message %q", content.Verification, want)
	}
}

func TestSignatureFormat(t *testing.T) {
	cases := map[string]string{
		"":                                     formatEmpty,
		"  \n-----BEGIN PGP SIGNATURE-----\n":  formatOpenPGP,
		"-----BEGIN SSH SIGNATURE-----\nabc":   formatSSH,
		"-----BEGIN SIGNED MESSAGE-----\nabc":  formatX509,
		"-----BEGIN PGP MESSAGE-----\nabc":     formatUnknown,
		"something else entirely, not armored": formatUnknown,
	}
	for sig, want := range cases {
		if got := signatureFormat(sig); got != want {
			t.Errorf("signatureFormat(%q) = %q, want %q", sig, got, want)
		}
	}
	// A signature of another format is named, not tried with the keys.
	_, err := verifyObject("commit", "-----BEGIN SIGNED MESSAGE-----\nabc\n-----END SIGNED MESSAGE-----\n", []byte("payload"), trustedKeys{})
	want := "unable to verify Git commit: unable to verify openPGP signature, detected signature format: x509: signature format mismatch"
	if err == nil || err.Error() != want {
		t.Errorf("x509 signature: error %v, want %q", err, want)
	}
	_, err = verifyObject("tag", "-----BEGIN SSH SIGNATURE-----\nnot base64\n-----END SSH SIGNATURE-----\n", []byte("payload"), trustedKeys{})
	if err == nil || !strings.HasPrefix(err.Error(), "unable to verify Git tag SSH signature: unable to unarmor SSH signature: ") {
		t.Errorf("bad SSH armor: error %v", err)
	}
	_, err = verifySSH("-----BEGIN SSH SIGNATURE-----\n", []byte("payload"), []string{"ssh-ed25519 not-a-key"})
	if err == nil || !strings.Contains(err.Error(), "unable to unarmor SSH signature") {
		t.Errorf("bad SSH signature: error %v", err)
	}
}

// checkVerificationFailure asserts err is a failed verification: a
// *failure.Error with reason, handling and a message starting with want,
// whose Failure sets no condition and carries a Verification that is not
// verified, with the same reason and message.
func checkVerificationFailure(t *testing.T, err error, mode, reason string, handling failure.Handling, want string) {
	t.Helper()
	var ferr *failure.Error
	if !errors.As(err, &ferr) {
		t.Fatalf("error = %v (%T), want a *failure.Error", err, err)
	}
	f := ferr.Data()
	if f.Condition != "" || f.Reason != reason || ferr.Handling != handling || !strings.HasPrefix(f.Message, want) {
		t.Errorf("failure = %+v, handling %d\nwant reason %s, handling %d, no condition, message starting with %q",
			f, ferr.Handling, reason, handling, want)
	}
	if f.Stalled != (handling == failure.Stalling) {
		t.Errorf("failure stalled = %v, want %v", f.Stalled, handling == failure.Stalling)
	}
	if mode == "head" {
		mode = string(sourcev1.ModeGitHEAD)
	}
	var unverified *source.Unverified
	var v *events.Verification
	if errors.As(err, &unverified) {
		v = unverified.Verification
	}
	if v == nil || v.Verified || v.Mode != mode || v.Reason != reason || v.Message != f.Message {
		t.Errorf("verification = %+v, want not verified, mode %s, reason %s, message %q", v, mode, reason, f.Message)
	}
}
