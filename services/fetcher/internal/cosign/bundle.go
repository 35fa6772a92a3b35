package cosign

import (
	"crypto"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/verify"
	"github.com/sigstore/sigstore/pkg/signature"
)

// Cosign v3's signature format: a Sigstore bundle (v0.3, a DSSE envelope
// of an in-toto statement whose subject is the signed digest) in the one
// layer of an OCI manifest that refers to the artifact (OCI 1.1 referrers
// API, or the "sha256-<hex>" index of the referrers tag scheme).
const (
	bundleMediaTypePrefix = "application/vnd.dev.sigstore.bundle"
	// maxBundleSize bounds a bundle read into memory.
	maxBundleSize = 1 << 20
)

// bundles reads the Sigstore bundles that refer to digest; a referrer
// that is no bundle is skipped, one that does not parse is named in the
// reasons. Referrers that cannot be listed are a reason too, not an
// error: a registry that refuses the Referrers API in a way
// go-containerregistry does not take for "none" (405, 401) still serves
// the ".sig" images Flux reads. The error is the registry's, when a
// bundle it lists cannot be read.
func bundles(repo name.Repository, digest v1.Hash, opts []remote.Option) ([]*bundle.Bundle, []string, error) {
	idx, err := remote.Referrers(repo.Digest(digest.String()), opts...)
	if err != nil {
		return nil, []string{"failed to list referrers: " + err.Error()}, nil
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, []string{"failed to list referrers: " + err.Error()}, nil
	}
	var found []*bundle.Bundle
	var reasons []string
	for _, d := range m.Manifests {
		if !strings.HasPrefix(d.ArtifactType, bundleMediaTypePrefix) {
			continue
		}
		if len(found)+len(reasons) >= maxSignatures {
			break
		}
		b, err := readBundle(repo.Digest(d.Digest.String()), opts)
		if err != nil {
			var sigErr *SignaturesError
			if errors.As(err, &sigErr) {
				return nil, nil, err
			}
			reasons = append(reasons, "bundle "+d.Digest.String()+": "+err.Error())
			continue
		}
		found = append(found, b)
	}
	return found, reasons, nil
}

// readBundle reads the bundle of a referrer manifest: its one layer.
func readBundle(ref name.Digest, opts []remote.Option) (*bundle.Bundle, error) {
	img, err := remote.Image(ref, opts...)
	if err != nil {
		return nil, &SignaturesError{Err: err}
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	if len(m.Layers) != 1 || !strings.HasPrefix(string(m.Layers[0].MediaType), bundleMediaTypePrefix) {
		return nil, errors.New("expected exactly one bundle layer")
	}
	if m.Layers[0].Size > maxBundleSize {
		return nil, fmt.Errorf("bundle larger than %d bytes", maxBundleSize)
	}
	raw, err := readPayload(img, m.Layers[0].Digest)
	if err != nil {
		return nil, &SignaturesError{Err: fmt.Errorf("failed to get bundle: %w", err)}
	}
	b := &bundle.Bundle{}
	if err := b.UnmarshalJSON(raw); err != nil {
		return nil, err
	}
	if !b.MinVersion("v0.3") {
		return nil, errors.New("bundle version too old")
	}
	return b, nil
}

// verifyBundle checks that a bundle signs digest: with the keys (offline,
// as Flux does for keys), or keyless.
func (v *Verifier) verifyBundle(b *bundle.Bundle, digest v1.Hash) error {
	raw, err := hex.DecodeString(digest.Hex)
	if err != nil {
		return err
	}
	artifact := verify.WithArtifactDigest(digest.Algorithm, raw)
	if v.keyless() {
		return v.verifyEntity(b, artifact)
	}
	var last error
	for _, k := range slices.Sorted(maps.Keys(v.keys)) {
		sv, err := signature.LoadVerifier(v.keys[k], crypto.SHA256)
		if err != nil {
			return fmt.Errorf("key '%s': %w", k, err)
		}
		key := root.NewExpiringKey(sv, time.Time{}, time.Time{})
		trusted := root.NewTrustedPublicKeyMaterial(func(string) (root.TimeConstrainedVerifier, error) { return key, nil })
		bv, err := verify.NewVerifier(trusted, verify.WithNoObserverTimestamps())
		if err != nil {
			return err
		}
		if _, last = bv.Verify(b, verify.NewPolicy(artifact, verify.WithKey())); last == nil {
			return nil
		}
	}
	return trimVerifyError(last)
}
