package ocifetch

import (
	"context"
	"fmt"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/notation"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// notationVerification reads a notation spec.verify's Secret: its trust
// policy and certificates, as Flux's verifySignature. A Secret that cannot
// be read is transient; one that cannot verify anything stalls the source.
// Without a secretRef, verification fails once the digest is known, in
// Flux's words; matchOIDCIdentity is cosign's and ignored, as by Flux.
func (s *Source) notationVerification(ctx context.Context, namespace string, v *sourcev1.OCIRepositoryVerification) (*verifyConfig, error) {
	if v.SecretRef == nil {
		return &verifyConfig{provider: v.Provider, noSecret: true}, nil
	}
	fail := func(h failure.Handling, err error) error {
		return source.VerificationFailed(v.Provider, h, sourcev1.VerificationError,
			fmt.Errorf("failed to verify the signature using provider '%s': %w", v.Provider, err))
	}
	data, err := s.secret(ctx, namespace, v.SecretRef.Name)
	if err != nil {
		return nil, fail(failure.Transient, fmt.Errorf("failed to get secret '%s/%s': %w", namespace, v.SecretRef.Name, err))
	}
	verifier, err := notation.NewVerifier(ctx, data, namespace+"/"+v.SecretRef.Name)
	if err != nil {
		return nil, fail(failure.Stalling, err)
	}
	return &verifyConfig{provider: v.Provider, notation: verifier}, nil
}

// verifyNotation checks the notation signatures of the resolved digest
// with the source's transport and credentials. It returns SourceVerified's
// result, nil when the trust policy skips or only audits verification (as
// Flux, SourceVerified is then not set), or the failure: SourceVerified
// False, reason VerificationError.
func (r *resolved) verifyNotation(ctx context.Context) (*events.Verification, error) {
	cfg := r.verifyCfg
	ref := r.repo.Digest(r.digest.String())
	fail := func(h failure.Handling, err error) error {
		return source.VerificationFailed(cfg.provider, h, sourcev1.VerificationError,
			fmt.Errorf("failed to verify the signature using provider '%s': %w", cfg.provider, err))
	}
	if cfg.noSecret {
		return nil, fail(failure.Stalling, fmt.Errorf("verification secret cannot be empty: '%s'", ref))
	}
	result, err := cfg.notation.Verify(ctx, ref, notation.Registry{Transport: r.access.transport, Auth: r.access.auth, UserAgent: userAgent})
	if err != nil {
		return nil, fail(notation.Handling(err), err)
	}
	if result == notation.Ignored {
		logr.FromContextOrDiscard(ctx).Info("notation trust policy does not enforce verification: the artifact is not marked verified", "revision", r.Revision())
		return nil, nil
	}
	return &events.Verification{Mode: cfg.provider, Verified: true, Reason: meta.SucceededReason,
		Message: fmt.Sprintf("verified signature of revision %s", r.Revision())}, nil
}
