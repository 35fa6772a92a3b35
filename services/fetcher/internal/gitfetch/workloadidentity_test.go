package gitfetch

import (
	"context"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
	"github.com/headwater-gitops/headwater/testsupport/cloudid"
)

// TestAzureObjectLevelIdentity: with the gate on, a GitRepository with
// provider azure and spec.serviceAccountName clones Azure DevOps with an
// Entra ID token of the application its ServiceAccount's annotations name,
// the client assertion a TokenRequest token (audience
// api://AzureADTokenExchange, subject system:serviceaccount:default:git-reader)
// of a real API server, which the tenant checks as a federated credential
// does; the fetcher has no workload identity of its own. Another
// ServiceAccount of the same application is refused.
func TestAzureObjectLevelIdentity(t *testing.T) {
	c := sourcetest.StartAPIServer(t)

	f := newEntraFixture(t)
	app := map[string]string{workloadidentity.AnnotationAzureClientID: f.tenant.ClientID, workloadidentity.AnnotationAzureTenantID: f.tenant.TenantID}
	sourcetest.CreateServiceAccounts(t, c, map[string]map[string]string{"git-reader": app, "other": app})
	f.tenant.Trust = cloudid.ServiceAccountTrust(workloadidentity.AudienceAzure, map[string]string{f.tenant.ClientID: "default/git-reader"})
	src := &Source{Tokens: providertoken.NewCache(0, nil), TokenRootCAs: f.roots,
		Getenv:   sourcetest.Getenv(map[string]string{"AZURE_AUTHORITY_HOST": f.tenant.AuthorityHost()}),
		Accounts: &workloadidentity.Accounts{Client: c, Enabled: true}}
	resolve := func(sa string) error {
		req := request(f.git.RepoURL("repo"), &sourcev1.GitRepositoryRef{Branch: "master"})
		req.GitRepository.Provider = sourcev1.GitProviderAzure
		req.GitRepository.ServiceAccountName = sa
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		res, err := src.Resolve(ctx, req)
		if err != nil {
			return err
		}
		if c, ok := res.(interface{ Close() error }); ok {
			_ = c.Close()
		}
		return nil
	}
	must(t, resolve("git-reader"))
	if n := f.tenant.Minted(); n != 1 {
		t.Errorf("Entra ID minted %d tokens, want 1", n)
	}
	err := resolve("other")
	checkProviderFailure(t, err, sourcev1.AuthenticationFailedReason, failure.Final, "AADSTS700211")
}
