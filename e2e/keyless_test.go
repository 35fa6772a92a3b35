package e2e

import (
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/testsupport/registry"
	"github.com/headwater-gitops/headwater/testsupport/sigstoretest"
)

// TestOCIRepositoryKeyless checks keyless cosign verification as a user
// sees it, against a virtual Sigstore (sigstore-go's test CA and
// transparency log) whose trusted_root.json is handed in by
// spec.verify.trustedRootSecretRef: an artifact signed by the identity
// spec.verify.matchOIDCIdentity matches, as a cosign v2 ".sig" image or a
// cosign v3 bundle attached as an OCI referrer, is Ready with
// SourceVerified=True; one signed by another subject, or a tag moved to
// content nobody signed, is refused in Flux's words and stores nothing;
// a trusted root that does not parse stalls the source; without
// trustedRootSecretRef the public Sigstore root is read, which this
// machine cannot reach: the failure says so.
func TestOCIRepositoryKeyless(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const (
		issuer  = "https://token.actions.githubusercontent.com"
		subject = "https://github.com/acme/app/.github/workflows/release.yaml@refs/heads/main"
		evil    = "https://github.com/evil/app/.github/workflows/release.yaml@refs/heads/main"
	)
	reg := registry.New(t, registry.Options{})
	ss := sigstoretest.New(t)
	sigTag := reg.Push(t, "app", "sig-tag", registry.FluxArtifact(t, map[string]string{"app.yaml": "sig-tag\n"}, "", ""))
	ss.SignTag(t, reg, "app", sigTag, subject, issuer)
	bundle := reg.Push(t, "app", "bundle", registry.FluxArtifact(t, map[string]string{"app.yaml": "bundle\n"}, "", ""))
	ss.SignBundle(t, reg, "app", bundle, subject, issuer)
	other := reg.Push(t, "app", "other-subject", registry.FluxArtifact(t, map[string]string{"app.yaml": "other\n"}, "", ""))
	ss.SignBundle(t, reg, "app", other, evil, issuer)
	old := reg.Push(t, "app", "tampered", registry.FluxArtifact(t, map[string]string{"app.yaml": "signed\n"}, "", ""))
	ss.SignTag(t, reg, "app", old, subject, issuer)
	reg.Push(t, "app", "tampered", registry.FluxArtifact(t, map[string]string{"app.yaml": "tampered\n"}, "", ""))
	createSecret(t, "keyless-sigstore", map[string]string{"trusted_root.json": string(ss.TrustedRootJSON(t))})
	createSecret(t, "keyless-broken-root", map[string]string{"trusted_root.json": "{\"mediaType\": 42}"})
	verify := func(tag, trustedRoot string) func(*sourcev1.OCIRepository) {
		return func(o *sourcev1.OCIRepository) {
			o.Spec.Reference = &sourcev1.OCIRepositoryRef{Tag: tag}
			o.Spec.Verify = &sourcev1.OCIRepositoryVerification{Provider: "cosign",
				MatchOIDCIdentity: []sourcev1.OIDCIdentityMatch{{Issuer: "^https://token.actions.githubusercontent.com$", Subject: "^https://github.com/acme/.*$"}}}
			if trustedRoot != "" {
				o.Spec.Verify.TrustedRootSecretRef = &meta.LocalObjectReference{Name: trustedRoot}
			}
		}
	}
	const prefix = "failed to verify the signature using provider 'cosign keyless': "

	for _, tc := range []struct{ name, tag, content string }{
		{"oci-keyless-sig-tag", "sig-tag", "sig-tag\n"},
		{"oci-keyless-bundle", "bundle", "bundle\n"},
	} {
		t.Run(tc.tag, func(t *testing.T) {
			t.Parallel()
			createOCIRepository(t, tc.name, reg.URL("app"), verify(tc.tag, "keyless-sigstore"))
			digest := map[string]string{"sig-tag": sigTag.String(), "bundle": bundle.String()}[tc.tag]
			rev := tc.tag + "@" + digest
			obj := waitOCIArtifact(t, tc.name, rev)
			checkOCIContent(t, obj, map[string]string{"app.yaml": tc.content})
			c := conditionOf(t, obj, sourcev1.SourceVerifiedCondition)
			if c.Status != metav1.ConditionTrue || c.Reason != meta.SucceededReason || c.Message != "verified signature of revision "+rev {
				t.Errorf("SourceVerified=%s %s %q", c.Status, c.Reason, c.Message)
			}
		})
	}
	for _, tc := range []struct{ name, tag, want string }{
		{"oci-keyless-other-subject", "other-subject", prefix + "no matching signatures were found for '" + reg.Host + "/app:other-subject': " +
			"none of the expected identities matched what was in the certificate, got subjects [" + evil + "] with issuer " + issuer},
		{"oci-keyless-tampered", "tampered", prefix + "no matching signatures were found for '" + reg.Host + "/app:tampered'"},
	} {
		t.Run(tc.tag, func(t *testing.T) {
			t.Parallel()
			createOCIRepository(t, tc.name, reg.URL("app"), verify(tc.tag, "keyless-sigstore"))
			obj := waitNotationFailure(t, "ocirepository "+tc.name, func() fluxSource { return getOCI(t, tc.name) },
				sourcev1.VerificationError, sourcev1.VerificationError, tc.want)
			if c := conditionOf(t, obj, sourcev1.SourceVerifiedCondition); c.Message != tc.want {
				t.Errorf("SourceVerified message %q\nwant %q", c.Message, tc.want)
			}
			waitKindEvent(t, ociKind, tc.name, corev1.EventTypeWarning, sourcev1.VerificationError, func(msg string) bool { return msg == tc.want })
			if a := obj.GetArtifact(); a != nil {
				t.Errorf("an unverified artifact was stored: %+v", a)
			}
			if files := storedFilesOf(t, "ocirepository", tc.name); len(files) != 0 {
				t.Errorf("storage holds %v", files)
			}
		})
	}
	t.Run("trusted root that does not parse", func(t *testing.T) {
		t.Parallel()
		const name = "oci-keyless-broken-root"
		createOCIRepository(t, name, reg.URL("app"), verify("sig-tag", "keyless-broken-root"))
		want := prefix + "failed to read trusted root from secret '" + namespace + "/keyless-broken-root': unable to parse trusted root: "
		obj := waitNotationFailure(t, "ocirepository "+name, func() fluxSource { return getOCI(t, name) },
			sourcev1.VerificationError, sourcev1.VerificationError, want)
		if c := conditionOf(t, obj, meta.StalledCondition); c.Status != metav1.ConditionTrue || !strings.HasPrefix(c.Message, want) {
			t.Errorf("Stalled=%s %q, want True %q...", c.Status, c.Message, want)
		}
		if a := obj.GetArtifact(); a != nil {
			t.Errorf("an unverified artifact was stored: %+v", a)
		}
	})
	t.Run("public Sigstore unreachable", func(t *testing.T) {
		t.Parallel()
		const name = "oci-keyless-public"
		createOCIRepository(t, name, reg.URL("app"), verify("sig-tag", ""))
		want := prefix + "unable to initialize trusted root from the public Sigstore TUF repository: "
		obj := waitNotationFailure(t, "ocirepository "+name, func() fluxSource { return getOCI(t, name) },
			sourcev1.VerificationError, sourcev1.VerificationError, want)
		if c := apimeta.FindStatusCondition(obj.GetConditions(), meta.StalledCondition); c != nil && c.Status == metav1.ConditionTrue {
			t.Errorf("an unreachable Sigstore stalls the source: %q", c.Message)
		}
	})
	t.Cleanup(func() { requireServicesRunning(t) })
}
