package helmchartfetch

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"helm.sh/helm/v3/pkg/registry"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets/secretstest"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	registryserver "github.com/headwater-gitops/headwater/testsupport/registry"
	"github.com/headwater-gitops/headwater/testsupport/testca"
)

// TestFetchChartOCINotation verifies OCI charts' notation signatures, as
// Flux's OCI chart repository: a chart signed with a certificate the
// trust store's CA issued is pulled with SourceVerified=True; an unsigned
// one, or one whose trust policy has no statement for its repository,
// fails with BuildFailed (ChartVerificationError) and notation's words.
func TestFetchChartOCINotation(t *testing.T) {
	srv := registryserver.New(t, registryserver.Options{})
	push, err := registry.NewClient(registry.ClientOptPlainHTTP(), registry.ClientOptWriter(io.Discard),
		registry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "creds.json")))
	must(t, err)
	ca, err := testca.New("charts")
	must(t, err)
	leaf, err := ca.Issue(x509.ExtKeyUsageCodeSigning, "charts signer", nil)
	must(t, err)
	digests := map[string]v1.Hash{}
	for _, v := range []string{"1.0.0", "2.0.0"} {
		p, err := chartrepo.Package(t.TempDir(), chartrepo.Chart{Name: "podinfo", Version: v})
		must(t, err)
		data, err := os.ReadFile(p)
		must(t, err)
		res, err := push.Push(data, srv.Host+"/charts/podinfo:"+v)
		must(t, err)
		digests[v], err = v1.NewHash(res.Manifest.Digest)
		must(t, err)
	}
	srv.SignNotation(t, "charts/podinfo", digests["1.0.0"], leaf.Pair.PrivateKey, []*x509.Certificate{leaf.Pair.Leaf, ca.Cert})
	policy := func(scope string) string {
		b, err := json.Marshal(map[string]any{"version": "1.0", "trustPolicies": []map[string]any{{
			"name": "charts", "registryScopes": []string{scope}, "signatureVerification": map[string]string{"level": "strict"},
			"trustStores": []string{"ca:charts"}, "trustedIdentities": []string{"*"},
		}}})
		must(t, err)
		return string(b)
	}
	s := &Source{Secrets: secretstest.Reader(t, "default", map[string]map[string]string{
		"trust":       {"trustpolicy.json": policy(srv.Host + "/charts/podinfo"), "ca.crt": string(ca.CertPEM)},
		"other-scope": {"trustpolicy.json": policy("registry.example.com/charts/podinfo"), "ca.crt": string(ca.CertPEM)},
	})}
	cs := &events.ChartSource{Kind: sourcev1.HelmRepositoryKind, Name: "oci", HelmRepository: &sourcev1.HelmRepositorySpec{
		URL: srv.URL("charts"), Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true}}
	verify := func(secret string) *sourcev1.HelmChartVerification {
		return &sourcev1.HelmChartVerification{Provider: "notation", SecretRef: &meta.LocalObjectReference{Name: secret}}
	}

	content, _ := fetchChart(t, s, request(sourcev1.HelmChartSpec{Chart: "podinfo", Version: "1.0.0", Verify: verify("trust")}, cs),
		"podinfo", "1.0.0", "pulled 'podinfo' chart with version '1.0.0'")
	want := events.Verification{Mode: "notation", Verified: true, Reason: meta.SucceededReason, Message: "verified signature of version 1.0.0"}
	if v := content.Verification; v == nil || *v != want {
		t.Errorf("verification = %+v, want %+v", v, want)
	}

	failed := func(v string) string {
		return fmt.Sprintf("chart verification error: failed to verify oci://%s/charts/podinfo:%s: ", srv.Host, v)
	}
	ref := func(v string) string { return srv.Host + "/charts/podinfo@" + digests[v].String() }
	for _, tc := range []struct {
		name, version, secret, message string
		handling                       failure.Handling
	}{
		{"unsigned", "2.0.0", "trust",
			failed("2.0.0") + fmt.Sprintf("no signature is associated with %q, make sure the artifact was signed successfully", ref("2.0.0")), failure.Final},
		{"trust policy for another registry scope", "1.0.0", "other-scope",
			failed("1.0.0") + fmt.Sprintf("artifact %q has no applicable trust policy statement", ref("1.0.0")), failure.Stalling},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := s.Resolve(t.Context(), request(sourcev1.HelmChartSpec{Chart: "podinfo", Version: tc.version, Verify: verify(tc.secret)}, cs))
			must(t, err)
			_, err = res.Download(t.Context(), t.TempDir())
			f := failure.As(err)
			if f == nil || f.Condition != sourcev1.BuildFailedCondition || f.Reason != ReasonChartVerification || f.Handling != tc.handling ||
				!strings.Contains(f.Error(), tc.message) {
				t.Fatalf("failure = %#v (%v); want BuildFailed/%s (%s) containing %q", f, err, ReasonChartVerification, tc.handling, tc.message)
			}
		})
	}
}
