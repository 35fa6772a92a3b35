package helmchartfetch

import (
	"context"
	"fmt"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/notation"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// notationVerifier reads a notation spec.verify's Secret (trust policy and
// certificates), as Flux's makeVerifiers; a failure sets SourceVerified
// False (VerificationError) only. Without a secretRef it stalls in Flux's
// words, which name the HelmChart; matchOIDCIdentity is cosign's and
// ignored, as by Flux.
func (s *Source) notationVerifier(ctx context.Context, namespace, chartName string, v *sourcev1.HelmChartVerification) (*notation.Verifier, error) {
	fail := func(h failure.Handling, err error) error {
		return source.VerificationFailed(v.Provider, h, sourcev1.VerificationError,
			fmt.Errorf("failed to verify the signature using provider '%s': %w", v.Provider, err))
	}
	if v.SecretRef == nil {
		return nil, fail(failure.Stalling, fmt.Errorf("verification secret cannot be empty: '%s'", chartName))
	}
	if s.Secrets == nil {
		return nil, fail(failure.Transient, fmt.Errorf("failed to get secret '%s/%s': %w", namespace, v.SecretRef.Name, secrets.ErrNoCluster))
	}
	data, err := s.Secrets.Get(ctx, namespace, v.SecretRef.Name)
	if err != nil {
		return nil, fail(failure.Transient, fmt.Errorf("failed to get secret '%s/%s': %w", namespace, v.SecretRef.Name, err))
	}
	verifier, err := notation.NewVerifier(ctx, data, namespace+"/"+v.SecretRef.Name)
	if err != nil {
		return nil, fail(failure.Stalling, err)
	}
	return verifier, nil
}

// verifyNotation checks the notation signatures of the chart's manifest
// digest through the repository's transport and credentials, as Flux's
// OCI chart repository: a chart that does not verify fails with
// BuildFailed (ChartVerificationError) and SourceVerified=False
// (VerificationError); one the trust policy skips or only audits is not
// marked verified (nil).
func (r *ociResolved) verifyNotation(ctx context.Context, digest v1.Hash) (*events.Verification, error) {
	result, err := r.notation.Verify(ctx, r.repo.Digest(digest.String()),
		notation.Registry{Transport: r.access.transport, Auth: r.access.auth(), UserAgent: userAgent})
	if err != nil {
		f := source.VerificationFailed(notation.Provider, notation.Handling(err), sourcev1.VerificationError,
			fmt.Errorf("chart verification error: failed to verify oci://%s: %w", r.repo.Tag(r.tag).Name(), err))
		f.Condition, f.Reason = sourcev1.BuildFailedCondition, ReasonChartVerification
		return nil, f
	}
	if result == notation.Ignored {
		logr.FromContextOrDiscard(ctx).Info("notation trust policy does not enforce verification: the chart is not marked verified", "version", r.version)
		return nil, nil
	}
	return &events.Verification{Mode: notation.Provider, Verified: true, Reason: meta.SucceededReason,
		Message: fmt.Sprintf("verified signature of version %s", r.version)}, nil
}
