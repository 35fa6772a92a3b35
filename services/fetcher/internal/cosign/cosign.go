// Package cosign verifies cosign signatures of OCI artifacts with public
// keys, offline (no transparency log), as Flux does for an
// OCIRepository's or an OCI HelmChart's spec.verify with a secretRef:
// a signature image tagged "sha256-<hex of the signed digest>.sig" in the
// artifact's repository holds one simple-signing payload per layer, its
// signature in an annotation; the artifact is verified when one payload
// names its digest and is signed by one of the keys.
package cosign

import (
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

// Verifier checks cosign signatures with public keys.
type Verifier struct {
	// keys are the public keys, by their Secret entry's name.
	keys map[string]crypto.PublicKey
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
// with one of the keys; opts reach the registry (auth, transport). It
// returns ErrNoMatch when none does, or the registry's error (wrapped,
// for the caller to classify: a registry that answers 404 for the
// signature image means nothing signed the digest) when the signatures
// cannot be read.
func (v *Verifier) Verify(ctx context.Context, repo name.Repository, digest v1.Hash, opts ...remote.Option) error {
	sigTag := repo.Tag(strings.Replace(digest.String(), ":", "-", 1) + ".sig")
	img, err := remote.Image(sigTag, append(opts, remote.WithContext(ctx))...)
	if err != nil {
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
		if v.verifies(payload, sig) && signs(payload, digest) {
			return nil
		}
	}
	return ErrNoMatch
}

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
