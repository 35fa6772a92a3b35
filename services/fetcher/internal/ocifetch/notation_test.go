package ocifetch

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/testsupport/registry"
	"github.com/headwater-gitops/headwater/testsupport/testca"
)

// TestVerifyNotation verifies notation signatures on a registry that
// requires credentials over TLS with a CA of its own: the verification
// reaches it with the source's secretRef and certSecretRef, as the pull
// does. A signed artifact is fetched with SourceVerified=True; an unsigned
// one, or one signed by a CA not in the trust store, fails with Flux's
// message, SourceVerified=False and no negative condition.
func TestVerifyNotation(t *testing.T) {
	reg := registry.New(t, registry.Options{Username: "flux", Password: "s3cr3t", TLS: true})
	signed := reg.Push(t, "app", "signed", registry.FluxArtifact(t, map[string]string{"a": "signed"}, "", ""))
	unsigned := reg.Push(t, "app", "unsigned", registry.FluxArtifact(t, map[string]string{"a": "unsigned"}, "", ""))
	foreign := reg.Push(t, "app", "foreign", registry.FluxArtifact(t, map[string]string{"a": "foreign"}, "", ""))
	trusted, untrusted := codeSigner(t, "trusted"), codeSigner(t, "untrusted")
	reg.SignNotation(t, "app", signed, trusted.Pair.PrivateKey, []*x509.Certificate{trusted.Pair.Leaf, trusted.ca.Cert})
	reg.SignNotation(t, "app", foreign, untrusted.Pair.PrivateKey, []*x509.Certificate{untrusted.Pair.Leaf, untrusted.ca.Cert})
	policy, err := json.Marshal(map[string]any{"version": "1.0", "trustPolicies": []map[string]any{{
		"name": "app", "registryScopes": []string{reg.Host + "/app"}, "signatureVerification": map[string]string{"level": "strict"},
		"trustStores": []string{"ca:app"}, "trustedIdentities": []string{"*"},
	}}})
	must(t, err)
	src := &Source{Secrets: kube(t,
		secret("auth", map[string][]byte{".dockerconfigjson": reg.DockerConfigJSON("flux", "s3cr3t")}),
		secret("ca", map[string][]byte{"ca.crt": reg.CACert()}),
		secret("trust", map[string][]byte{"trustpolicy.json": policy, "ca.crt": trusted.ca.CertPEM}),
	)}
	spec := func(tag string) sourcev1.OCIRepositorySpec {
		return sourcev1.OCIRepositorySpec{URL: reg.URL("app"), Reference: &sourcev1.OCIRepositoryRef{Tag: tag},
			SecretRef: &meta.LocalObjectReference{Name: "auth"}, CertSecretRef: &meta.LocalObjectReference{Name: "ca"},
			Verify: &sourcev1.OCIRepositoryVerification{Provider: "notation", SecretRef: &meta.LocalObjectReference{Name: "trust"}}}
	}
	rev, content, got, err := sourcetest.Fetch(t, src, request(spec("signed")))
	must(t, err)
	if v := content.Verification; v == nil || !v.Verified || v.Mode != "notation" || v.Reason != meta.SucceededReason ||
		v.Message != "verified signature of revision "+rev || got["a"] != "signed" {
		t.Errorf("verification %+v, files %v", v, got)
	}

	const prefix = "failed to verify the signature using provider 'notation': "
	for _, tc := range []struct {
		name, tag, message string
	}{
		{"unsigned", "unsigned", prefix + fmt.Sprintf("no signature is associated with %q, make sure the artifact was signed successfully",
			reg.Host+"/app@"+unsigned.String())},
		{"signed by a CA not in the trust store", "foreign", prefix + "signature verification failed\nfailed to verify signature with digest "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := sourcetest.Fetch(t, src, request(spec(tc.tag)))
			sourcetest.CheckFailure(t, err, sourcev1.VerificationError, failure.Final, tc.message)
			var unverified *source.Unverified
			if !errors.As(err, &unverified) || unverified.Verification.Verified || unverified.Verification.Mode != "notation" {
				t.Errorf("failure %v carries no failed verification", err)
			}
			if f := failure.As(err); f.Condition != "" {
				t.Errorf("failure sets condition %s, want only SourceVerified=False", f.Condition)
			}
		})
	}
}

// signer is a code-signing certificate and the CA that issued it.
type signer struct {
	*testca.Issued
	ca *testca.Authority
}

// codeSigner makes a CA and a code-signing certificate it issued.
func codeSigner(t *testing.T, name string) signer {
	t.Helper()
	ca, err := testca.New(name)
	must(t, err)
	leaf, err := ca.Issue(x509.ExtKeyUsageCodeSigning, name+" signer", nil)
	must(t, err)
	return signer{Issued: leaf, ca: ca}
}
