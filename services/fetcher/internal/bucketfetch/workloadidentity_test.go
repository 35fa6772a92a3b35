package bucketfetch

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
	"github.com/headwater-gitops/headwater/testsupport/azuritetest"
	"github.com/headwater-gitops/headwater/testsupport/cloudid"
	"github.com/headwater-gitops/headwater/testsupport/fakegcstest"
	"github.com/headwater-gitops/headwater/testsupport/tokenserver"
)

// TestGCPBucketObjectLevelWorkloadIdentity: with the gate on, a Bucket with
// provider gcp and spec.serviceAccountName lists and downloads with its
// ServiceAccount's Google identity: the TokenRequest token for the GKE
// pool, exchanged at the test STS of the fetcher's environment (which
// checks its audience and subject), impersonating the Google service
// account of iam.gke.io/gcp-service-account. The bucket (fake-gcs-server
// behind a proxy) accepts only the tokens that STS and IAM Credentials
// issued. Then the bad-input rows: impersonation refused, a token the pool
// does not trust, STS answering 500.
func TestGCPBucketObjectLevelWorkloadIdentity(t *testing.T) {
	c := sourcetest.StartAPIServer(t)
	sourcetest.CreateServiceAccounts(t, c, map[string]map[string]string{
		"reader":           {workloadidentity.AnnotationGCPServiceAccount: cloudid.GCPServiceAccount},
		"federated":        nil,
		"not-impersonator": {workloadidentity.AnnotationGCPServiceAccount: cloudid.GCPServiceAccount},
		"untrusted":        nil,
	})
	metadata := &cloudid.GCPMetadata{}
	must(t, metadata.Start())
	t.Cleanup(func() { _ = metadata.Close() })
	sts := &cloudid.GCPSTS{Audience: cloudid.GCPAudience,
		Trust:         cloudid.PoolTrust(cloudid.GCPPool, "default/reader", "default/federated", "default/not-impersonator"),
		Impersonators: map[string][]string{cloudid.GCPServiceAccount: {"default/reader"}}}
	must(t, sts.Start())
	t.Cleanup(func() { _ = sts.Close() })
	env := map[string]string{"GCE_METADATA_HOST": metadata.Host(),
		providertoken.EnvGCPSTSEndpoint: sts.URL(), providertoken.EnvGCPIAMCredentialsEndpoint: sts.URL()}

	srv := fakegcstest.New(t)
	srv.MakeBucket(t, "bkt")
	srv.Put(t, "bkt", "app/config.yaml", "replicas: 3\n")
	bucket := newGCSFaults(t, srv.Endpoint)
	// The bucket takes only the tokens the test STS issued.
	bucket.inject(func(r *http.Request) int {
		if !sourcetest.BearerValid(r, func(token string) bool { return sts.ValidLogin("oauth2accesstoken", token) }) {
			return http.StatusUnauthorized
		}
		return 0
	})

	for _, tc := range []struct {
		name, sa    string
		status      int // STS's answer
		impersonate bool
		handling    failure.Handling
		message     string
	}{
		{name: "impersonation", sa: "reader", impersonate: true},
		{name: "federated token", sa: "federated"},
		{name: "impersonation refused", sa: "not-impersonator", handling: failure.Final,
			message: "Permission 'iam.serviceAccounts.getAccessToken' denied"},
		{name: "token not trusted by the pool", sa: "untrusted", handling: failure.Final,
			message: "system:serviceaccount:default:untrusted"},
		{name: "STS answers 500", sa: "reader", status: http.StatusInternalServerError, handling: failure.Transient,
			message: "status code 500"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sts.FailWith(tc.status)
			defer sts.FailWith(0)
			before := sts.Impersonations()
			src := &Source{Concurrency: 1, gcsBackoff: time.Millisecond, Tokens: providertoken.NewCache(0, nil),
				Getenv:   sourcetest.Getenv(env),
				Accounts: &workloadidentity.Accounts{Client: c, Enabled: true}}
			spec := sourcev1.BucketSpec{Provider: sourcev1.BucketProviderGoogle, BucketName: "bkt", Endpoint: bucket.hostPort(),
				Insecure: true, ServiceAccountName: tc.sa}
			checkFetchAs(t, src, spec, tc.handling, tc.message)
			if tc.message != "" {
				return
			}
			if got := sts.Impersonations() - before; (got > 0) != tc.impersonate {
				t.Errorf("impersonations: %d, want impersonation %v", got, tc.impersonate)
			}
		})
	}
	if n := metadata.Minted(); n != 0 {
		t.Errorf("the metadata server minted %d tokens of the fetcher's own identity, want 0", n)
	}
	// Without a token, or with one the STS never issued, the bucket
	// refuses: the successes above are the tokens'.
	sourcetest.CheckRefusesForgedBearer(t, nil, "http://"+bucket.hostPort()+"/storage/v1/b/bkt/o", http.StatusUnauthorized)
}

// TestAzureBucketObjectLevelWorkloadIdentity: with the gate on, a Bucket
// with provider azure and spec.serviceAccountName lists and downloads with
// its ServiceAccount's Entra ID token: the application of its
// azure.workload.identity annotations, its TokenRequest token (audience
// api://AzureADTokenExchange, subject system:serviceaccount:default:reader,
// checked by the test Entra ID as a federated credential) as client
// assertion, for Azure Storage's scope. The blob service is Azurite behind
// an HTTPS front that lets through only bearer tokens that Entra ID
// issued (the container is public behind it, so the front is the only
// lock). Then the bad-input rows: a ServiceAccount the application does
// not trust, missing annotations, Entra ID answering 500.
func TestAzureBucketObjectLevelWorkloadIdentity(t *testing.T) {
	c := sourcetest.StartAPIServer(t)
	app := map[string]string{workloadidentity.AnnotationAzureClientID: cloudid.ClientID, workloadidentity.AnnotationAzureTenantID: cloudid.TenantID}
	sourcetest.CreateServiceAccounts(t, c, map[string]map[string]string{"reader": app, "untrusted": app, "bare": nil})
	entra := &tokenserver.EntraID{TenantID: cloudid.TenantID, ClientID: cloudid.ClientID, Scope: azureStorageScope,
		Trust: cloudid.ServiceAccountTrust(workloadidentity.AudienceAzure, map[string]string{cloudid.ClientID: "default/reader"})}
	must(t, entra.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = entra.Stop() })

	az := azuritetest.New(t)
	_, err := az.Client.CreateContainer(t.Context(), "wibucket",
		&azblob.CreateContainerOptions{Access: ptr(container.PublicAccessTypeContainer)})
	must(t, err)
	az.Put(t, "wibucket", "app/config.yaml", "replicas: 3\n")
	backend, err := url.Parse(az.Endpoint)
	must(t, err)
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(&url.URL{Scheme: "http", Host: backend.Host})
		r.Out.Header.Del("Authorization")
	}, ErrorLog: log.New(io.Discard, "", 0)}
	var refused atomic.Int32
	front := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !sourcetest.BearerValid(r, entra.Valid) {
			refused.Add(1)
			w.Header().Set("WWW-Authenticate", "Bearer authorization_uri=https://login.microsoftonline.com/"+cloudid.TenantID+"/oauth2/authorize resource_id=https://storage.azure.com")
			http.Error(w, "Server failed to authenticate the request.", http.StatusUnauthorized)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	roots := x509.NewCertPool()
	roots.AddCert(front.Certificate())
	if !roots.AppendCertsFromPEM(entra.CACert()) {
		t.Fatal("bad Entra ID CA")
	}
	env := map[string]string{"AZURE_AUTHORITY_HOST": entra.AuthorityHost()}

	for _, tc := range []struct {
		name, sa string
		status   int // Entra ID's answer
		handling failure.Handling
		message  string
	}{
		{name: "service account", sa: "reader"},
		{name: "not federated with the application", sa: "untrusted", handling: failure.Final, message: "AADSTS"},
		{name: "no client-id annotation", sa: "bare", handling: failure.Final,
			message: "the annotations azure.workload.identity/client-id and azure.workload.identity/tenant-id must both be set"},
		{name: "Entra ID answers 500", sa: "reader", status: http.StatusInternalServerError, handling: failure.Transient, message: "500"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			entra.FailWith(tc.status)
			defer entra.FailWith(0)
			src := &Source{Concurrency: 1, Tokens: providertoken.NewCache(0, nil), rootCAs: roots,
				Getenv:   sourcetest.Getenv(env),
				Accounts: &workloadidentity.Accounts{Client: c, Enabled: true}}
			spec := sourcev1.BucketSpec{Provider: sourcev1.BucketProviderAzure, BucketName: "wibucket",
				Endpoint: front.URL + backend.Path, ServiceAccountName: tc.sa}
			checkFetchAs(t, src, spec, tc.handling, tc.message)
		})
	}
	// Without a token, or with one Entra ID never issued, the front
	// refuses: the success above is the token's.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}}}
	before := refused.Load()
	sourcetest.CheckRefusesForgedBearer(t, hc, front.URL+backend.Path+"/wibucket?restype=container&comp=list", http.StatusUnauthorized)
	if n := refused.Load() - before; n != 2 {
		t.Errorf("the front refused %d of the 2 requests without a valid token", n)
	}
}

// checkFetchAs resolves spec, which names a ServiceAccount, with src:
// with message "", it must succeed and download the bucket's
// app/config.yaml as the workload identity tests put it; otherwise it must
// fail authentication with handling and a message containing message.
func checkFetchAs(t *testing.T, src *Source, spec sourcev1.BucketSpec, handling failure.Handling, message string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	res, err := src.Resolve(ctx, request(spec))
	if message != "" {
		sourcetest.CheckFailure(t, err, sourcev1.AuthenticationFailedReason, handling, message)
		return
	}
	must(t, err)
	dir := t.TempDir()
	if _, err := res.Download(ctx, dir); err != nil {
		t.Fatalf("download: %v", err)
	}
	b, err := os.ReadFile(dir + "/app/config.yaml")
	if err != nil || string(b) != "replicas: 3\n" {
		t.Fatalf("app/config.yaml: %q, %v", b, err)
	}
}

func ptr[T any](v T) *T { return &v }
