package helmchartfetch

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v3/pkg/registry"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/registrylogin"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets/secretstest"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	"github.com/headwater-gitops/headwater/testsupport/cloudid"
	registryserver "github.com/headwater-gitops/headwater/testsupport/registry"
)

// TestFetchChartOCIDefaultServiceAccount: an OCI HelmRepository names no
// ServiceAccount; with the gate on and -default-service-account, its
// chart is pulled from ECR as that ServiceAccount of the repository's
// namespace (a TokenRequest token of a real API server, which STS checks),
// never as the fetcher (whose own token STS refuses here); where the
// default ServiceAccount does not exist, Flux's lockdown message.
func TestFetchChartOCIDefaultServiceAccount(t *testing.T) {
	c := sourcetest.StartAPIServer(t)
	must(t, c.Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "tenant-default",
		Annotations: map[string]string{workloadidentity.AnnotationAWSRoleARN: cloudid.RoleARN}}}))

	backend := registryserver.New(t, registryserver.Options{Username: "helm", Password: "oci"})
	push, err := registry.NewClient(registry.ClientOptPlainHTTP(), registry.ClientOptWriter(io.Discard),
		registry.ClientOptBasicAuth("helm", "oci"), registry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "creds.json")))
	must(t, err)
	p, err := chartrepo.Package(t.TempDir(), chartrepo.Chart{Name: "podinfo", Version: "6.1.0"})
	must(t, err)
	data, err := os.ReadFile(p)
	must(t, err)
	_, err = push.Push(data, backend.Host+"/charts/podinfo:6.1.0")
	must(t, err)
	clouds := cloudid.New(t, backend)
	clouds.AWS.Trust = cloudid.ServiceAccountTrust(workloadidentity.AudienceAWS, map[string]string{cloudid.RoleARN: "default/tenant-default"})
	env := clouds.Env
	source := func(defaultSA string) *Source {
		return &Source{
			Secrets: secretstest.Reader(t, "default", map[string]map[string]string{"fronts-ca": {"ca.crt": string(clouds.CACerts())}}),
			Cloud: &registrylogin.Login{Tokens: providertoken.NewCache(0, nil), RootCAs: clouds.Roots, Aliases: clouds.Aliases(),
				Getenv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }},
			Accounts: &workloadidentity.Accounts{Client: c, Enabled: true, Default: defaultSA},
		}
	}
	repo := &events.ChartSource{Kind: sourcev1.HelmRepositoryKind, Name: "oci", HelmRepository: &sourcev1.HelmRepositorySpec{
		URL: "oci://" + clouds.ECR.Host() + "/charts", Type: sourcev1.HelmRepositoryTypeOCI, Provider: "aws",
		CertSecretRef: &meta.LocalObjectReference{Name: "fronts-ca"}}}
	fetchChart(t, source("tenant-default"), request(sourcev1.HelmChartSpec{Chart: "podinfo"}, repo), "podinfo", "6.1.0",
		"pulled 'podinfo' chart with version '6.1.0'")

	_, err = source("absent").Resolve(context.Background(), request(sourcev1.HelmChartSpec{Chart: "podinfo"}, repo))
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
	for _, name := range []string{"tenant-gcp", "tenant-gcp-2"} {
		must(t, c.Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Annotations: map[string]string{workloadidentity.AnnotationGCPServiceAccount: cloudid.GCPServiceAccount}}}))
	}
	clouds.GCPSTS.Trust = cloudid.PoolTrust(cloudid.GCPPool, "default/tenant-gcp", "default/tenant-gcp-2")
	clouds.GCPSTS.Impersonators = map[string][]string{cloudid.GCPServiceAccount: {"default/tenant-gcp"}}
	gar := &events.ChartSource{Kind: sourcev1.HelmRepositoryKind, Name: "oci", HelmRepository: &sourcev1.HelmRepositorySpec{
		URL: "oci://" + clouds.GAR.Host() + "/charts", Type: sourcev1.HelmRepositoryTypeOCI, Provider: "gcp",
		CertSecretRef: &meta.LocalObjectReference{Name: "fronts-ca"}}}
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
