package bucketfetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
)

// Secret keys Flux reads for an azure Bucket.
const (
	keyClientID                   = "clientId"
	keyTenantID                   = "tenantId"
	keyClientSecret               = "clientSecret"
	keyClientCertificate          = "clientCertificate"
	keyClientCertificatePassword  = "clientCertificatePassword"
	keyClientCertificateSendChain = "clientCertificateSendChain"
	keyAuthorityHost              = "authorityHost"
	keyAccountKey                 = "accountKey"
	keySASKey                     = "sasKey"
)

// validAzureContainerName tells whether name is a valid Azure Blob
// container name: 3 to 63 lowercase letters, digits and single hyphens,
// starting and ending with a letter or digit.
func validAzureContainerName(name string) bool {
	return validName(name, 3, 63, "-") && !strings.Contains(name, "--")
}

// azureStore is an Azure Blob Storage container, through azblob.
type azureStore struct {
	container *container.Client
	pageSize  int
}

var _ store = (*azureStore)(nil)

// newAzureStore builds the client of an azure Bucket as Flux does, from
// spec.endpoint (the account's blob service URL) and the first credential
// spec.secretRef holds, in Flux's order: a service principal with a client
// secret (tenantId, clientId, clientSecret) or a certificate (tenantId,
// clientId, clientCertificate), a managed identity (clientId), the account
// key (accountKey, the account named by the endpoint), a SAS token
// (sasKey); a Secret with none of them (only authorityHost) reads
// anonymously. Without a secretRef it uses the pod's environment, workload
// identity or managed identity. A proxy comes from spec.proxySecretRef.
//
// With account (object-level workload identity, no secretRef) the token is
// the ServiceAccount's Entra ID token: the application of its
// azure.workload.identity annotations, its TokenRequest token as client
// assertion, at the fetcher's authority (AZURE_AUTHORITY_HOST), through
// the fetcher's token cache, as Flux's azure provider gives it.
//
// Bearer tokens are only sent over HTTPS (azcore refuses otherwise), so an
// http:// endpoint (an emulator) takes an account key or a SAS token.
func (s *Source) newAzureStore(ctx context.Context, namespace string, spec *sourcev1.BucketSpec, account *workloadidentity.Account) (store, string, error) {
	endpoint, err := url.Parse(strings.TrimSpace(spec.Endpoint))
	if err == nil && (endpoint.Scheme != "http" && endpoint.Scheme != "https" || endpoint.Host == "" || endpoint.User != nil) {
		err = errors.New("want the account's blob service URL, https://<account>.blob.core.windows.net")
	}
	if err != nil {
		return nil, "", source.StalledError(sourcev1.URLInvalidReason, "invalid endpoint '%s': %w", spec.Endpoint, err)
	}
	if !validAzureContainerName(spec.BucketName) {
		return nil, "", source.StalledError(sourcev1.BucketOperationFailedReason,
			"invalid bucket name '%s': an Azure container name has 3 to 63 lowercase letters, digits or single hyphens, and starts and ends with a letter or digit", spec.BucketName)
	}
	data, err := s.authSecret(ctx, namespace, spec)
	if err != nil {
		return nil, "", err
	}
	if data != nil {
		if err := validateAzureSecret(spec.SecretRef.Name, data); err != nil {
			return nil, "", source.StalledError(sourcev1.AuthenticationFailedReason, "%w", err)
		}
	}
	proxy, proxyData, err := s.proxyURL(ctx, namespace, spec)
	if err != nil {
		return nil, "", err
	}

	opts := &azblob.ClientOptions{}
	opts.Transport = &http.Client{Transport: s.cloudTransport(proxy)}
	switch {
	case s.MaxRetries == 1:
		opts.Retry.MaxRetries = -1 // one try, no retry
	case s.MaxRetries > 1:
		opts.Retry.MaxRetries = int32(s.MaxRetries - 1)
	}
	var name string
	if spec.SecretRef != nil {
		name = spec.SecretRef.Name
	}
	var client *azblob.Client
	if account != nil && data == nil {
		client, err = s.azureAccountClient(ctx, endpoint, account, proxy, opts)
	} else {
		client, err = azureClient(endpoint, name, data, opts)
	}
	if err != nil {
		return nil, "", err
	}
	return &azureStore{container: client.ServiceClient().NewContainerClient(spec.BucketName), pageSize: s.listPageSize},
		secrets.Fingerprint(data, proxyData), nil
}

// azureStorageScope is the scope of Azure Storage's tokens.
const azureStorageScope = "https://storage.azure.com/.default"

// azureAccountClient is the client of endpoint with account's Entra ID
// identity. The token is minted here first, so that a refusal is the
// authentication's, with its handling (workloadidentity.Handling).
func (s *Source) azureAccountClient(ctx context.Context, endpoint *url.URL, account *workloadidentity.Account, proxy *url.URL,
	opts *azblob.ClientOptions) (*azblob.Client, error) {
	const format = "failed to create workload identity credential for service account: %w"
	id, err := account.Azure(s.Getenv)
	if err != nil {
		return nil, source.FailedWith(workloadidentity.Handling(err), sourcev1.AuthenticationFailedReason, format, err)
	}
	// The authority is the operator's: through the Bucket's proxy, as
	// Flux's, and the host limits.
	cred := &accountCredential{id: id, client: &http.Client{Transport: s.cloudTransport(proxy)}, cache: s.Tokens}
	if _, err := cred.GetToken(ctx, policy.TokenRequestOptions{Scopes: []string{azureStorageScope}}); err != nil {
		return nil, source.FailedWith(workloadidentity.Handling(err), sourcev1.AuthenticationFailedReason, format, err)
	}
	u := strings.TrimSuffix(endpoint.String(), "/")
	return newAzure(azblob.NewClient(u, cred, opts))
}

// accountCredential is the azcore credential of a ServiceAccount's
// Entra ID identity, through the fetcher's token cache.
type accountCredential struct {
	id     *providertoken.AzureWorkloadIdentity
	client *http.Client
	cache  *providertoken.Cache
}

// GetToken returns the cached or a new token for the one scope asked.
func (c *accountCredential) GetToken(ctx context.Context, opts policy.TokenRequestOptions) (azcore.AccessToken, error) {
	if len(opts.Scopes) != 1 {
		return azcore.AccessToken{}, fmt.Errorf("want one scope, got %q", opts.Scopes)
	}
	t, err := c.id.Token(ctx, c.client, c.cache, opts.Scopes[0])
	if err != nil {
		return azcore.AccessToken{}, err
	}
	return azcore.AccessToken{Token: t.Value, ExpiresOn: t.ExpiresAt}, nil
}

// azureClient picks the credential, in Flux's order (see newAzureStore).
func azureClient(endpoint *url.URL, name string, data map[string][]byte, opts *azblob.ClientOptions) (*azblob.Client, error) {
	u := endpoint.String()
	fail := func(err error) (*azblob.Client, error) {
		return nil, source.StalledError(sourcev1.AuthenticationFailedReason, "%w", err)
	}
	if data == nil {
		token, err := azureDefaultCredential()
		if err != nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason, "failed to create environment credential chain: %w", err)
		}
		return newAzure(azblob.NewClient(u, token, opts))
	}
	token, err := azureSecretCredential(data)
	if err != nil {
		return fail(fmt.Errorf("failed to create token credential from '%s' Secret: %w", name, err))
	}
	if token != nil {
		return newAzure(azblob.NewClient(u, token, opts))
	}
	if key, ok := data[keyAccountKey]; ok {
		account, err := azureAccountName(endpoint)
		if err != nil {
			return fail(fmt.Errorf("failed to create shared credential from '%s' Secret data: %w", name, err))
		}
		cred, err := azblob.NewSharedKeyCredential(account, string(key))
		if err != nil {
			// The SDK's message would quote nothing but the key's
			// encoding; keep it out all the same.
			return fail(fmt.Errorf("failed to create shared credential from '%s' Secret data: '%s' is not base64", name, keyAccountKey))
		}
		return newAzure(azblob.NewClientWithSharedKeyCredential(u, cred, opts))
	}
	if sas, ok := data[keySASKey]; ok {
		withSAS, err := withSASToken(endpoint, string(sas))
		if err != nil {
			return fail(err)
		}
		return newAzure(azblob.NewClientWithNoCredential(withSAS, opts))
	}
	return newAzure(azblob.NewClientWithNoCredential(u, opts))
}

// newAzure turns a client constructor's failure into a stalled one: it
// fails only on options that cannot work.
func newAzure(c *azblob.Client, err error) (*azblob.Client, error) {
	if err != nil {
		return nil, source.StalledError(sourcev1.AuthenticationFailedReason, "failed to create Azure Blob client: %w", err)
	}
	return c, nil
}

// validateAzureSecret checks that the Secret holds at least one credential
// Flux knows, with Flux's message when it does not.
func validateAzureSecret(name string, data map[string][]byte) error {
	has := func(k string) bool { _, ok := data[k]; return ok }
	if has(keyClientID) || has(keyAccountKey) || has(keySASKey) || has(keyAuthorityHost) {
		return nil
	}
	return fmt.Errorf("invalid '%s' secret data: requires a '%s' or '%s' field, a combination of '%s', '%s' and '%s', or '%s', '%s' and '%s'",
		name, keyClientID, keyAccountKey, keyTenantID, keyClientID, keyClientSecret, keyTenantID, keyClientID, keyClientCertificate)
}

// azureSecretCredential is the Microsoft Entra credential of the Secret,
// nil when it has none: a service principal with a secret or a
// certificate, or a managed identity by client ID.
func azureSecretCredential(data map[string][]byte) (azcore.TokenCredential, error) {
	var authority cloud.Configuration
	if host, ok := data[keyAuthorityHost]; ok {
		authority.ActiveDirectoryAuthorityHost = string(host)
	}
	clientID, hasClientID := data[keyClientID]
	if tenantID, ok := data[keyTenantID]; ok && hasClientID {
		if secret := data[keyClientSecret]; len(secret) > 0 {
			return azidentity.NewClientSecretCredential(string(tenantID), string(clientID), string(secret),
				&azidentity.ClientSecretCredentialOptions{ClientOptions: azcore.ClientOptions{Cloud: authority}})
		}
		if pem := data[keyClientCertificate]; len(pem) > 0 {
			certs, key, err := azidentity.ParseCertificates(pem, data[keyClientCertificatePassword])
			if err != nil {
				// ParseCertificates' errors describe the encoding, never
				// the key; say which field all the same.
				return nil, fmt.Errorf("failed to parse client certificates from '%s'", keyClientCertificate)
			}
			send := strings.ToLower(string(data[keyClientCertificateSendChain]))
			return azidentity.NewClientCertificateCredential(string(tenantID), string(clientID), certs, key,
				&azidentity.ClientCertificateCredentialOptions{ClientOptions: azcore.ClientOptions{Cloud: authority},
					SendCertificateChain: send == "1" || send == "true"})
		}
	}
	if hasClientID {
		return azidentity.NewManagedIdentityCredential(&azidentity.ManagedIdentityCredentialOptions{ID: azidentity.ClientID(clientID)})
	}
	return nil, nil
}

// azureDefaultCredential is the pod's own credential, tried in order: the
// AZURE_* environment (a service principal), workload identity (the
// federated token file the Azure webhook mounts) and managed identity
// (AZURE_CLIENT_ID's, else the default one). It replaces
// DefaultAzureCredential, which would also shell out to the Azure CLI.
func azureDefaultCredential() (azcore.TokenCredential, error) {
	var chain []azcore.TokenCredential
	if c, err := azidentity.NewEnvironmentCredential(nil); err == nil {
		chain = append(chain, c)
	}
	if os.Getenv("AZURE_FEDERATED_TOKEN_FILE") != "" {
		if c, err := azidentity.NewWorkloadIdentityCredential(nil); err == nil {
			chain = append(chain, c)
		}
	}
	mi := &azidentity.ManagedIdentityCredentialOptions{}
	if id := os.Getenv("AZURE_CLIENT_ID"); id != "" {
		mi.ID = azidentity.ClientID(id)
	}
	c, err := azidentity.NewManagedIdentityCredential(mi)
	if err != nil {
		return nil, err
	}
	chain = append(chain, c)
	return azidentity.NewChainedTokenCredential(chain, nil)
}

// azureAccountName is the storage account an account key belongs to: the
// first label of the endpoint's host, as Flux reads it
// (<account>.blob.core.windows.net). Unlike Flux, an endpoint whose host
// is an IP address or localhost names the account in its first path
// element instead, as Azurite and Azure Stack's path-style URLs do
// (http://127.0.0.1:10000/devstoreaccount1).
func azureAccountName(endpoint *url.URL) (string, error) {
	host := endpoint.Hostname()
	if net.ParseIP(host) != nil || host == "localhost" {
		account, _, _ := strings.Cut(strings.TrimPrefix(endpoint.Path, "/"), "/")
		if account == "" {
			return "", fmt.Errorf("failed to extract account name from endpoint: expected the account as the first path element of '%s'", endpoint.Redacted())
		}
		return account, nil
	}
	parts := strings.Split(host, ".")
	if len(parts) <= 2 {
		return "", fmt.Errorf("failed to extract account name from endpoint: expected '%s' to be a subdomain", host)
	}
	return parts[0], nil
}

// withSASToken merges the SAS token of the Secret into the endpoint's
// query, as Flux does (the endpoint's own values are kept where the token
// has none). Its errors never quote the token.
func withSASToken(endpoint *url.URL, sas string) (string, error) {
	values, err := url.ParseQuery(strings.TrimPrefix(sas, "?"))
	if err != nil {
		return "", fmt.Errorf("unable to parse SAS token: '%s' is not a URL query", keySASKey)
	}
	u := *endpoint
	for k, vs := range u.Query() {
		if !values.Has(k) {
			for _, v := range vs {
				values.Add(k, v)
			}
		}
	}
	u.RawQuery = values.Encode()
	return u.String(), nil
}

func (a *azureStore) exists(ctx context.Context) (bool, error) {
	max := int32(1)
	_, err := a.container.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{MaxResults: &max}).NextPage(ctx)
	switch {
	case err == nil:
		return true, nil
	case bloberror.HasCode(err, bloberror.ContainerNotFound):
		return false, nil
	case bloberror.HasCode(err, bloberror.AuthenticationFailed):
		// A container-level SAS token fails so for a missing container.
		return false, azureError(fmt.Errorf("the specified bucket name may be incorrect, nonexistent, or the caller might lack sufficient permissions to access it: %w", err))
	}
	return false, azureError(err)
}

// list lists every blob under prefix. The ETag is taken as a download
// gives it (see azureETag).
func (a *azureStore) list(ctx context.Context, prefix string, visit func(string, object) error) error {
	opts := &container.ListBlobsFlatOptions{}
	if prefix != "" {
		opts.Prefix = &prefix
	}
	if a.pageSize > 0 {
		n := int32(a.pageSize)
		opts.MaxResults = &n
	}
	pager := a.container.NewListBlobsFlatPager(opts)
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return azureError(err)
		}
		for _, b := range page.Segment.BlobItems {
			if b.Name == nil || b.Properties == nil {
				continue
			}
			var size int64
			if b.Properties.ContentLength != nil {
				size = *b.Properties.ContentLength
			}
			if err := visit(*b.Name, object{etag: azureETag(b.Properties.ETag), size: size}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (a *azureStore) get(ctx context.Context, key string) (io.ReadCloser, object, error) {
	resp, err := a.container.NewBlobClient(key).DownloadStream(ctx, nil)
	if bloberror.HasCode(err, bloberror.BlobNotFound) {
		return nil, object{}, fmt.Errorf("%w: %w", errNoSuchObject, err)
	}
	if err != nil {
		return nil, object{}, azureError(err)
	}
	var size int64
	if resp.ContentLength != nil {
		size = *resp.ContentLength
	}
	return resp.Body, object{etag: azureETag(resp.ETag), size: size}, nil
}

// azureETag is the ETag of a blob in the revision: the value of the ETag
// header, quotes included, as Flux records it after downloading (Flux's
// listing writes the ETag in hex, which never matches its stored revision,
// so Flux downloads an azure Bucket at every interval; taking the
// download's form in both places gives Flux's stored revision and lets an
// unchanged bucket cost one listing). Listings give the ETag unquoted.
func azureETag(etag *azcore.ETag) string {
	if etag == nil {
		return ""
	}
	s := string(*etag)
	if !strings.HasPrefix(s, `"`) && !strings.HasPrefix(s, `W/"`) {
		s = `"` + s + `"`
	}
	return s
}

// azureError marks the answers that refuse the credentials: 401 and 403
// from the service, and an identity provider refusing to issue a token.
func azureError(err error) error {
	var resp *azcore.ResponseError
	if errors.As(err, &resp) {
		return classified(err, resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden)
	}
	var auth *azidentity.AuthenticationFailedError
	if errors.As(err, &auth) && auth.RawResponse != nil {
		code := auth.RawResponse.StatusCode
		return classified(err, code == http.StatusBadRequest || code == http.StatusUnauthorized || code == http.StatusForbidden)
	}
	return err
}
