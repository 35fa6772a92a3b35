package helmchartfetch

import (
	"context"
	"testing"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
	"github.com/headwater-gitops/headwater/testsupport/cloudid"
)

// TestFetchChartOCIDefaultServiceAccount: an OCI HelmRepository names no
// ServiceAccount; with the gate on and -default-service-account, its
// chart is pulled from ECR as that ServiceAccount of the repository's
// namespace (a TokenRequest token of a real API server, which STS checks),
// never as the fetcher (whose own token STS refuses here); where the
// default ServiceAccount does not exist, Flux's lockdown message.
func TestFetchChartOCIDefaultServiceAccount(t *testing.T) {
	c := sourcetest.StartAPIServer(t)
	sourcetest.CreateServiceAccounts(t, c, map[string]map[string]string{
		"tenant-default": {workloadidentity.AnnotationAWSRoleARN: cloudid.RoleARN}})

	clouds := newChartClouds(t)
	clouds.AWS.Trust = cloudid.ServiceAccountTrust(workloadidentity.AudienceAWS, map[string]string{cloudid.RoleARN: "default/tenant-default"})
	source := func(defaultSA string) *Source {
		s := cloudSource(t, clouds)
		s.Accounts = &workloadidentity.Accounts{Client: c, Enabled: true, Default: defaultSA}
		return s
	}
	repo := cloudRepo(clouds.ECR, "aws")
	fetchChart(t, source("tenant-default"), request(sourcev1.HelmChartSpec{Chart: "podinfo"}, repo), "podinfo", "6.1.0",
		"pulled 'podinfo' chart with version '6.1.0'")

	_, err := source("absent").Resolve(context.Background(), request(sourcev1.HelmChartSpec{Chart: "podinfo"}, repo))
	sourcetest.CheckFailure(t, err, sourcev1.AuthenticationFailedReason, failure.Final,
		"failed to get service account 'default/absent': the specified default service account does not exist in the object namespace")

	// Without the default, the fetcher's own identity, which this STS
	// does not trust.
	_, err = source("").Resolve(context.Background(), request(sourcev1.HelmChartSpec{Chart: "podinfo"}, repo))
	sourcetest.CheckFailure(t, err, sourcev1.AuthenticationFailedReason, failure.Final, "AccessDenied")

	// provider gcp: the default ServiceAccount's token for the GKE pool,
	// exchanged at Google's STS, impersonating its Google service account,
	// pulls from GAR; the fetcher's own (metadata server) token is never
	// asked for.
	impersonate := map[string]string{workloadidentity.AnnotationGCPServiceAccount: cloudid.GCPServiceAccount}
	sourcetest.CreateServiceAccounts(t, c, map[string]map[string]string{"tenant-gcp": impersonate, "tenant-gcp-2": impersonate})
	clouds.GCPSTS.Trust = cloudid.PoolTrust(cloudid.GCPPool, "default/tenant-gcp", "default/tenant-gcp-2")
	clouds.GCPSTS.Impersonators = map[string][]string{cloudid.GCPServiceAccount: {"default/tenant-gcp"}}
	gar := cloudRepo(clouds.GAR, "gcp")
	fetchChart(t, source("tenant-gcp"), request(sourcev1.HelmChartSpec{Chart: "podinfo"}, gar), "podinfo", "6.1.0",
		"pulled 'podinfo' chart with version '6.1.0'")
	if n := clouds.GCPSTS.Impersonations(); n != 1 {
		t.Errorf("impersonations: %d, want 1", n)
	}
	if n := clouds.GCP.Minted(); n != 0 {
		t.Errorf("the metadata server minted %d tokens of the fetcher's own identity, want 0", n)
	}
	// Impersonation refused: the Google service account does not let this
	// ServiceAccount's principal impersonate it.
	_, err = source("tenant-gcp-2").Resolve(context.Background(), request(sourcev1.HelmChartSpec{Chart: "podinfo"}, gar))
	sourcetest.CheckFailure(t, err, sourcev1.AuthenticationFailedReason, failure.Final, "iam.serviceAccounts.getAccessToken' denied")
}
