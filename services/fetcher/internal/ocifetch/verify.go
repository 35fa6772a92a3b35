package ocifetch

import (
	"context"
	"errors"
	"fmt"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/google/go-containerregistry/pkg/name"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/cosign"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/notation"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// verifyConfig is spec.verify, with the public keys, or the notation
// trust policy and certificates, read.
type verifyConfig struct {
	provider string
	verifier *cosign.Verifier
	notation *notation.Verifier
	// noSecret is a notation spec.verify without a secretRef, which
	// fails verification, as Flux, once the digest is known.
	noSecret bool
}

// verification reads spec.verify's Secret: cosign public keys, or
// notation's trust policy and certificates. Keyless cosign stalls with a
// clear message.
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
		// Flux names the mode "cosign keyless" in its messages. Why it is
		// not supported: docs/design.md, "Notation verification".
		return nil, source.VerificationFailed(v.Provider, failure.Stalling, sourcev1.VerificationError,
			errors.New("failed to verify the signature using provider 'cosign keyless': keyless verification (no spec.verify.secretRef) is not supported yet"))
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
	return &verifyConfig{provider: v.Provider, verifier: verifier}, nil
}

// verify checks that a cosign signature of the resolved digest verifies
// with one of the keys, as Flux does for public keys (offline: no
// transparency log). It returns the SourceVerified result, or the failure.
func (r *resolved) verify(ctx context.Context) (*events.Verification, error) {
	cfg := r.verifyCfg
	if cfg.provider == notation.Provider {
		return r.verifyNotation(ctx)
	}
	fail := func(h failure.Handling, err error) error {
		return source.VerificationFailed(cfg.provider, h, sourcev1.VerificationError,
			fmt.Errorf("failed to verify the signature using provider '%s': %w", cfg.provider, err))
	}
	ref := r.reference()
	err := cfg.verifier.Verify(ctx, r.repo, r.digest, r.options(ctx)...)
	var sigErr *cosign.SignaturesError
	switch {
	case err == nil:
		return &events.Verification{Mode: cfg.provider, Verified: true, Reason: meta.SucceededReason,
			Message: fmt.Sprintf("verified signature of revision %s", r.Revision())}, nil
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
