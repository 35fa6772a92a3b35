package gitfetch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/hiddeco/sshsig"
	"golang.org/x/crypto/ssh"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// Reasons of a failed spec.verify, Flux's (GitRepositoryReconciler.verifySignature).
const (
	// InvalidCommitSignatureReason: the commit's signature is missing or is
	// not made by a trusted key.
	InvalidCommitSignatureReason = "InvalidCommitSignature"
	// InvalidTagSignatureReason: the tag's signature is not made by a
	// trusted key.
	InvalidTagSignatureReason = "InvalidTagSignature"
	// InvalidGitObjectReason: the tag to verify is not signed.
	InvalidGitObjectReason = "InvalidGitObject"
	// InvalidVerificationModeReason: the mode verifies a tag but spec.ref
	// names none.
	InvalidVerificationModeReason = "InvalidVerificationMode"
)

// sshKeySuffix marks the entries of the verification Secret that hold SSH
// public keys (authorized_keys lines); every other entry is an armored
// OpenPGP key ring (Flux documents the ".asc" suffix for those).
const sshKeySuffix = ".sshpub"

// sshNamespace is the namespace git signs objects in (gpg.format=ssh).
const sshNamespace = "git"

// Signature formats, as git and Flux name them.
const (
	formatOpenPGP = "openpgp"
	formatSSH     = "ssh"
	formatX509    = "x509"
	formatEmpty   = "empty"
	formatUnknown = "unknown"
)

// Causes of a signature that does not verify, in Flux's words.
var (
	errSignatureEmpty  = errors.New("signature is empty")
	errPayloadEmpty    = errors.New("payload is empty")
	errSignatureFormat = errors.New("signature format mismatch")
	errNoMatchingKey   = errors.New("no matching key")
)

// verification is a spec.verify to apply to a download.
type verification struct {
	mode      sourcev1.GitVerificationMode
	namespace string
	secret    string
	source    *Source
}

// verification returns what spec.verify asks for, or nil when it asks for
// nothing: unset, or without a mode (as in Flux, which relies on the API
// server defaulting the mode to HEAD). Nothing is read yet: the Secret is
// read only once there is something to verify, so an unchanged revision
// needs no keys.
func (s *Source) verification(req *events.FetchRequested) *verification {
	v := req.GitRepository.Verification
	if v == nil || v.Mode == "" {
		return nil
	}
	return &verification{mode: v.GetMode(), namespace: req.Job.Object.Namespace, secret: v.SecretRef.Name, source: s}
}

// verifySignatures checks the signatures spec.verify asks for, as Flux does
// after its checkout: the tag that spec.ref names (modes Tag and
// TagAndHEAD), then the commit (modes HEAD and TagAndHEAD), with the keys
// of the Secret spec.verify.secretRef names. It returns nil when there is
// nothing to verify, and a *failure.Error carrying the failed Verification
// when a signature does not check out.
func (r *resolved) verifySignatures(ctx context.Context, repo *git.Repository, commit *object.Commit) (*events.Verification, error) {
	v := r.verify
	if v == nil {
		return nil, nil
	}
	keys, err := v.keys(ctx)
	if err != nil {
		return nil, v.failed(sourcev1.VerificationError, failure.Transient, fmt.Errorf("PGP public keys secret error: %w", err))
	}

	var message strings.Builder
	if v.mode == sourcev1.ModeGitTag || v.mode == sourcev1.ModeGitTagAndHEAD {
		tag, err := r.referencingTag(repo)
		if err != nil {
			return nil, err
		}
		switch {
		case tag == nil:
			// spec.ref names no tag: nothing but a spec change helps.
			return nil, v.failed(InvalidVerificationModeReason, failure.Stalling,
				errors.New("cannot verify tag object's signature if a tag reference is not specified"))
		case tag.signature == "":
			// The tag may be replaced by a signed one upstream: not stalled.
			return nil, v.failed(InvalidGitObjectReason, failure.Final,
				fmt.Errorf("cannot verify signature of tag '%s' since it is not signed", tag))
		}
		key, err := verifyObject("tag", tag.signature, tag.payload, keys)
		if err != nil {
			return nil, v.failed(InvalidTagSignatureReason, failure.Final,
				fmt.Errorf("signature verification of tag '%s' failed: %w", tag, err))
		}
		fmt.Fprintf(&message, "verified signature of\n\t- tag '%s' with key '%s'", tag, key)
	}
	if v.mode == sourcev1.ModeGitHEAD || v.mode == sourcev1.ModeGitTagAndHEAD {
		payload, err := encodeWithoutSignature(commit)
		if err != nil {
			return nil, source.Failed(sourcev1.GitOperationFailedReason, checkoutPrefix+"unable to encode commit '%s': %w", commit.Hash, err)
		}
		key, err := verifyObject("commit", commit.PGPSignature, payload, keys)
		if err != nil {
			return nil, v.failed(InvalidCommitSignatureReason, failure.Final,
				fmt.Errorf("signature verification of commit '%s' failed: %w", commit.Hash, err))
		}
		if message.Len() == 0 {
			message.WriteString("verified signature of")
		}
		fmt.Fprintf(&message, "\n\t- commit '%s' with key '%s'", commit.Hash, key)
	}
	return &events.Verification{Mode: string(v.mode), Verified: true, Reason: meta.SucceededReason, Message: message.String()}, nil
}

// failed is a failed verification: no negative condition, SourceVerified
// False with the reason and the message.
func (v *verification) failed(reason string, handling failure.Handling, err error) *failure.Error {
	return source.VerificationFailed(string(v.mode), handling, reason, err)
}

// trustedKeys are the public keys of a verification Secret.
type trustedKeys struct {
	// pgp are armored OpenPGP key rings, ssh authorized_keys texts; both
	// in the order of their Secret entries' names.
	pgp, ssh []string
}

// keys reads the Secret spec.verify names.
func (v *verification) keys(ctx context.Context) (trustedKeys, error) {
	if v.source.Secrets == nil {
		return trustedKeys{}, errors.New("no Kubernetes API server is configured")
	}
	data, err := v.source.Secrets.Get(ctx, v.namespace, v.secret)
	if err != nil {
		return trustedKeys{}, err
	}
	return keysFrom(data), nil
}

// keysFrom sorts a Secret's entries into OpenPGP key rings and SSH keys.
func keysFrom(data map[string][]byte) trustedKeys {
	names := make([]string, 0, len(data))
	for name := range data {
		names = append(names, name)
	}
	slices.Sort(names)
	var k trustedKeys
	for _, name := range names {
		if strings.HasSuffix(name, sshKeySuffix) {
			k.ssh = append(k.ssh, string(data[name]))
		} else {
			k.pgp = append(k.pgp, string(data[name]))
		}
	}
	return k
}

// verifyObject verifies the signature of a commit or tag (what) over
// payload: an SSH signature with the SSH keys, any other with the OpenPGP
// key rings. It returns the key that made the signature: the OpenPGP
// primary key's ID, or the SSH key's SHA256 fingerprint.
func verifyObject(what, signature string, payload []byte, keys trustedKeys) (string, error) {
	if signatureFormat(signature) == formatSSH {
		key, err := verifySSH(signature, payload, keys.ssh)
		if err != nil {
			return "", fmt.Errorf("unable to verify Git %s SSH signature: %w", what, err)
		}
		return key, nil
	}
	key, err := verifyPGP(signature, payload, keys.pgp)
	if err != nil {
		return "", fmt.Errorf("unable to verify Git %s: %w", what, err)
	}
	return key, nil
}

// verifyPGP verifies an armored detached OpenPGP signature with the first
// key ring holding its key. Key rings that do not parse are skipped, and
// reported only when none parses.
func verifyPGP(signature string, payload []byte, keyRings []string) (string, error) {
	signature = strings.TrimSpace(signature)
	switch {
	case signature == "":
		return "", fmt.Errorf("unable to verify payload: %w", errSignatureEmpty)
	case len(payload) == 0:
		return "", fmt.Errorf("unable to verify payload: %w", errPayloadEmpty)
	case signatureFormat(signature) != formatOpenPGP:
		return "", fmt.Errorf("unable to verify openPGP signature, detected signature format: %s: %w",
			signatureFormat(signature), errSignatureFormat)
	}
	var readErr error
	attempted := false
	for _, r := range keyRings {
		keyring, err := openpgp.ReadArmoredKeyRing(strings.NewReader(r))
		if err != nil {
			if readErr == nil {
				readErr = fmt.Errorf("unable to read armored key ring: %w", err)
			}
			continue
		}
		attempted = true
		signer, err := openpgp.CheckArmoredDetachedSignature(keyring, bytes.NewReader(payload), strings.NewReader(signature), nil)
		if err == nil && signer != nil && signer.PrimaryKey != nil {
			return signer.PrimaryKey.KeyIdString(), nil
		}
	}
	if !attempted && readErr != nil {
		return "", readErr
	}
	return "", fmt.Errorf("unable to verify payload with any of the given key rings: %w", errNoMatchingKey)
}

// verifySSH verifies an armored SSH signature (git's gpg.format=ssh, in
// the "git" namespace) with the first authorized key that made it.
// Authorized keys texts that do not parse are skipped, and reported only
// when none parses.
func verifySSH(signature string, payload []byte, authorizedKeys []string) (string, error) {
	switch {
	case strings.TrimSpace(signature) == "":
		return "", fmt.Errorf("unable to verify payload: %w", errSignatureEmpty)
	case len(payload) == 0:
		return "", fmt.Errorf("unable to verify payload: %w", errPayloadEmpty)
	}
	sig, err := sshsig.Unarmor([]byte(signature))
	if err != nil {
		return "", fmt.Errorf("unable to unarmor SSH signature: %w", err)
	}
	var parseErr error
	attempted := false
	for _, text := range authorizedKeys {
		keys, err := parseAuthorizedKeys(text)
		if err != nil {
			if parseErr == nil {
				parseErr = fmt.Errorf("unable to parse authorized keys: %w", err)
			}
			continue
		}
		attempted = true
		for _, key := range keys {
			if sshsig.Verify(bytes.NewReader(payload), sig, key, sig.HashAlgorithm, sshNamespace) == nil {
				return ssh.FingerprintSHA256(key), nil
			}
		}
	}
	if !attempted && parseErr != nil {
		return "", parseErr
	}
	return "", fmt.Errorf("unable to verify payload with any of the given authorized keys: %w", errNoMatchingKey)
}

// parseAuthorizedKeys parses authorized_keys lines, skipping blank lines
// and comments.
func parseAuthorizedKeys(text string) ([]ssh.PublicKey, error) {
	var keys []ssh.PublicKey
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			return nil, fmt.Errorf("unable to parse authorized key: %w", err)
		}
		keys = append(keys, key)
	}
	return keys, nil
}

// signatureFormat tells a signature's format by its armor, as git does.
func signatureFormat(signature string) string {
	s := strings.TrimSpace(signature)
	switch {
	case s == "":
		return formatEmpty
	case strings.HasPrefix(s, "-----BEGIN PGP SIGNATURE-----"):
		return formatOpenPGP
	case strings.HasPrefix(s, "-----BEGIN SSH SIGNATURE-----"):
		return formatSSH
	case strings.HasPrefix(s, "-----BEGIN SIGNED MESSAGE-----"):
		return formatX509
	default:
		return formatUnknown
	}
}

// gitTag is the tag a spec.ref names: an annotated tag object, or a
// lightweight tag (no hash, no signature).
type gitTag struct {
	name      string
	hash      string
	signature string
	payload   []byte
}

// String is Flux's "<name>@<tag object hash>", or the name alone for a
// lightweight tag.
func (t *gitTag) String() string {
	if t.hash == "" {
		return t.name
	}
	return t.name + "@" + t.hash
}

// referencingTag returns the tag spec.ref names, fetched at targetRef: for
// ref.tag and ref.semver, and for a ref.name under refs/tags/ unless it
// ends in "^{}" (which names the commit, not the tag object). It returns
// nil for every other reference.
func (r *resolved) referencingTag(repo *git.Repository) (*gitTag, error) {
	var name plumbing.ReferenceName
	switch r.ref.kind {
	case refTag, refSemVer:
		name = plumbing.ReferenceName(r.reference)
	case refName, refCommit:
		name = plumbing.ReferenceName(r.ref.name)
		if strings.HasSuffix(r.ref.name, tagDereferenceSuffix) {
			return nil, nil
		}
	}
	if !name.IsTag() {
		return nil, nil
	}
	tip, err := repo.Reference(targetRef, true)
	if err != nil {
		return nil, source.Failed(sourcev1.GitOperationFailedReason,
			checkoutPrefix+"unable to find reference for tag '%s': %w", name.Short(), err)
	}
	obj, err := repo.TagObject(tip.Hash())
	switch {
	case errors.Is(err, plumbing.ErrObjectNotFound):
		return &gitTag{name: name.Short()}, nil
	case err != nil:
		return nil, source.Failed(sourcev1.GitOperationFailedReason,
			checkoutPrefix+"unable to resolve tag object for tag '%s' with hash '%s': %w", name.Short(), tip.Hash(), err)
	}
	payload, err := encodeWithoutSignature(obj)
	if err != nil {
		return nil, source.Failed(sourcev1.GitOperationFailedReason,
			checkoutPrefix+"unable to encode tag '%s': %w", obj.Name, err)
	}
	return &gitTag{name: obj.Name, hash: obj.Hash.String(), signature: obj.PGPSignature, payload: payload}, nil
}

// encodeWithoutSignature returns the bytes a commit's or tag's signature
// signs.
func encodeWithoutSignature(o interface {
	EncodeWithoutSignature(plumbing.EncodedObject) error
}) ([]byte, error) {
	encoded := &plumbing.MemoryObject{}
	if err := o.EncodeWithoutSignature(encoded); err != nil {
		return nil, err
	}
	rd, err := encoded.Reader()
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	return io.ReadAll(rd)
}
