package helmchartfetch

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets/secretstest"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	registryserver "github.com/headwater-gitops/headwater/testsupport/registry"
)

// TestFetchChartOCI pulls charts from an OCI HelmRepository served by the
// CNCF distribution registry, with basic auth: the highest version of a
// range from the registry's tags, an exact version, values files merged.
func TestFetchChartOCI(t *testing.T) {
	srv := registryserver.New(t, registryserver.Options{Username: "helm", Password: "oci"})
	push, err := registry.NewClient(registry.ClientOptPlainHTTP(), registry.ClientOptWriter(io.Discard),
		registry.ClientOptBasicAuth("helm", "oci"), registry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "creds.json")))
	must(t, err)
	for _, v := range []string{"6.0.0", "6.1.0", "7.0.0-rc.1"} {
		p, err := chartrepo.Package(t.TempDir(), chartrepo.Chart{Name: "podinfo", Version: v, Values: map[string]any{"message": "default"},
			Files: map[string]string{"values-prod.yaml": "message: prod\n"}})
		must(t, err)
		data, err := os.ReadFile(p)
		must(t, err)
		_, err = push.Push(data, srv.Host+"/charts/podinfo:"+v)
		must(t, err)
	}
	kube := secretstest.Reader(t, "default", map[string]map[string]string{"auth": {"username": "helm", "password": "oci"}})
	s := &Source{Secrets: kube}
	cs := &events.ChartSource{Kind: sourcev1.HelmRepositoryKind, Name: "oci", HelmRepository: &sourcev1.HelmRepositorySpec{
		URL: srv.URL("charts"), Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true, SecretRef: &meta.LocalObjectReference{Name: "auth"}}}
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		spec     sourcev1.HelmChartSpec
		revision string
		message  string
	}{
		{"latest stable", sourcev1.HelmChartSpec{Chart: "podinfo"}, "6.1.0", "pulled 'podinfo' chart with version '6.1.0'"},
		{"exact", sourcev1.HelmChartSpec{Chart: "podinfo", Version: "6.0.0"}, "6.0.0", "pulled 'podinfo' chart with version '6.0.0'"},
		{"values files", sourcev1.HelmChartSpec{Chart: "podinfo", Version: "6.x", ValuesFiles: []string{"values.yaml", "values-prod.yaml"}},
			"6.1.0+3", "packaged 'podinfo' chart with version '6.1.0+3' and merged values files [values.yaml values-prod.yaml]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fetchChart(t, s, request(tc.spec, cs), "podinfo", tc.revision, tc.message)
		})
	}
	t.Run("one ping a fetch", func(t *testing.T) {
		// The tag listing, the manifest and the layer share what the
		// registry's ping told the first of them.
		before := len(srv.Settle(t))
		fetchChart(t, s, request(sourcev1.HelmChartSpec{Chart: "podinfo", Version: "6.x"}, cs), "podinfo", "6.1.0",
			"pulled 'podinfo' chart with version '6.1.0'")
		after := srv.Settle(t)
		pings, tags := 0, 0
		for _, r := range after[before:] {
			switch {
			case r.Path == "/v2/":
				pings++
			case strings.Contains(r.Path, "/tags/list"):
				tags++
			}
		}
		if pings != 1 || tags != 1 {
			t.Errorf("the fetch pinged the registry %d times and listed its tags %d times, want once each: %v", pings, tags, after[before:])
		}
	})
	t.Run("wrong credentials", func(t *testing.T) {
		bad := *cs
		bad.HelmRepository = cs.HelmRepository.DeepCopy()
		bad.HelmRepository.SecretRef = nil
		_, err := s.Resolve(ctx, request(sourcev1.HelmChartSpec{Chart: "podinfo"}, &bad))
		if f := failure.As(err); f == nil || f.Condition != sourcev1.FetchFailedCondition || !strings.Contains(f.Error(), "could not fetch tags") {
			t.Fatalf("failure %v", err)
		}
	})
	t.Run("over the size limit", func(t *testing.T) {
		small := &Source{Secrets: kube, MaxChartSize: 100}
		res, err := small.Resolve(ctx, request(sourcev1.HelmChartSpec{Chart: "podinfo", Version: "6.0.0"}, cs))
		must(t, err)
		_, err = res.Download(ctx, t.TempDir())
		if f := failure.As(err); f == nil || f.Reason != ReasonChartPull || f.Handling != failure.Final ||
			!strings.Contains(f.Error(), "larger than the maximum chart size of 100 bytes") {
			t.Fatalf("failure %v", err)
		}
	})
	t.Run("no match", func(t *testing.T) {
		_, err := s.Resolve(ctx, request(sourcev1.HelmChartSpec{Chart: "podinfo", Version: "9.x"}, cs))
		if f := failure.As(err); f == nil || f.Reason != ReasonChartReference || f.Handling != failure.Stalling {
			t.Fatalf("failure %v", err)
		}
	})
}

// TestFetchChartOCIVerify verifies OCI charts' cosign signatures with the
// public keys of spec.verify.secretRef, as Flux: a chart signed by one of
// the keys is pulled with SourceVerified=True; an unsigned chart, or one
// signed by another key, fails with BuildFailed (ChartVerificationError)
// and SourceVerified=False (VerificationError); keyless cosign reads the
// public Sigstore root (unreachable here: a transient failure); notation
// with a Secret that holds no trust policy stalls.
func TestFetchChartOCIVerify(t *testing.T) {
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
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	srv.Sign(t, "charts/podinfo", digests["1.0.0"], key)
	srv.Sign(t, "charts/podinfo", digests["3.0.0"], otherKey)
	kube := secretstest.Reader(t, "default", map[string]map[string]string{
		"cosign":  {"cosign.pub": string(registryserver.PublicKeyPEM(t, key)), "README": "not a key"},
		"no-keys": {"README": "x"},
	})
	unreachable := cosign.NewPublicRoot()
	unreachable.Mirror = "http://127.0.0.1:1"
	s := &Source{Secrets: kube, Sigstore: unreachable}
	cs := &events.ChartSource{Kind: sourcev1.HelmRepositoryKind, Name: "oci", HelmRepository: &sourcev1.HelmRepositorySpec{
		URL: srv.URL("charts"), Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true}}
	verify := func(provider, secret string) *sourcev1.HelmChartVerification {
		v := &sourcev1.HelmChartVerification{Provider: provider}
		if secret != "" {
			v.SecretRef = &meta.LocalObjectReference{Name: secret}
		}
		return v
	}
	ctx := context.Background()

	content, _ := fetchChart(t, s, request(sourcev1.HelmChartSpec{Chart: "podinfo", Version: "1.0.0", Verify: verify("cosign", "cosign")}, cs),
		"podinfo", "1.0.0", "pulled 'podinfo' chart with version '1.0.0'")
	want := events.Verification{Mode: "cosign", Verified: true, Reason: meta.SucceededReason, Message: "verified signature of version 1.0.0"}
	if v := content.Verification; v == nil || *v != want {
		t.Errorf("verification = %+v, want %+v", v, want)
	}

	for _, tc := range []struct {
		name      string
		version   string
		verify    *sourcev1.HelmChartVerification
		atResolve bool
		condition string
		reason    string
		handling  failure.Handling
		message   string
	}{
		{name: "unsigned", version: "2.0.0", verify: verify("cosign", "cosign"),
			condition: sourcev1.BuildFailedCondition, reason: ReasonChartVerification, handling: failure.Final,
			message: "chart verification error: no matching signatures were found for '" + srv.Host + "/charts/podinfo:2.0.0'"},
		{name: "signed with another key", version: "3.0.0", verify: verify("cosign", "cosign"),
			condition: sourcev1.BuildFailedCondition, reason: ReasonChartVerification, handling: failure.Final,
			message: "chart verification error: no matching signatures were found for '" + srv.Host + "/charts/podinfo:3.0.0'"},
		{name: "no keys", version: "1.0.0", verify: verify("cosign", "no-keys"), atResolve: true,
			reason: sourcev1.VerificationError, handling: failure.Stalling,
			message: "failed to verify the signature using provider 'cosign': no public keys ('*.pub') found in secret 'default/no-keys'"},
		{name: "missing secret", version: "1.0.0", verify: verify("cosign", "absent"), atResolve: true,
			reason: sourcev1.VerificationError, handling: failure.Transient, message: "failed to get secret 'default/absent'"},
		{name: "keyless, public Sigstore unreachable", version: "1.0.0", verify: verify("cosign", ""), atResolve: true,
			reason: sourcev1.VerificationError, handling: failure.Transient,
			message: "failed to verify the signature using provider 'cosign keyless': unable to initialize trusted root from the public Sigstore TUF repository: "},
		{name: "notation without a trust policy", version: "1.0.0", verify: verify("notation", "cosign"), atResolve: true,
			reason: sourcev1.VerificationError, handling: failure.Stalling,
			message: "failed to verify the signature using provider 'notation': 'trustpolicy.json' not found in secret 'default/cosign'"},
		{name: "notation without a secret", version: "1.0.0", verify: verify("notation", ""), atResolve: true,
			reason: sourcev1.VerificationError, handling: failure.Stalling,
			message: "failed to verify the signature using provider 'notation': verification secret cannot be empty: '"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := s.Resolve(ctx, request(sourcev1.HelmChartSpec{Chart: "podinfo", Version: tc.version, Verify: tc.verify}, cs))
			if !tc.atResolve {
				must(t, err)
				_, err = res.Download(ctx, t.TempDir())
			}
			f := failure.As(err)
			if f == nil || f.Condition != tc.condition || f.Reason != tc.reason || f.Handling != tc.handling || !strings.Contains(f.Error(), tc.message) {
				t.Fatalf("failure = %#v (%v); want %q/%s (%s) containing %q", f, err, tc.condition, tc.reason, tc.handling, tc.message)
			}
			var unverified *source.Unverified
			if !errors.As(err, &unverified) || unverified.Verification.Verified || unverified.Verification.Reason != sourcev1.VerificationError ||
				unverified.Verification.Message != f.Error() {
				t.Errorf("failure %v carries no failed verification with its message", err)
			}
		})
	}
}
