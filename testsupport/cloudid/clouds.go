package cloudid

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"github.com/headwater-gitops/headwater/testsupport/registry"
	"github.com/headwater-gitops/headwater/testsupport/tokenserver"
)

// The identity of the fetcher as the clouds' webhooks project it, and the
// cloud registry names the fronts stand for.
const (
	// RoleARN is the IAM role of the fetcher's service account (IRSA).
	RoleARN = "arn:aws:iam::123456789012:role/headwater-fetcher"
	// ServiceAccountToken is the projected token STS and Entra ID trust.
	ServiceAccountToken = "eyJhbGciOiJSUzI1NiJ9.fetcher-service-account-token.sig"
	// TenantID and ClientID are the Entra ID application of the fetcher.
	TenantID, ClientID = "72f988bf-86f1-41af-91ab-2d7cd011db47", "7e1d8a3c-2f9b-4c1e-9d5a-0b6c1f2e3d4a"
	// Region is ECR's.
	Region = "eu-west-3"
	// ECRName, ACRName and GARName are the registry names the fronts
	// stand for.
	ECRName = "123456789012.dkr.ecr." + Region + ".amazonaws.com"
	ACRName = "headwater.azurecr.io"
	GARName = "europe-west1-docker.pkg.dev"
	// ACRScope is the scope Entra ID issues ACR exchange tokens for.
	ACRScope = "https://containerregistry.azure.net/.default"
)

// Clouds are the three clouds' identity endpoints, a front of one registry
// for each, and the environment of a fetcher whose identity they trust.
type Clouds struct {
	AWS *AWS
	GCP *GCPMetadata
	// GCPSTS is Google's STS and IAM Credentials, for a ServiceAccount's
	// workload identity; it trusts no token until its Trust is set.
	GCPSTS        *GCPSTS
	Entra         *tokenserver.EntraID
	ECR, ACR, GAR *Registry
	// Env is the fetcher's environment: IRSA's, the Azure workload
	// identity's, GCE_METADATA_HOST, and the STS (AWS's and Google's), ECR
	// and IAM Credentials endpoints.
	Env map[string]string
	// Roots trust Entra ID and the fronts.
	Roots *x509.CertPool
}

// New starts the clouds in front of backend (which must require a user
// name and password) for the test, and stops them when it ends.
func New(tb testing.TB, backend *registry.Server) *Clouds {
	tb.Helper()
	must := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
	}
	c := &Clouds{AWS: &AWS{RoleARN: RoleARN, WebIdentityToken: ServiceAccountToken, Region: Region}, GCP: &GCPMetadata{},
		Entra: &tokenserver.EntraID{TenantID: TenantID, ClientID: ClientID, Assertion: ServiceAccountToken, Scope: ACRScope}}
	must(c.AWS.Start())
	tb.Cleanup(func() { _ = c.AWS.Close() })
	must(c.GCP.Start())
	tb.Cleanup(func() { _ = c.GCP.Close() })
	c.GCPSTS = &GCPSTS{Audience: GCPAudience}
	must(c.GCPSTS.Start())
	tb.Cleanup(func() { _ = c.GCPSTS.Close() })
	must(c.Entra.Start("127.0.0.1:0"))
	tb.Cleanup(func() { _ = c.Entra.Stop() })
	front := func(accept func(string, string) bool, service string) *Registry {
		r := &Registry{Backend: backend, Accept: accept, Service: service, ValidAccessToken: c.Entra.Valid}
		must(r.Start())
		tb.Cleanup(func() { _ = r.Close() })
		return r
	}
	c.ECR, c.GAR, c.ACR = front(c.AWS.ValidLogin, ECRName), front(func(u, p string) bool { return c.GCP.ValidLogin(u, p) || c.GCPSTS.ValidLogin(u, p) }, GARName), front(nil, ACRName)
	c.Roots = x509.NewCertPool()
	for _, pem := range [][]byte{c.Entra.CACert(), c.CACerts()} {
		if !c.Roots.AppendCertsFromPEM(pem) {
			tb.Fatal("cloudid: bad CA certificate")
		}
	}
	tokenFile := filepath.Join(tb.TempDir(), "token")
	must(os.WriteFile(tokenFile, []byte(ServiceAccountToken+"\n"), 0o600))
	c.Env = map[string]string{
		"AWS_ROLE_ARN": RoleARN, "AWS_WEB_IDENTITY_TOKEN_FILE": tokenFile,
		"AWS_ENDPOINT_URL_STS": c.AWS.URL(), "AWS_ENDPOINT_URL_ECR": c.AWS.URL(),
		"GCE_METADATA_HOST":          c.GCP.Host(),
		"HEADWATER_GCP_STS_ENDPOINT": c.GCPSTS.URL(), "HEADWATER_GCP_IAM_CREDENTIALS_ENDPOINT": c.GCPSTS.URL(),
		"AZURE_CLIENT_ID": ClientID, "AZURE_TENANT_ID": TenantID,
		"AZURE_FEDERATED_TOKEN_FILE": tokenFile, "AZURE_AUTHORITY_HOST": c.Entra.AuthorityHost(),
	}
	return c
}

// Aliases map each front's host:port to the registry name it stands for.
func (c *Clouds) Aliases() map[string]string {
	return map[string]string{c.ECR.Host(): ECRName, c.ACR.Host(): ACRName, c.GAR.Host(): GARName}
}

// CACerts are the PEM certificates of the fronts' authorities, as a
// certSecretRef's ca.crt.
func (c *Clouds) CACerts() []byte {
	var b []byte
	for _, r := range []*Registry{c.ECR, c.ACR, c.GAR} {
		b = append(b, r.CACert()...)
	}
	return b
}
