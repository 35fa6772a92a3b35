package ocifetch

import (
	"context"
	"errors"
	"fmt"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/sigstore/sigstore-go/pkg/root"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/cosign"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/notation"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// verifyConfig is spec.verify, with the public keys, the keyless trusted
// root and identities, or the notation trust policy and certificates,
// read.
type verifyConfig struct {
	provider string
	// mode is the provider as Flux's messages name it: "cosign keyless"
	// without a secretRef.
	mode     string
	verifier *cosign.Verifier
	notation *notation.Verifier
	// noSecret is a notation spec.verify without a secretRef, which
	// fails verification, as Flux, once the digest is known.
	noSecret bool
}

// verification reads spec.verify's Secrets: cosign public keys, or the
// keyless trusted root, or notation's trust policy and certificates.
func (s *Source) verification(ctx context.Context, namespace string, v *sourcev1.OCIRepositoryVerification) (*verifyConfig, error) {
	stall := func(format string, args ...any) error {
		return source.VerificationFailed(v.Provider, failure.Stalling, sourcev1.VerificationError,
			fmt.Errorf("failed to verify the signature using provider '%s': "+format, append([]any{v.Provider}, args...)...))
	}
	switch {
	case v.Provider == notation.Provider:
		return s.notationVerification(ctx, namespace, v)
	case v.Provider != cosign.Provider:
		return nil, stall("verification with provider '%s' is not supported yet", v.Provider)
	case v.SecretRef == nil:
		return s.keylessVerification(ctx, namespace, v)
	}
	data, err := s.secret(ctx, namespace, v.SecretRef.Name)
	if err != nil {
		return nil, source.VerificationFailed(v.Provider, failure.Transient, sourcev1.VerificationError,
			fmt.Errorf("failed to verify the signature using provider '%s': failed to get secret '%s/%s': %w", v.Provider, namespace, v.SecretRef.Name, err))
	}
	verifier, err := cosign.NewVerifier(data)
	if err != nil {
		return nil, stall("%w in secret '%s/%s'", err, namespace, v.SecretRef.Name)
	}
	return &verifyConfig{provider: v.Provider, mode: v.Provider, verifier: verifier}, nil
}

// keylessVerification reads a keyless cosign spec.verify, as Flux: the
// trusted root of trustedRootSecretRef's Secret (a Secret that cannot be
// read is transient; one without a root that parses stalls the source),
// or the public Sigstore root (a failure to read it is transient), and
// the matchOIDCIdentity regular expressions (one that does not compile
// stalls).
func (s *Source) keylessVerification(ctx context.Context, namespace string, v *sourcev1.OCIRepositoryVerification) (*verifyConfig, error) {
	mode := cosign.Provider + " keyless"
	fail := func(h failure.Handling, err error) error {
		return source.VerificationFailed(v.Provider, h, sourcev1.VerificationError,
			fmt.Errorf("failed to verify the signature using provider '%s': %w", mode, err))
	}
	var trusted root.TrustedMaterial
	if ref := v.TrustedRootSecretRef; ref != nil {
		data, err := s.secret(ctx, namespace, ref.Name)
		if err != nil {
			return nil, fail(failure.Transient, fmt.Errorf("failed to read trusted root from secret '%s/%s': %w", namespace, ref.Name, err))
		}
		tr, err := cosign.TrustedRoot(data, namespace+"/"+ref.Name)
		if err != nil {
			return nil, fail(failure.Stalling, fmt.Errorf("failed to read trusted root from secret '%s/%s': %w", namespace, ref.Name, err))
		}
		trusted = tr
	} else {
		var err error
		if trusted, err = s.publicRoot().TrustedMaterial(); err != nil {
			return nil, fail(failure.Transient, err)
		}
	}
	identities := make([]cosign.Identity, 0, len(v.MatchOIDCIdentity))
	for _, m := range v.MatchOIDCIdentity {
		identities = append(identities, cosign.Identity{Issuer: m.Issuer, Subject: m.Subject})
	}
	verifier, err := cosign.NewKeylessVerifier(trusted, identities)
	if err != nil {
		return nil, fail(failure.Stalling, err)
	}
	return &verifyConfig{provider: v.Provider, mode: mode, verifier: verifier}, nil
}

// publicRoot is the public Sigstore trusted root the source verifies
// keyless signatures with when spec.verify names no trusted root.
func (s *Source) publicRoot() *cosign.PublicRoot {
	if s.Sigstore != nil {
		return s.Sigstore
	}
	return cosign.Public()
}

// verify checks that a cosign signature of the resolved digest verifies:
// with one of the keys, as Flux does for public keys (offline: no
// transparency log), or keyless, against the trusted root, offline from
// the transparency log entry the signature carries. It returns the
// SourceVerified result, or the failure.
func (r *resolved) verify(ctx context.Context) (*events.Verification, error) {
	cfg := r.verifyCfg
	if cfg.provider == notation.Provider {
		return r.verifyNotation(ctx)
	}
	fail := func(h failure.Handling, err error) error {
		return source.VerificationFailed(cfg.provider, h, sourcev1.VerificationError,
			fmt.Errorf("failed to verify the signature using provider '%s': %w", cfg.mode, err))
	}
	ref := r.reference()
	err := cfg.verifier.Verify(ctx, r.repo, r.digest, r.options(ctx)...)
	var sigErr *cosign.SignaturesError
	var noMatch *cosign.NoMatchError
	switch {
	case err == nil:
		return &events.Verification{Mode: cfg.provider, Verified: true, Reason: meta.SucceededReason,
			Message: fmt.Sprintf("verified signature of revision %s", r.Revision())}, nil
	case errors.As(err, &noMatch):
		return nil, fail(failure.Final, fmt.Errorf("no matching signatures were found for '%s'%s", ref, noMatch.Detail()))
	case errors.Is(err, cosign.ErrNoMatch):
		return nil, fail(failure.Final, fmt.Errorf("no matching signatures were found for '%s'", ref))
	case errors.As(err, &sigErr):
		if pullError(err, "%w", err).Handling == failure.Final {
			// No signature image: nothing signed this digest.
			return nil, fail(failure.Final, fmt.Errorf("no matching signatures were found for '%s'", ref))
		}
		return nil, fail(failure.Transient, fmt.Errorf("'%s': %w", ref, err))
	}
	return nil, fail(failure.Final, fmt.Errorf("'%s': %w", ref, err))
}

// reference is the artifact's reference as the user gave it (a tag, or the
// digest), for messages.
func (r *resolved) reference() name.Reference {
	if r.tag != "" {
		return r.repo.Tag(r.tag)
	}
	return r.repo.Digest(r.digest.String())
}
