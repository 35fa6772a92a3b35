package cosign

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/sigstore/sigstore-go/pkg/fulcio/certificate"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/verify"
)

// TrustedRootKey is the entry of spec.verify.trustedRootSecretRef's
// Secret that holds the Sigstore trusted root, as Flux names it.
const TrustedRootKey = "trusted_root.json"

// Identity is one of spec.verify.matchOIDCIdentity: regular expressions
// (Go syntax, unanchored, as cosign) for the OIDC issuer and the subject
// of a keyless signature's certificate.
type Identity struct {
	// Issuer matches the certificate's OIDC issuer.
	Issuer string
	// Subject matches the certificate's subject alternative name.
	Subject string
}

// TrustedRoot reads a Sigstore trusted root from the data of
// spec.verify.trustedRootSecretRef's Secret (named secret), in Flux's
// words when the entry is missing or does not parse. A root without a
// certificate authority or a transparency log cannot verify a keyless
// signature and is refused.
func TrustedRoot(data map[string][]byte, secret string) (*root.TrustedRoot, error) {
	raw, ok := data[TrustedRootKey]
	if !ok {
		return nil, fmt.Errorf("'%s' not found in secret '%s'", TrustedRootKey, secret)
	}
	tr, err := root.NewTrustedRootFromJSON(raw)
	switch {
	case err != nil:
		return nil, fmt.Errorf("unable to parse trusted root: %w", err)
	case len(tr.FulcioCertificateAuthorities()) == 0:
		return nil, errors.New("unable to parse trusted root: no certificate authorities found in trusted root")
	case len(tr.RekorLogs()) == 0:
		return nil, errors.New("unable to parse trusted root: no transparency log entries found in trusted root")
	}
	return tr, nil
}

// NewKeylessVerifier returns a Verifier of keyless signatures: a
// certificate issued by one of the trusted root's certificate authorities
// to one of the identities (any identity when there are none, as cosign),
// its signature in one of the trusted root's transparency logs. It fails
// when an identity's regular expression does not compile.
func NewKeylessVerifier(trusted root.TrustedMaterial, identities []Identity) (*Verifier, error) {
	v := &Verifier{trusted: trusted}
	for i, id := range identities {
		ci, err := verify.NewShortCertificateIdentity("", id.Issuer, "", id.Subject)
		if err != nil {
			return nil, fmt.Errorf("invalid matchOIDCIdentity[%d]: %w", i, err)
		}
		v.identities = append(v.identities, ci)
	}
	return v, nil
}

// keyless reports whether the verifier checks keyless signatures.
func (v *Verifier) keyless() bool { return v.trusted != nil }

// checkIdentity checks that a signing certificate was issued to one of
// the identities, with cosign's message when it was not.
func (v *Verifier) checkIdentity(cert *x509.Certificate) error {
	if len(v.identities) == 0 {
		return nil
	}
	s, err := certificate.SummarizeCertificate(cert)
	if err != nil {
		return fmt.Errorf("invalid signing certificate: %w", err)
	}
	if _, err := v.identities.Verify(s); err != nil {
		return fmt.Errorf("none of the expected identities matched what was in the certificate, got subjects [%s] with issuer %s",
			s.SubjectAlternativeName, s.Extensions.Issuer)
	}
	return nil
}

// verifierOptions are sigstore-go's options for a keyless signature, as
// cosign's: a transparency log entry whose integrated time the
// certificate was valid at (a signed timestamp for Rekor v2 entries,
// which have none), and an embedded SCT when the trusted root lists
// certificate transparency logs.
func (v *Verifier) verifierOptions(entity verify.SignedEntity) ([]verify.VerifierOption, error) {
	opts := []verify.VerifierOption{verify.WithTransparencyLog(1)}
	entries, err := entity.TlogEntries()
	if err != nil {
		return nil, err
	}
	integrated := false
	for _, e := range entries {
		integrated = integrated || !e.IntegratedTime().IsZero()
	}
	if integrated {
		opts = append(opts, verify.WithIntegratedTimestamps(1))
	} else {
		opts = append(opts, verify.WithSignedTimestamps(1))
	}
	if len(v.trusted.CTLogs()) > 0 {
		opts = append(opts, verify.WithSignedCertificateTimestamps(1))
	}
	return opts, nil
}

// verifyEntity verifies a keyless signed entity (a bundle, or a .sig
// layer read as one) against the trusted root and the identities, with
// the artifact policy given.
func (v *Verifier) verifyEntity(entity verify.SignedEntity, artifact verify.ArtifactPolicyOption) error {
	content, err := entity.VerificationContent()
	if err != nil {
		return err
	}
	cert := content.Certificate()
	if cert == nil {
		return errors.New("signature has no certificate: it was made with a key")
	}
	if err := v.checkIdentity(cert); err != nil {
		return err
	}
	opts, err := v.verifierOptions(entity)
	if err != nil {
		return err
	}
	sv, err := verify.NewVerifier(v.trusted, opts...)
	if err != nil {
		return err
	}
	policy := []verify.PolicyOption{verify.WithoutIdentitiesUnsafe()}
	if len(v.identities) > 0 {
		policy = policy[:0]
		for _, id := range v.identities {
			policy = append(policy, verify.WithCertificateIdentity(id))
		}
	}
	if _, err := sv.Verify(entity, verify.NewPolicy(artifact, policy...)); err != nil {
		return trimVerifyError(err)
	}
	return nil
}

// trimVerifyError keeps sigstore-go's error as it is, without the
// repetition of its outer layers.
func trimVerifyError(err error) error {
	return errors.New(strings.TrimPrefix(err.Error(), "failed to verify "))
}
