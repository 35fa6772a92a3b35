package ocifetch

import (
	"context"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/registrylogin"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/testsupport/cloudid"
	"github.com/headwater-gitops/headwater/testsupport/registry"
)

// forgedToken is a service account token the clouds do not trust.
const forgedToken = "eyJhbGciOiJSUzI1NiJ9.forged.sig"

// cloudFixture is the test registry behind the three clouds' fronts (see
// testsupport/cloudid).
type cloudFixture struct {
	*cloudid.Clouds
	backend *registry.Server
}

func newCloudFixture(t *testing.T) *cloudFixture {
	t.Helper()
	f := &cloudFixture{backend: registry.New(t, registry.Options{Username: "backend", Password: "b4ckend"})}
	f.backend.Push(t, "app", "v1", registry.FluxArtifact(t, map[string]string{"manifest.yaml": "kind: ConfigMap"}, "", ""))
	f.Clouds = cloudid.New(t, f.backend)
	return f
}

// login is a Login over the fixture's environment, with edit applied to a
// copy of it.
func (f *cloudFixture) login(cache *providertoken.Cache, edit func(env map[string]string)) *registrylogin.Login {
	env := maps.Clone(f.Env)
	if edit != nil {
		edit(env)
	}
	return &registrylogin.Login{Tokens: cache, RootCAs: f.Roots, Getenv: sourcetest.Getenv(env),
		Aliases: f.Aliases()}
}

// source is an OCIRepository source trusting the fronts' certificates in
// namespaces default and tenant-b.
func (f *cloudFixture) source(t *testing.T, login *registrylogin.Login) *Source {
	data := map[string][]byte{"ca.crt": f.CACerts()}
	other := secret("fronts-ca", data)
	other.Namespace = "tenant-b"
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "tenant-identity"}}
	return &Source{Secrets: kube(t, secret("fronts-ca", data), other, sa), Cloud: login}
}

// cloudSpec is an OCIRepositorySpec of the app on front with provider.
func cloudSpec(front *cloudid.Registry, provider string) sourcev1.OCIRepositorySpec {
	return sourcev1.OCIRepositorySpec{URL: "oci://" + front.Host() + "/app", Provider: provider,
		Reference: &sourcev1.OCIRepositoryRef{Tag: "v1"}, CertSecretRef: &meta.LocalObjectReference{Name: "fronts-ca"}}
}

func TestCloudProviders(t *testing.T) {
	f := newCloudFixture(t)
	cache := providertoken.NewCache(0, nil)
	src := f.source(t, f.login(cache, nil))
	for _, tc := range []struct {
		provider string
		front    *cloudid.Registry
		minted   func() int
	}{
		{sourcev1.AmazonOCIProvider, f.ECR, f.AWS.LoginsMinted},
		{sourcev1.GoogleOCIProvider, f.GAR, f.GCP.Minted},
		{sourcev1.AzureOCIProvider, f.ACR, f.ACR.RefreshTokensMinted},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			for i := range 2 {
				rev, _, files, err := sourcetest.Fetch(t, src, request(cloudSpec(tc.front, tc.provider)))
				must(t, err)
				if !strings.HasPrefix(rev, "v1@sha256:") || files["manifest.yaml"] != "kind: ConfigMap" {
					t.Fatalf("fetch %d: revision %q, files %v", i, rev, files)
				}
			}
			if n := tc.minted(); n != 1 {
				t.Errorf("logins minted for two fetches of one namespace: %d, want 1 (the second from cache)", n)
			}
			// Another namespace gets a login of its own.
			req := request(cloudSpec(tc.front, tc.provider))
			req.Job.Object.Namespace = "tenant-b"
			if _, _, _, err := sourcetest.Fetch(t, src, req); err != nil {
				t.Fatal(err)
			}
			if n := tc.minted(); n != 2 {
				t.Errorf("logins minted after a fetch of another namespace: %d, want 2", n)
			}
		})
	}
	if got := f.AWS.SessionNames(); len(got) == 0 || !strings.HasPrefix(got[0], "aws-go-sdk-") {
		t.Errorf("STS role sessions %v, want the SDK's default session name", got)
	}
	// Without a login the registry refuses: the token is what lets the
	// pull through.
	_, _, _, err := sourcetest.Fetch(t, f.source(t, f.login(nil, nil)), request(cloudSpec(f.ECR, sourcev1.GenericOCIProvider)))
	sourcetest.CheckFailure(t, err, sourcev1.OCIPullFailedReason, failure.Final, "UNAUTHORIZED")
}

func TestCloudProviderFailures(t *testing.T) {
	f := newCloudFixture(t)
	forged := filepath.Join(t.TempDir(), "forged")
	must(t, os.WriteFile(forged, []byte(forgedToken), 0o600))
	cases := []struct {
		name     string
		provider string
		front    *cloudid.Registry
		env      func(map[string]string)
		fault    func() func()
		sa       string
		unalias  bool
		reason   string
		handling failure.Handling
		message  string
	}{
		{name: "wrong role ARN", provider: "aws", front: f.ECR,
			env:    func(e map[string]string) { e[providertoken.EnvAWSRoleARN] = "arn:aws:iam::123456789012:role/other" },
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: "failed to get credential from aws: failed to retrieve credentials: operation error STS: AssumeRoleWithWebIdentity, https response error StatusCode: 403"},
		{name: "forged web identity token", provider: "aws", front: f.ECR,
			env:    func(e map[string]string) { e[providertoken.EnvAWSWebIdentityTokenFile] = forged },
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Final, message: "InvalidIdentityToken"},
		{name: "no AWS identity", provider: "aws", front: f.ECR,
			env:    func(e map[string]string) { delete(e, providertoken.EnvAWSRoleARN) },
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Final, message: "eks.amazonaws.com/role-arn"},
		{name: "STS answers 500", provider: "aws", front: f.ECR,
			fault:  func() func() { f.AWS.FailWith(http.StatusInternalServerError); return func() { f.AWS.FailWith(0) } },
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient, message: "StatusCode: 500"},
		{name: "STS hangs", provider: "aws", front: f.ECR,
			fault:  func() func() { f.AWS.Hang(true); return func() { f.AWS.Hang(false) } },
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient, message: "deadline exceeded"},
		{name: "not an ECR host", provider: "aws", front: f.ECR, unalias: true,
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling, message: "invalid AWS registry: '" + f.ECR.Host() + "'"},
		{name: "metadata server answers 500", provider: "gcp", front: f.GAR,
			fault:  func() func() { f.GCP.FailWith(http.StatusInternalServerError); return func() { f.GCP.FailWith(0) } },
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient, message: "compute: Received 500"},
		{name: "not a GAR host", provider: "gcp", front: f.ECR,
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling, message: "invalid GCP registry"},
		{name: "forged client assertion", provider: "azure", front: f.ACR,
			env:    func(e map[string]string) { e[providertoken.EnvAzureFederatedTokenFile] = forged },
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Final, message: "AADSTS700211"},
		{name: "ACR exchange answers 500", provider: "azure", front: f.ACR,
			fault:  func() func() { f.ACR.FailWith(http.StatusInternalServerError); return func() { f.ACR.FailWith(0) } },
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient, message: "/oauth2/exchange"},
		{name: "serviceAccountName, gate off", provider: "azure", front: f.ACR, sa: "tenant-identity",
			reason: meta.FeatureGateDisabledReason, handling: failure.Stalling,
			message: "to use spec.serviceAccountName for provider authentication please enable the ObjectLevelWorkloadIdentity feature gate in the controller"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			login := f.login(providertoken.NewCache(0, nil), tc.env)
			if tc.unalias {
				login.Aliases = nil
			}
			if tc.fault != nil {
				defer tc.fault()()
			}
			spec := cloudSpec(tc.front, tc.provider)
			spec.ServiceAccountName = tc.sa
			spec.Timeout = &metav1.Duration{Duration: 2 * time.Second}
			src := f.source(t, login)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			_, err := src.Resolve(ctx, request(spec))
			sourcetest.CheckFailure(t, err, tc.reason, tc.handling, tc.message)
		})
	}
}

// TestCloudLoginIsRateLimited: the token endpoints' requests pass the host
// limiter as the registry's do: while STS's host is held, the fetch sends
// it nothing and learns of the hold.
func TestCloudLoginIsRateLimited(t *testing.T) {
	f := newCloudFixture(t)
	l := &hostlimit.Limiter{Rules: hostlimit.Rules{}, Store: &hostlimit.MemoryStore{}, MaxWait: time.Second}
	stsHost := strings.TrimPrefix(f.AWS.URL(), "http://")
	must(t, l.Hold(t.Context(), stsHost, time.Now().Add(time.Hour)))
	login := f.login(nil, nil)
	login.Limiter = l
	ctx, tracker := hostlimit.Track(t.Context())
	if _, err := f.source(t, login).Resolve(ctx, request(cloudSpec(f.ECR, "aws"))); failure.As(err) == nil {
		t.Fatalf("resolve with STS's host held: %v, want a failure", err)
	}
	if h := tracker.Held(); h == nil || h.Host != stsHost {
		t.Errorf("the fetch learned of hold %v, want STS's host %s", h, stsHost)
	}
	if n := f.AWS.CredentialsMinted(); n != 0 {
		t.Errorf("STS issued %d credentials while held, want none asked for", n)
	}
}
