package ocifetch

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
	"github.com/headwater-gitops/headwater/testsupport/cloudid"
)

// kubeSource is an OCIRepository source reading its Secrets and
// ServiceAccounts from the API server of c, whose identities Accounts
// give under the gate, with defaultSA as -default-service-account; the
// fronts' CA is in Secret default/fronts-ca.
func (f *cloudFixture) kubeSource(t *testing.T, c client.Client, cache *providertoken.Cache, defaultSA string) *Source {
	ca := secret("fronts-ca", map[string][]byte{"ca.crt": f.CACerts()})
	if err := c.Create(t.Context(), ca); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return &Source{Secrets: secrets.NewKube(c), Cloud: f.login(cache, nil),
		Accounts: &workloadidentity.Accounts{Client: c, Enabled: true, Default: defaultSA}}
}

// TestObjectLevelWorkloadIdentity: with the gate on, an OCIRepository's
// spec.serviceAccountName (or the default service account) logs in to ECR
// and ACR as that ServiceAccount: a TokenRequest token for the cloud's
// audience whose subject is system:serviceaccount:<ns>:<name>, which the
// clouds' test servers check as a trust policy does; each failure has a
// clear condition.
func TestObjectLevelWorkloadIdentity(t *testing.T) {
	c := sourcetest.StartAPIServer(t)
	ctx := t.Context()
	const otherRole = "arn:aws:iam::123456789012:role/other"
	accounts := map[string]map[string]string{
		"tenant-aws":   {workloadidentity.AnnotationAWSRoleARN: cloudid.RoleARN},
		"tenant-aws-2": {workloadidentity.AnnotationAWSRoleARN: cloudid.RoleARN}, // not trusted by the role
		"other-role":   {workloadidentity.AnnotationAWSRoleARN: otherRole},
		"tenant-azure": {workloadidentity.AnnotationAzureClientID: cloudid.ClientID, workloadidentity.AnnotationAzureTenantID: cloudid.TenantID},
		"bare":         nil,
	}
	sourcetest.CreateServiceAccounts(t, c, accounts)
	f := newCloudFixture(t)
	f.AWS.Trust = cloudid.ServiceAccountTrust(workloadidentity.AudienceAWS, map[string]string{cloudid.RoleARN: "default/tenant-aws"})
	f.Entra.Trust = cloudid.ServiceAccountTrust(workloadidentity.AudienceAzure, map[string]string{cloudid.ClientID: "default/tenant-azure"})

	for _, tc := range []struct {
		name, provider, sa, defaultSA string
		front                         *cloudid.Registry
		status                        int // the identity endpoint's answer
		reason                        string
		handling                      failure.Handling
		message                       string
	}{
		{name: "aws", provider: "aws", sa: "tenant-aws", front: f.ECR},
		{name: "azure", provider: "azure", sa: "tenant-azure", front: f.ACR},
		{name: "aws default service account", provider: "aws", defaultSA: "tenant-aws", front: f.ECR},
		{name: "spec wins over default", provider: "azure", sa: "tenant-azure", defaultSA: "tenant-aws", front: f.ACR},
		{name: "another service account with the same role", provider: "aws", sa: "tenant-aws-2", front: f.ECR,
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: "AccessDenied: Not authorized to perform sts:AssumeRoleWithWebIdentity: subject \"system:serviceaccount:default:tenant-aws-2\""},
		{name: "wrong role ARN", provider: "aws", sa: "other-role", front: f.ECR,
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Final, message: "AccessDenied"},
		{name: "no role ARN annotation", provider: "aws", sa: "bare", front: f.ECR,
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: "failed to get provider identity from service account 'default/bare' annotations: invalid AWS role ARN: ''"},
		{name: "no client-id annotation", provider: "azure", sa: "bare", front: f.ACR,
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: "the annotations azure.workload.identity/client-id and azure.workload.identity/tenant-id must both be set"},
		// An OCIRepository's ServiceAccount is read first for its image
		// pull secrets, as in Flux: missing, the fetch is retried.
		{name: "service account missing", provider: "aws", sa: "absent", front: f.ECR,
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient,
			message: "failed to get service account 'default/absent': serviceaccounts \"absent\" not found"},
		{name: "default service account missing", provider: "aws", defaultSA: "absent", front: f.ECR,
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: "the specified default service account does not exist in the object namespace"},
		{name: "STS answers 500", provider: "aws", sa: "tenant-aws", front: f.ECR, status: http.StatusInternalServerError,
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient, message: "StatusCode: 500"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.AWS.FailWith(tc.status)
			defer f.AWS.FailWith(0)
			src := f.kubeSource(t, c, providertoken.NewCache(0, nil), tc.defaultSA)
			spec := cloudSpec(tc.front, tc.provider)
			spec.ServiceAccountName = tc.sa
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := src.Resolve(rctx, request(spec))
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("resolve: %v", err)
				}
				return
			}
			sourcetest.CheckFailure(t, err, tc.reason, tc.handling, tc.message)
		})
	}
	if names := f.AWS.SessionNames(); !slices.Contains(names, "tenant-aws.default."+cloudid.Region+".fluxcd.io") {
		t.Errorf("STS session names %q, want Flux's <name>.<namespace>.<region>.fluxcd.io", names)
	}
}

// TestObjectLevelCacheKey: the cached login of one ServiceAccount is never
// another's, even with the same role in the same namespace, and a second
// fetch as the same ServiceAccount reuses it.
func TestObjectLevelCacheKey(t *testing.T) {
	c := sourcetest.StartAPIServer(t)
	role := map[string]string{workloadidentity.AnnotationAWSRoleARN: cloudid.RoleARN}
	sourcetest.CreateServiceAccounts(t, c, map[string]map[string]string{"a": role, "b": role})
	f := newCloudFixture(t)
	f.AWS.Trust = func(role, token string) error {
		return cloudid.ServiceAccountTrust(workloadidentity.AudienceAWS, map[string]string{role: "default/a"})(role, token)
	}
	cache := providertoken.NewCache(0, nil)
	src := f.kubeSource(t, c, cache, "")
	resolve := func(sa string) error {
		spec := cloudSpec(f.ECR, "aws")
		spec.ServiceAccountName = sa
		_, err := src.Resolve(t.Context(), request(spec))
		return err
	}
	must(t, resolve("a"))
	must(t, resolve("a"))
	if n := f.AWS.CredentialsMinted(); n != 1 {
		t.Errorf("STS minted %d credentials for two fetches as default/a, want 1 (cached)", n)
	}
	if err := resolve("b"); failure.As(err) == nil {
		t.Fatalf("fetch as default/b with a's cached login: %v, want STS's refusal", err)
	}
}

// TestGCPObjectLevelWorkloadIdentity: with the gate on, an OCIRepository
// with provider gcp and spec.serviceAccountName pulls from GAR as its
// ServiceAccount, as Flux's fluxcd/pkg/auth/gcp does: a TokenRequest token
// for the GKE workload identity pool (<project>.svc.id.goog, read from the
// metadata server), exchanged at Google's STS for the audience
// identitynamespace:<pool>:<cluster URL>, and, with
// iam.gke.io/gcp-service-account, impersonating that Google service
// account; the registry login is oauth2accesstoken with the resulting
// token. STS and IAM Credentials are the test servers of the fetcher's
// environment, which check every field and the token's subject.
func TestGCPObjectLevelWorkloadIdentity(t *testing.T) {
	c := sourcetest.StartAPIServer(t)
	ctx := t.Context()
	const otherProvider = "projects/123456/locations/global/workloadIdentityPools/other/providers/headwater"
	accounts := map[string]map[string]string{
		"tenant-gcp":       nil,
		"tenant-gcp-imp":   {workloadidentity.AnnotationGCPServiceAccount: cloudid.GCPServiceAccount},
		"not-impersonator": {workloadidentity.AnnotationGCPServiceAccount: cloudid.GCPServiceAccount},
		"untrusted":        nil,
		"bad-email":        {workloadidentity.AnnotationGCPServiceAccount: "fetcher@example.com"},
		"other-provider":   {workloadidentity.AnnotationGCPWorkloadIdentityProvider: otherProvider},
		"bad-provider":     {workloadidentity.AnnotationGCPWorkloadIdentityProvider: "pools/x"},
	}
	sourcetest.CreateServiceAccounts(t, c, accounts)
	f := newCloudFixture(t)
	f.GCPSTS.Trust = cloudid.PoolTrust(cloudid.GCPPool, "default/tenant-gcp", "default/tenant-gcp-imp", "default/not-impersonator",
		"default/other-provider")
	f.GCPSTS.Impersonators = map[string][]string{cloudid.GCPServiceAccount: {"default/tenant-gcp-imp"}}

	for _, tc := range []struct {
		name, sa    string
		status      int // STS's answer
		impersonate bool
		reason      string
		handling    failure.Handling
		message     string
	}{
		{name: "federated token", sa: "tenant-gcp"},
		{name: "impersonation", sa: "tenant-gcp-imp", impersonate: true},
		{name: "impersonation refused", sa: "not-impersonator", reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: "status code 403: {\"error\":\"PERMISSION_DENIED\",\"error_description\":\"Permission 'iam.serviceAccounts.getAccessToken' denied"},
		{name: "token not trusted by the pool", sa: "untrusted", reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: "subject \\\"system:serviceaccount:default:untrusted\\\""},
		{name: "wrong audience", sa: "other-provider", reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: "invalid_target"},
		{name: "invalid service account email", sa: "bad-email", reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: "invalid iam.gke.io/gcp-service-account annotation: 'fetcher@example.com'"},
		{name: "invalid workload identity provider", sa: "bad-provider", reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: "invalid gcp.auth.fluxcd.io/workload-identity-provider annotation: 'pools/x'"},
		{name: "STS answers 500", sa: "tenant-gcp", status: http.StatusInternalServerError,
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient, message: "status code 500"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.GCPSTS.FailWith(tc.status)
			defer f.GCPSTS.FailWith(0)
			before := f.GCPSTS.Impersonations()
			src := f.kubeSource(t, c, providertoken.NewCache(0, nil), "")
			spec := cloudSpec(f.GAR, sourcev1.GoogleOCIProvider)
			spec.ServiceAccountName = tc.sa
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := src.Resolve(rctx, request(spec))
			if tc.reason != "" {
				sourcetest.CheckFailure(t, err, tc.reason, tc.handling, tc.message)
				return
			}
			if err != nil {
				t.Fatalf("resolve: %v", err)
			}
			if got := f.GCPSTS.Impersonations() - before; (got == 1) != tc.impersonate {
				t.Errorf("impersonations: %d, want impersonation %v", got, tc.impersonate)
			}
		})
	}
	if n := f.GCP.Minted(); n != 0 {
		t.Errorf("the metadata server minted %d tokens of the fetcher's own identity, want 0: every login is the ServiceAccount's", n)
	}
}
