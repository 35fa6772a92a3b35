package helmchartfetch

import (
	"context"
	"errors"
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
	"github.com/headwater-gitops/headwater/services/fetcher/internal/cosign"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	registryserver "github.com/headwater-gitops/headwater/testsupport/registry"
	"github.com/headwater-gitops/headwater/testsupport/sigstoretest"
)

// TestFetchChartOCIKeyless verifies OCI charts' keyless cosign signatures
// with spec.verify.matchOIDCIdentity. A HelmChart has no
// trustedRootSecretRef (Flux's API): the public Sigstore root stands in
// here for a virtual one. A chart signed by a matching identity, as a
// ".sig" image or a v3 bundle referrer, is pulled with
// SourceVerified=True; one signed by another identity fails with
// BuildFailed (ChartVerificationError) and SourceVerified=False.
func TestFetchChartOCIKeyless(t *testing.T) {
	const (
		issuer  = "https://token.actions.githubusercontent.com"
		subject = "https://github.com/acme/charts/.github/workflows/release.yaml@refs/heads/main"
	)
	srv := registryserver.New(t, registryserver.Options{})
	push, err := registry.NewClient(registry.ClientOptPlainHTTP(), registry.ClientOptWriter(io.Discard),
		registry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "creds.json")))
	must(t, err)
	digests := map[string]v1.Hash{}
	for _, v := range []string{"1.0.0", "2.0.0", "3.0.0"} {
		p, err := chartrepo.Package(t.TempDir(), chartrepo.Chart{Name: "podinfo", Version: v})
		must(t, err)
		data, err := os.ReadFile(p)
		must(t, err)
		res, err := push.Push(data, srv.Host+"/charts/podinfo:"+v)
		must(t, err)
		digests[v], err = v1.NewHash(res.Manifest.Digest)
		must(t, err)
	}
	ss := sigstoretest.New(t)
	ss.SignTag(t, srv, "charts/podinfo", digests["1.0.0"], subject, issuer)
	ss.SignBundle(t, srv, "charts/podinfo", digests["2.0.0"], subject, issuer)
	ss.SignTag(t, srv, "charts/podinfo", digests["3.0.0"], "someone@example.com", "https://accounts.example.com")
	trusted, err := cosign.TrustedRoot(map[string][]byte{cosign.TrustedRootKey: ss.TrustedRootJSON(t)}, "test")
	must(t, err)
	s := &Source{Sigstore: cosign.StaticRoot(trusted)}
	cs := &events.ChartSource{Kind: sourcev1.HelmRepositoryKind, Name: "oci", HelmRepository: &sourcev1.HelmRepositorySpec{
		URL: srv.URL("charts"), Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true}}
	verify := &sourcev1.HelmChartVerification{Provider: "cosign",
		MatchOIDCIdentity: []sourcev1.OIDCIdentityMatch{{Issuer: "^https://token.actions.githubusercontent.com$", Subject: "^https://github.com/acme/"}}}

	for _, version := range []string{"1.0.0", "2.0.0"} {
		content, _ := fetchChart(t, s, request(sourcev1.HelmChartSpec{Chart: "podinfo", Version: version, Verify: verify}, cs),
			"podinfo", version, "pulled 'podinfo' chart with version '"+version+"'")
		want := events.Verification{Mode: "cosign", Verified: true, Reason: meta.SucceededReason, Message: "verified signature of version " + version}
		if v := content.Verification; v == nil || *v != want {
			t.Errorf("%s: verification = %+v, want %+v", version, v, want)
		}
	}

	ctx := context.Background()
	res, err := s.Resolve(ctx, request(sourcev1.HelmChartSpec{Chart: "podinfo", Version: "3.0.0", Verify: verify}, cs))
	must(t, err)
	_, err = res.Download(ctx, t.TempDir())
	f := failure.As(err)
	const message = "chart verification error: no matching signatures were found for '%s/charts/podinfo:3.0.0': none of the expected identities " +
		"matched what was in the certificate, got subjects [someone@example.com] with issuer https://accounts.example.com"
	if f == nil || f.Condition != sourcev1.BuildFailedCondition || f.Reason != ReasonChartVerification || f.Handling != failure.Final ||
		!strings.Contains(f.Error(), strings.Replace(message, "%s", srv.Host, 1)) {
		t.Fatalf("failure = %#v (%v)", f, err)
	}
	var unverified *source.Unverified
	if !errors.As(err, &unverified) || unverified.Verification.Verified || unverified.Verification.Reason != sourcev1.VerificationError {
		t.Errorf("failure %v carries no failed verification", err)
	}
}
