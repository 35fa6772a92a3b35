package ocifetch

import (
	"errors"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/cosign"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/testsupport/registry"
	"github.com/headwater-gitops/headwater/testsupport/sigstoretest"
)

// TestKeylessVerify verifies keyless cosign signatures against a virtual
// Sigstore handed in by spec.verify.trustedRootSecretRef, as Flux: a
// signature from a matching identity, as a ".sig" image or a v3 bundle
// referrer, sets SourceVerified=True; one from another subject or issuer,
// or of another digest, fails (SourceVerified=False, VerificationError);
// a trusted root that does not parse, or an identity that is no regular
// expression, stalls; without trustedRootSecretRef the public Sigstore
// root is read, and a failure to read it is transient.
func TestKeylessVerify(t *testing.T) {
	const (
		issuer  = "https://token.actions.githubusercontent.com"
		subject = "https://github.com/acme/app/.github/workflows/release.yaml@refs/heads/main"
	)
	reg := registry.New(t, registry.Options{})
	ss := sigstoretest.New(t)
	sigTag := reg.Push(t, "app", "sig-tag", registry.FluxArtifact(t, map[string]string{"a": "sig-tag"}, "", ""))
	ss.SignTag(t, reg, "app", sigTag, subject, issuer)
	bundle := reg.Push(t, "app", "bundle", registry.FluxArtifact(t, map[string]string{"a": "bundle"}, "", ""))
	ss.SignBundle(t, reg, "app", bundle, subject, issuer)
	otherSubject := reg.Push(t, "app", "other-subject", registry.FluxArtifact(t, map[string]string{"a": "other-subject"}, "", ""))
	ss.SignTag(t, reg, "app", otherSubject, "https://github.com/evil/app/.github/workflows/release.yaml@refs/heads/main", issuer)
	otherIssuer := reg.Push(t, "app", "other-issuer", registry.FluxArtifact(t, map[string]string{"a": "other-issuer"}, "", ""))
	ss.SignBundle(t, reg, "app", otherIssuer, subject, "https://gitlab.com")
	// A tag moved to content that was not signed: the signature of the
	// old digest does not serve the new one.
	old := reg.Push(t, "app", "tampered", registry.FluxArtifact(t, map[string]string{"a": "signed"}, "", ""))
	ss.SignTag(t, reg, "app", old, subject, issuer)
	ss.SignBundle(t, reg, "app", old, subject, issuer)
	reg.Push(t, "app", "tampered", registry.FluxArtifact(t, map[string]string{"a": "tampered"}, "", ""))

	src := &Source{Secrets: kube(t,
		secret("sigstore", map[string][]byte{cosign.TrustedRootKey: ss.TrustedRootJSON(t)}),
		secret("not-json", map[string][]byte{cosign.TrustedRootKey: []byte("{not json")}),
		secret("no-root", map[string][]byte{"root.json": ss.TrustedRootJSON(t)}),
	), Sigstore: unreachable()}
	match := []sourcev1.OIDCIdentityMatch{{Issuer: "^https://token.actions.githubusercontent.com$", Subject: "^https://github.com/acme/app/"}}
	spec := func(tag, trustedRoot string, ids []sourcev1.OIDCIdentityMatch) sourcev1.OCIRepositorySpec {
		v := &sourcev1.OCIRepositoryVerification{Provider: "cosign", MatchOIDCIdentity: ids}
		if trustedRoot != "" {
			v.TrustedRootSecretRef = &meta.LocalObjectReference{Name: trustedRoot}
		}
		return sourcev1.OCIRepositorySpec{URL: reg.URL("app"), Reference: &sourcev1.OCIRepositoryRef{Tag: tag}, Verify: v}
	}
	for _, tag := range []string{"sig-tag", "bundle"} {
		t.Run("verified "+tag, func(t *testing.T) {
			rev, content, got, err := sourcetest.Fetch(t, src, request(spec(tag, "sigstore", match)))
			must(t, err)
			v := content.Verification
			if v == nil || !v.Verified || v.Mode != "cosign" || v.Reason != meta.SucceededReason || v.Message != "verified signature of revision "+rev || got["a"] != tag {
				t.Errorf("verification %+v, files %v", v, got)
			}
		})
	}
	const prefix = "failed to verify the signature using provider 'cosign keyless': "
	for _, tc := range []struct {
		name, tag, trustedRoot string
		ids                    []sourcev1.OIDCIdentityMatch
		handling               failure.Handling
		message                string
	}{
		{name: "another subject", tag: "other-subject", trustedRoot: "sigstore", ids: match, handling: failure.Final,
			message: prefix + "no matching signatures were found for '" + reg.Host + "/app:other-subject': none of the expected identities matched what was in the certificate, got subjects [https://github.com/evil/app/.github/workflows/release.yaml@refs/heads/main] with issuer " + issuer},
		{name: "another issuer", tag: "other-issuer", trustedRoot: "sigstore", ids: match, handling: failure.Final,
			message: prefix + "no matching signatures were found for '" + reg.Host + "/app:other-issuer': none of the expected identities matched what was in the certificate, got subjects [" + subject + "] with issuer https://gitlab.com"},
		{name: "tampered", tag: "tampered", trustedRoot: "sigstore", ids: match, handling: failure.Final,
			message: prefix + "no matching signatures were found for '" + reg.Host + "/app:tampered'"},
		{name: "trusted root that does not parse", tag: "sig-tag", trustedRoot: "not-json", ids: match, handling: failure.Stalling,
			message: prefix + "failed to read trusted root from secret 'default/not-json': unable to parse trusted root: "},
		{name: "no trusted_root.json", tag: "sig-tag", trustedRoot: "no-root", ids: match, handling: failure.Stalling,
			message: prefix + "failed to read trusted root from secret 'default/no-root': 'trusted_root.json' not found in secret 'default/no-root'"},
		{name: "missing secret", tag: "sig-tag", trustedRoot: "absent", ids: match, handling: failure.Transient,
			message: prefix + "failed to read trusted root from secret 'default/absent'"},
		{name: "identity that is no regular expression", tag: "sig-tag", trustedRoot: "sigstore",
			ids: []sourcev1.OIDCIdentityMatch{{Issuer: "(", Subject: ".*"}}, handling: failure.Stalling, message: prefix + "invalid matchOIDCIdentity[0]"},
		{name: "public Sigstore unreachable", tag: "sig-tag", ids: match, handling: failure.Transient,
			message: prefix + "unable to initialize trusted root from the public Sigstore TUF repository: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := sourcetest.Fetch(t, src, request(spec(tc.tag, tc.trustedRoot, tc.ids)))
			sourcetest.CheckFailure(t, err, sourcev1.VerificationError, tc.handling, tc.message)
			var unverified *source.Unverified
			if !errors.As(err, &unverified) || unverified.Verification.Verified || unverified.Verification.Reason != sourcev1.VerificationError {
				t.Errorf("failure %v carries no failed verification", err)
			}
		})
	}
}

// unreachable is a public Sigstore root whose TUF repository refuses
// connections, as Sigstore's is from this machine.
func unreachable() *cosign.PublicRoot {
	p := cosign.NewPublicRoot()
	p.Mirror = "http://127.0.0.1:1"
	return p
}
