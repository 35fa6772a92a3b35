// Package cosign verifies cosign signatures of OCI artifacts, as Flux does
// for an OCIRepository's or an OCI HelmChart's spec.verify: with the
// public keys of a secretRef (offline, no transparency log), or keyless,
// with a Sigstore trusted root and the matchOIDCIdentity regular
// expressions.
//
// Two formats are read. Cosign v2's: a signature image tagged
// "sha256-<hex of the signed digest>.sig" in the artifact's repository
// holds one simple-signing payload per layer, its signature (and, keyless,
// the certificate and transparency log entry) in annotations; the artifact
// is verified when one payload names its digest and its signature
// verifies. Cosign v3's: Sigstore bundles attached to the digest as OCI
// referrers (see bundle.go). Bundles are tried first, then the ".sig"
// image.
package cosign

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/verify"
)

// Provider is spec.verify.provider for cosign.
const Provider = "cosign"

// Cosign's signature format.
const (
	simpleSigningMediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	signatureAnnotation    = "dev.cosignproject.cosign/signature"
	// maxPayloadSize bounds a signature payload read into memory.
	maxPayloadSize = 1 << 20
	// maxSignatures bounds the signatures of one artifact looked at.
	maxSignatures = 64
)

var (
	// ErrNoKeys is returned by NewVerifier for a Secret without *.pub keys.
	ErrNoKeys = errors.New("no public keys ('*.pub') found")
	// ErrNoMatch is returned by Verify when no signature of the digest
	// verifies with the keys (none may exist).
	ErrNoMatch = errors.New("no matching signatures were found")
)

// Verifier checks cosign signatures with public keys, or keyless.
type Verifier struct {
	// keys are the public keys, by their Secret entry's name; nil for a
	// keyless verifier.
	keys map[string]crypto.PublicKey
	// trusted is the Sigstore trusted root of a keyless verifier.
	trusted root.TrustedMaterial
	// identities are the certificate identities a keyless signature must
	// match one of; any when empty.
	identities verify.CertificateIdentities
}

// NewVerifier reads the public keys of a Secret's *.pub entries (PEM,
// PKIX, as `cosign generate-key-pair` writes them: ECDSA, RSA or
// Ed25519). It fails with ErrNoKeys when there are none, and names the
// entry that is no such key.
func NewVerifier(data map[string][]byte) (*Verifier, error) {
	v := &Verifier{keys: map[string]crypto.PublicKey{}}
	for k, b := range data {
		if !strings.HasSuffix(k, ".pub") {
			continue
		}
		key, err := parsePublicKey(b)
		if err != nil {
			return nil, fmt.Errorf("key '%s': %w", k, err)
		}
		v.keys[k] = key
	}
	if len(v.keys) == 0 {
		return nil, ErrNoKeys
	}
	return v, nil
}

// parsePublicKey parses a PEM public key.
func parsePublicKey(b []byte) (crypto.PublicKey, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("not a PEM public key")
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	switch key.(type) {
	case *ecdsa.PublicKey, *rsa.PublicKey, ed25519.PublicKey:
		return key, nil
	}
	return nil, fmt.Errorf("unsupported public key type %T", key)
}

// Verify checks that a signature of digest, an artifact of repo, verifies
// (with one of the keys, or keyless); opts reach the registry (auth,
// transport). Cosign v3 bundles are tried first, then the ".sig" image.
// It returns a *NoMatchError (errors.Is ErrNoMatch) when no signature
// verifies, or the registry's error as a *SignaturesError when the
// signatures cannot be read (for the caller to classify: a registry that
// answers 404 for the signature image means nothing signed the digest).
func (v *Verifier) Verify(ctx context.Context, repo name.Repository, digest v1.Hash, opts ...remote.Option) error {
	opts = append(slices.Clip(opts), remote.WithContext(ctx))
	found, reasons, err := bundles(repo, digest, opts)
	if err != nil {
		return err
	}
	for _, b := range found {
		err := v.verifyBundle(b, digest)
		if err == nil {
			return nil
		}
		reasons = append(reasons, err.Error())
	}
	sigTag := repo.Tag(strings.Replace(digest.String(), ":", "-", 1) + ".sig")
	img, err := remote.Image(sigTag, opts...)
	if err != nil {
		if len(found) > 0 {
			return &NoMatchError{Reasons: reasons}
		}
		return &SignaturesError{Err: err}
	}
	m, err := img.Manifest()
	if err != nil {
		return fmt.Errorf("failed to parse signatures: %w", err)
	}
	for i, l := range m.Layers {
		if i >= maxSignatures {
			break
		}
		sig := l.Annotations[signatureAnnotation]
		if l.MediaType != simpleSigningMediaType || sig == "" || l.Size > maxPayloadSize {
			continue
		}
		payload, err := readPayload(img, l.Digest)
		if err != nil {
			return &SignaturesError{Err: fmt.Errorf("failed to get signature payload: %w", err)}
		}
		if !v.keyless() {
			if v.verifies(payload, sig) && signs(payload, digest) {
				return nil
			}
			continue
		}
		if err := v.verifyKeyless(l.Annotations, payload, sig, digest); err != nil {
			reasons = append(reasons, err.Error())
			continue
		}
		return nil
	}
	return &NoMatchError{Reasons: reasons}
}

// verifyKeyless checks a keyless ".sig" layer: its certificate, log
// entry and signature of payload, and that payload names digest.
func (v *Verifier) verifyKeyless(annotations map[string]string, payload []byte, sig string, digest v1.Hash) error {
	raw, err := base64.StdEncoding.DecodeString(sig)
	if err != nil {
		return fmt.Errorf("invalid signature: %w", err)
	}
	e, err := newSigEntity(annotations, payload, raw)
	if err != nil {
		return err
	}
	if err := v.verifyEntity(e, verify.WithArtifact(bytes.NewReader(payload))); err != nil {
		return err
	}
	if !signs(payload, digest) {
		return fmt.Errorf("signature payload does not name digest %s", digest)
	}
	return nil
}

// NoMatchError is the failure of an artifact none of whose signatures
// verifies; it is ErrNoMatch.
type NoMatchError struct {
	// Reasons say why each signature that was looked at failed, where
	// there is more to say than that it was not signed by the keys.
	Reasons []string
}

// Error says that no signature verifies, and why.
func (e *NoMatchError) Error() string {
	return ErrNoMatch.Error() + e.Detail()
}

// Detail is ": " and the reasons, each once, or "" without them.
func (e *NoMatchError) Detail() string {
	var seen []string
	for _, r := range e.Reasons {
		if !slices.Contains(seen, r) {
			seen = append(seen, r)
		}
	}
	if len(seen) == 0 {
		return ""
	}
	return ": " + strings.Join(seen, "; ")
}

// Is reports whether target is ErrNoMatch.
func (e *NoMatchError) Is(target error) bool { return target == ErrNoMatch }

// SignaturesError is a failure to read an artifact's signatures from the
// registry.
type SignaturesError struct {
	// Err is the registry's error.
	Err error
}

// Error says the signatures could not be read, and why.
func (e *SignaturesError) Error() string { return "failed to get signatures: " + e.Err.Error() }

// Unwrap returns the registry's error.
func (e *SignaturesError) Unwrap() error { return e.Err }

// readPayload reads a signature layer's payload.
func readPayload(img v1.Image, d v1.Hash) ([]byte, error) {
	l, err := img.LayerByDigest(d)
	if err != nil {
		return nil, err
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(io.LimitReader(rc, maxPayloadSize))
}

// verifies reports whether sig (base64) is a signature of payload by one
// of the keys, tried in name order.
func (v *Verifier) verifies(payload []byte, sig string) bool {
	raw, err := base64.StdEncoding.DecodeString(sig)
	if err != nil {
		return false
	}
	sum := sha256.Sum256(payload)
	for _, name := range slices.Sorted(maps.Keys(v.keys)) {
		switch k := v.keys[name].(type) {
		case *ecdsa.PublicKey:
			if ecdsa.VerifyASN1(k, sum[:], raw) {
				return true
			}
		case *rsa.PublicKey:
			if rsa.VerifyPKCS1v15(k, crypto.SHA256, sum[:], raw) == nil || rsa.VerifyPSS(k, crypto.SHA256, sum[:], raw, nil) == nil {
				return true
			}
		case ed25519.PublicKey:
			if ed25519.Verify(k, payload, raw) {
				return true
			}
		}
	}
	return false
}

// simpleSigning is the payload cosign signs.
type simpleSigning struct {
	Critical struct {
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
}

// signs reports whether a verified payload is a cosign signature of digest.
func signs(payload []byte, digest v1.Hash) bool {
	var p simpleSigning
	if err := json.Unmarshal(payload, &p); err != nil {
		return false
	}
	return p.Critical.Image.DockerManifestDigest == digest.String()
}
