package ocifetch

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

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// Cosign's signature format: a signature image tagged
// "sha256-<hex of the signed digest>.sig" in the artifact's repository,
// one simple-signing payload per layer, its signature in an annotation.
const (
	cosignProvider         = "cosign"
	simpleSigningMediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	signatureAnnotation    = "dev.cosignproject.cosign/signature"
	// maxPayloadSize bounds a signature payload read into memory.
	maxPayloadSize = 1 << 20
	// maxSignatures bounds the signatures of one artifact looked at.
	maxSignatures = 64
)

// verifyConfig is spec.verify, with the public keys read.
type verifyConfig struct {
	provider string
	// keys are the public keys of the Secret's *.pub entries, by name.
	keys map[string]crypto.PublicKey
}

// verification reads spec.verify's public keys. Cosign with public keys
// is supported; keyless cosign and notation stall with a clear message.
func (s *Source) verification(ctx context.Context, namespace string, v *sourcev1.OCIRepositoryVerification) (*verifyConfig, error) {
	stall := func(format string, args ...any) error {
		return source.VerificationFailed(v.Provider, failure.Stalling, sourcev1.VerificationError,
			fmt.Errorf("failed to verify the signature using provider '%s': "+format, append([]any{v.Provider}, args...)...))
	}
	switch {
	case v.Provider != cosignProvider:
		return nil, stall("verification with provider '%s' is not supported yet", v.Provider)
	case v.SecretRef == nil:
		return nil, stall("keyless verification (no spec.verify.secretRef) is not supported yet")
	}
	data, err := s.secret(ctx, namespace, v.SecretRef.Name)
	if err != nil {
		return nil, source.VerificationFailed(v.Provider, failure.Transient, sourcev1.VerificationError,
			fmt.Errorf("failed to verify the signature using provider '%s': failed to get secret '%s/%s': %w", v.Provider, namespace, v.SecretRef.Name, err))
	}
	cfg := &verifyConfig{provider: v.Provider, keys: map[string]crypto.PublicKey{}}
	for k, b := range data {
		if !strings.HasSuffix(k, ".pub") {
			continue
		}
		key, err := parsePublicKey(b)
		if err != nil {
			return nil, stall("secret '%s/%s': key '%s': %w", namespace, v.SecretRef.Name, k, err)
		}
		cfg.keys[k] = key
	}
	if len(cfg.keys) == 0 {
		return nil, stall("no public keys ('*.pub') found in secret '%s/%s'", namespace, v.SecretRef.Name)
	}
	return cfg, nil
}

// parsePublicKey parses a PEM public key (PKIX), as `cosign generate-key-pair`
// writes it: ECDSA, RSA or Ed25519.
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

// simpleSigning is the payload cosign signs.
type simpleSigning struct {
	Critical struct {
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
}

// verify checks that a cosign signature of the resolved digest verifies
// with one of the keys, as Flux does for public keys (offline: no
// transparency log). It returns the SourceVerified result, or the failure.
func (r *resolved) verify(ctx context.Context) (*events.Verification, error) {
	cfg := r.verifyCfg
	fail := func(h failure.Handling, err error) error {
		return source.VerificationFailed(cfg.provider, h, sourcev1.VerificationError,
			fmt.Errorf("failed to verify the signature using provider '%s': %w", cfg.provider, err))
	}
	ref := r.reference()
	sigTag := r.repo.Tag(strings.Replace(r.digest.String(), ":", "-", 1) + ".sig")
	img, err := remote.Image(sigTag, r.options(ctx)...)
	if err != nil {
		e := pullError(err, "%w", err)
		if e.Handling == failure.Final {
			// No signature image: nothing signed this digest.
			return nil, fail(failure.Final, fmt.Errorf("no matching signatures were found for '%s'", ref))
		}
		return nil, fail(failure.Transient, fmt.Errorf("failed to get signatures of '%s': %w", ref, err))
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fail(failure.Final, fmt.Errorf("failed to parse signatures of '%s': %w", ref, err))
	}
	for i, l := range m.Layers {
		if i >= maxSignatures {
			break
		}
		sig := l.Annotations[signatureAnnotation]
		if l.MediaType != simpleSigningMediaType || sig == "" || l.Size > maxPayloadSize {
			continue
		}
		payload, err := r.payload(img, l.Digest)
		if err != nil {
			return nil, fail(failure.Transient, fmt.Errorf("failed to get signature payload of '%s': %w", ref, err))
		}
		if cfg.verifies(payload, sig) && signs(payload, r.digest) {
			return &events.Verification{Mode: cfg.provider, Verified: true, Reason: meta.SucceededReason,
				Message: fmt.Sprintf("verified signature of revision %s", r.Revision())}, nil
		}
	}
	return nil, fail(failure.Final, fmt.Errorf("no matching signatures were found for '%s'", ref))
}

// payload reads a signature layer's payload.
func (r *resolved) payload(img v1.Image, d v1.Hash) ([]byte, error) {
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
func (c *verifyConfig) verifies(payload []byte, sig string) bool {
	raw, err := base64.StdEncoding.DecodeString(sig)
	if err != nil {
		return false
	}
	sum := sha256.Sum256(payload)
	for _, name := range slices.Sorted(maps.Keys(c.keys)) {
		switch k := c.keys[name].(type) {
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

// signs reports whether a verified payload is a cosign signature of digest.
func signs(payload []byte, digest v1.Hash) bool {
	var p simpleSigning
	if err := json.Unmarshal(payload, &p); err != nil {
		return false
	}
	return p.Critical.Image.DockerManifestDigest == digest.String()
}

// reference is the artifact's reference as the user gave it (a tag, or the
// digest), for messages.
func (r *resolved) reference() name.Reference {
	if r.tag != "" {
		return r.repo.Tag(r.tag)
	}
	return r.repo.Digest(r.digest.String())
}
