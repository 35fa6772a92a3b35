package bucketfetch

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"

	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
)

// Secret keys Flux reads for a Bucket's keys.
const (
	keyAccessKey = "accesskey"
	keySecretKey = "secretkey"
)

// customIdleTimeout bounds how long the idle connections of a job's own
// transport (one with a CA, a client certificate or a proxy) outlive it.
const customIdleTimeout = 10 * time.Second

// checkSpec refuses, as stalled failures, the specs this fetcher cannot
// serve whatever the bucket holds.
func checkSpec(spec *sourcev1.BucketSpec) error {
	switch spec.Provider {
	case "", sourcev1.BucketProviderGeneric, sourcev1.BucketProviderAmazon,
		sourcev1.BucketProviderGoogle, sourcev1.BucketProviderAzure:
	default:
		return source.StalledError(sourcev1.InvalidProviderConfigurationReason,
			"unsupported Bucket provider '%s': use 'generic', 'aws', 'gcp' or 'azure'", spec.Provider)
	}
	if err := checkSTS(spec); err != nil {
		return err
	}
	return nil
}

// usesAccount reports whether the spec's provider authenticates with a
// ServiceAccount when one is named or defaulted (Flux: every provider but
// generic).
func usesAccount(spec *sourcev1.BucketSpec) bool {
	return spec.Provider != "" && spec.Provider != sourcev1.BucketProviderGeneric
}

// Keys of spec.sts.secretRef for the ldap STS provider, as Flux reads them.
const (
	keySTSUsername = "username"
	keySTSPassword = "password"
)

// stsEndpointPattern is what an aws STS endpoint must match, as Flux's
// AWS authentication checks it: a global, regional, FIPS or VPC endpoint
// of AWS STS.
var stsEndpointPattern = regexp.MustCompile(`^https://(.+\.)?sts(-fips)?(\.[^.]+)?(\.vpce)?\.amazonaws\.com$`)

// checkSTS refuses, in Flux's words, an spec.sts that does not go with
// the Bucket's provider (aws with STS provider aws and neither secretRef
// nor certSecretRef; generic with ldap), or whose endpoint is no URL. The
// API server's validation refuses most of them already; gcp and azure
// ignore spec.sts, as in Flux.
func checkSTS(spec *sourcev1.BucketSpec) error {
	sts := spec.STS
	if sts == nil {
		return nil
	}
	provider := spec.Provider
	if provider == "" {
		provider = sourcev1.BucketProviderGeneric
	}
	incompatible := source.StalledError(sourcev1.InvalidSTSConfigurationReason,
		"STS provider '%s' is not supported for '%s' bucket provider", sts.Provider, provider)
	switch provider {
	case sourcev1.BucketProviderAmazon:
		switch {
		case sts.Provider != sourcev1.STSProviderAmazon:
			return incompatible
		case sts.SecretRef != nil:
			return source.StalledError(sourcev1.InvalidSTSConfigurationReason, "spec.sts.secretRef is not required for the '%s' STS provider", sts.Provider)
		case sts.CertSecretRef != nil:
			return source.StalledError(sourcev1.InvalidSTSConfigurationReason, "spec.sts.certSecretRef is not required for the '%s' STS provider", sts.Provider)
		}
	case sourcev1.BucketProviderGeneric:
		if sts.Provider != sourcev1.STSProviderLDAP {
			return incompatible
		}
	default:
		return nil
	}
	if _, err := url.Parse(sts.Endpoint); err != nil {
		return source.StalledError(sourcev1.URLInvalidReason, "failed to parse STS endpoint '%s': %w", sts.Endpoint, err)
	}
	return nil
}

// open validates the bucket name for the spec's provider and builds the
// provider's store. It also returns a fingerprint of the Secrets' data it
// read (see secrets.Fingerprint), which names the access in the content
// identity.
func (s *Source) open(ctx context.Context, namespace string, spec *sourcev1.BucketSpec, account *workloadidentity.Account) (store, string, error) {
	switch spec.Provider {
	case sourcev1.BucketProviderGoogle:
		return s.newGCSStore(ctx, namespace, spec, account)
	case sourcev1.BucketProviderAzure:
		return s.newAzureStore(ctx, namespace, spec, account)
	}
	if err := s3utils.CheckValidBucketName(spec.BucketName); err != nil {
		return nil, "", source.StalledError(sourcev1.BucketOperationFailedReason, "invalid bucket name '%s': %w", spec.BucketName, err)
	}
	client, access, err := s.newClient(ctx, namespace, spec, account)
	if err != nil {
		return nil, "", err
	}
	return &s3Store{client: client, bucket: spec.BucketName}, access, nil
}

// newClient builds the S3 client of a spec as Flux does: keys from
// spec.secretRef; without them, the AWS credential chain for provider aws
// and anonymous access for generic; TLS settings from spec.certSecretRef
// (HTTPS only); a proxy from spec.proxySecretRef.
//
// It also returns a fingerprint of the Secrets' data it read (see
// secrets.Fingerprint), which names the access in the content identity.
func (s *Source) newClient(ctx context.Context, namespace string, spec *sourcev1.BucketSpec, account *workloadidentity.Account) (*minio.Client, string, error) {
	var keys, certData map[string][]byte
	if ref := spec.SecretRef; ref != nil {
		data, err := s.authSecret(ctx, namespace, spec)
		if err != nil {
			return nil, "", err
		}
		_, hasAccess := data[keyAccessKey]
		_, hasSecret := data[keySecretKey]
		if !hasAccess || !hasSecret {
			return nil, "", source.StalledError(sourcev1.AuthenticationFailedReason,
				"invalid '%s' secret data: required fields '%s' and '%s'", ref.Name, keyAccessKey, keySecretKey)
		}
		keys = data
	}
	proxy, proxyData, err := s.proxyURL(ctx, namespace, spec)
	if err != nil {
		return nil, "", err
	}
	secure := !spec.Insecure
	var tlsConfig *tls.Config
	if ref := spec.CertSecretRef; ref != nil && secure {
		data, err := s.secret(ctx, namespace, ref.Name)
		if err != nil {
			return nil, "", source.Failed(sourcev1.AuthenticationFailedReason,
				"failed to get TLS config: failed to get secret '%s/%s': %w", namespace, ref.Name, err)
		}
		certData = data
		if tlsConfig, err = secrets.TLSConfig(data, namespace+"/"+ref.Name); err != nil {
			return nil, "", source.StalledError(sourcev1.AuthenticationFailedReason, "failed to get TLS config: %w", err)
		}
	}

	stsData, stsCertData, stsTLS, err := s.stsSecrets(ctx, namespace, spec)
	if err != nil {
		return nil, "", err
	}

	transport, err := s.transport(secure, tlsConfig, proxy)
	if err != nil {
		return nil, "", source.Failed(sourcev1.BucketOperationFailedReason, "failed to create bucket client transport: %w", err)
	}
	opts := &minio.Options{
		Region:     spec.Region,
		Secure:     secure,
		Transport:  hostlimit.Wrap(transport, s.Limiter),
		MaxRetries: s.MaxRetries,
	}
	switch {
	case keys != nil:
		// Flux signs only with both keys set; empty ones mean anonymous.
		if access, secret := string(keys[keyAccessKey]), string(keys[keySecretKey]); access != "" && secret != "" {
			opts.Creds = credentials.NewStaticV4(access, secret, "")
		}
	case spec.Provider == sourcev1.BucketProviderAmazon && account != nil:
		if opts.Creds, err = s.accountCredentials(ctx, namespace, spec, account, proxy); err != nil {
			return nil, "", err
		}
	case spec.Provider == sourcev1.BucketProviderAmazon:
		var stsEndpoint string
		var stsTransport http.RoundTripper = transport
		if spec.STS != nil {
			stsEndpoint = spec.STS.Endpoint
			if stsTransport, err = s.stsTransport(nil, proxy); err != nil {
				return nil, "", err
			}
		}
		if opts.Creds, err = awsCredentials(ctx, transport, stsTransport, stsEndpoint); err != nil {
			return nil, "", err
		}
	case spec.STS != nil && spec.STS.Provider == sourcev1.STSProviderLDAP:
		if opts.Creds, err = s.ldapCredentials(ctx, spec.STS, stsData, stsTLS, proxy); err != nil {
			return nil, "", err
		}
	}
	client, err := minio.New(spec.Endpoint, opts)
	if err != nil {
		return nil, "", source.StalledError(sourcev1.URLInvalidReason, "invalid endpoint '%s': %w", spec.Endpoint, err)
	}
	return client, secrets.Fingerprint(keys, proxyData, certData, stsData, stsCertData, stsIdentity(spec.STS)), nil
}

// accountCredentials are the credentials of the role of account's
// eks.amazonaws.com/role-arn in spec.region, assumed with a token of
// account at spec.sts.endpoint (else the fetcher's AWS_ENDPOINT_URL_STS,
// else the region's STS), as Flux does for a Bucket's serviceAccountName.
func (s *Source) accountCredentials(ctx context.Context, namespace string, spec *sourcev1.BucketSpec, account *workloadidentity.Account,
	proxy *url.URL) (*credentials.Credentials, error) {
	const format = "AWS authentication failed: %w"
	if spec.Region == "" {
		return nil, source.StalledError(sourcev1.AuthenticationFailedReason, format,
			errors.New("an AWS region is required for authenticating with a service account. please configure one in the object spec"))
	}
	id, err := account.AWS(spec.Region, s.Getenv)
	if err != nil {
		return nil, source.FailedWith(workloadidentity.Handling(err), sourcev1.AuthenticationFailedReason, format, err)
	}
	// The fetcher's own STS endpoint (the operator's environment) is no
	// tenant's address: not behind the egress policy, through the
	// Bucket's proxy.
	var stsTransport http.RoundTripper
	if t, ok := http.DefaultTransport.(*http.Transport); ok {
		t = t.Clone()
		if proxy != nil {
			t.Proxy = http.ProxyURL(proxy)
		}
		stsTransport = t
	}
	if spec.STS != nil {
		if !stsEndpointPattern.MatchString(spec.STS.Endpoint) {
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason,
				"AWS authentication failed: invalid STS endpoint: '%s'. must match %s", spec.STS.Endpoint, stsEndpointPattern)
		}
		id.STSEndpoint = spec.STS.Endpoint
		if stsTransport, err = s.stsTransport(nil, proxy); err != nil {
			return nil, err
		}
	} else if s.stsRoundTripper != nil {
		stsTransport = s.stsRoundTripper
	}
	creds, err := id.Credentials(ctx, &http.Client{Transport: hostlimit.Wrap(stsTransport, s.Limiter)}, s.Tokens, namespace, spec.Region)
	if err != nil {
		return nil, source.FailedWith(workloadidentity.Handling(err), sourcev1.AuthenticationFailedReason, format, err)
	}
	return credentials.NewStaticV4(creds.AccessKeyID, creds.SecretAccessKey, creds.SessionToken), nil
}

// stsIdentity names an spec.sts in the content identity: its provider
// and endpoint.
func stsIdentity(sts *sourcev1.BucketSTSSpec) map[string][]byte {
	if sts == nil {
		return nil
	}
	return map[string][]byte{"provider": []byte(sts.Provider), "endpoint": []byte(sts.Endpoint)}
}

// stsSecrets reads spec.sts.secretRef (its data checked for the ldap
// provider: username and password, as Flux) and spec.sts.certSecretRef
// (the TLS settings of the requests to the STS endpoint).
func (s *Source) stsSecrets(ctx context.Context, namespace string, spec *sourcev1.BucketSpec) (data, certData map[string][]byte,
	tlsConfig *tls.Config, err error) {
	sts := spec.STS
	if sts == nil {
		return nil, nil, nil, nil
	}
	if ref := sts.SecretRef; ref != nil {
		if data, err = s.secret(ctx, namespace, ref.Name); err != nil {
			return nil, nil, nil, source.Failed(sourcev1.AuthenticationFailedReason,
				"failed to get STS secret '%s/%s': %w", namespace, ref.Name, err)
		}
		if sts.Provider == sourcev1.STSProviderLDAP && (len(data[keySTSUsername]) == 0 || len(data[keySTSPassword]) == 0) {
			return nil, nil, nil, source.Failed(sourcev1.AuthenticationFailedReason,
				"invalid '%s' secret data for '%s' STS provider: required fields %s, %s", ref.Name, sts.Provider, keySTSUsername, keySTSPassword)
		}
	}
	if ref := sts.CertSecretRef; ref != nil {
		if certData, err = s.secret(ctx, namespace, ref.Name); err != nil {
			return nil, nil, nil, source.Failed(sourcev1.AuthenticationFailedReason,
				"failed to get STS TLS config: failed to get secret '%s/%s': %w", namespace, ref.Name, err)
		}
		if tlsConfig, err = secrets.TLSConfig(certData, namespace+"/"+ref.Name); err != nil {
			return nil, nil, nil, source.StalledError(sourcev1.AuthenticationFailedReason, "failed to get STS TLS config: %w", err)
		}
	}
	return data, certData, tlsConfig, nil
}

// stsTransport is the transport of the requests to an STS endpoint: the
// bucket's proxy, spec.sts.certSecretRef's TLS settings, the egress guard
// and the limits of the endpoint's host. Tests replace it (stsRoundTripper)
// to reach a test STS server by AWS's host name.
func (s *Source) stsTransport(tlsConfig *tls.Config, proxy *url.URL) (http.RoundTripper, error) {
	if s.stsRoundTripper != nil {
		return s.stsRoundTripper, nil
	}
	t, err := minio.DefaultTransport(true)
	if err != nil {
		return nil, source.Failed(sourcev1.AuthenticationFailedReason, "failed to create STS client transport: %w", err)
	}
	egress.Guard(t)
	t.IdleConnTimeout = customIdleTimeout
	if tlsConfig != nil {
		t.TLSClientConfig = tlsConfig
	}
	if proxy != nil {
		t.Proxy = http.ProxyURL(proxy)
	}
	return hostlimit.Wrap(t, s.Limiter), nil
}

// ldapCredentials exchanges spec.sts.secretRef's LDAP username and
// password at the STS endpoint (MinIO's AssumeRoleWithLDAPIdentity) for
// temporary credentials, as Flux's generic provider does. The exchange is
// made before the bucket is read, so a refusal (a wrong password, a user
// without a policy, an endpoint that does not answer) fails the fetch with
// AuthenticationFailed and the STS server's words; the credentials are
// renewed by the client when they expire.
func (s *Source) ldapCredentials(ctx context.Context, sts *sourcev1.BucketSTSSpec, data map[string][]byte, tlsConfig *tls.Config,
	proxy *url.URL) (*credentials.Credentials, error) {
	t, err := s.stsTransport(tlsConfig, proxy)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: t}
	creds := credentials.New(&credentials.LDAPIdentity{Client: client, STSEndpoint: sts.Endpoint,
		LDAPUsername: string(data[keySTSUsername]), LDAPPassword: string(data[keySTSPassword])})
	if _, err := creds.GetWithContext(&credentials.CredContext{Client: client, Context: ctx}); err != nil {
		return nil, source.Failed(sourcev1.AuthenticationFailedReason,
			"STS authentication failed: AssumeRoleWithLDAPIdentity at '%s': %w (check the username and password of spec.sts.secretRef, and that the STS server maps a policy to the user)",
			failure.RedactURL(sts.Endpoint), err)
	}
	return creds, nil
}

// proxyURL reads the proxy of spec.proxySecretRef, with the Secret's data;
// nil without one.
func (s *Source) proxyURL(ctx context.Context, namespace string, spec *sourcev1.BucketSpec) (*url.URL, map[string][]byte, error) {
	ref := spec.ProxySecretRef
	if ref == nil {
		return nil, nil, nil
	}
	data, err := s.secret(ctx, namespace, ref.Name)
	if err != nil {
		return nil, nil, source.Failed(sourcev1.AuthenticationFailedReason,
			"failed to get proxy URL: failed to get secret '%s/%s': %w", namespace, ref.Name, err)
	}
	proxy, err := secrets.ProxyURL(data, namespace+"/"+ref.Name)
	if err != nil {
		return nil, nil, source.StalledError(sourcev1.AuthenticationFailedReason, "failed to get proxy URL: %w", err)
	}
	return proxy, data, nil
}

// authSecret reads the Secret of spec.secretRef; nil without one.
func (s *Source) authSecret(ctx context.Context, namespace string, spec *sourcev1.BucketSpec) (map[string][]byte, error) {
	ref := spec.SecretRef
	if ref == nil {
		return nil, nil
	}
	data, err := s.secret(ctx, namespace, ref.Name)
	if err != nil {
		return nil, source.Failed(sourcev1.AuthenticationFailedReason, "failed to get secret '%s/%s': %w", namespace, ref.Name, err)
	}
	return data, nil
}

// secret reads a Secret's data.
func (s *Source) secret(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	if s.Secrets == nil {
		return nil, errors.New("no Kubernetes API server is configured")
	}
	return s.Secrets.Get(ctx, namespace, name)
}

// transport returns the HTTP transport of a client: a shared one without
// TLS settings or proxy, so connections are reused across jobs, and a
// job's own one otherwise.
func (s *Source) transport(secure bool, tlsConfig *tls.Config, proxy *url.URL) (http.RoundTripper, error) {
	if tlsConfig == nil && proxy == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.transports == nil {
			s.transports = map[bool]http.RoundTripper{}
		}
		if t, ok := s.transports[secure]; ok {
			return t, nil
		}
		t, err := minio.DefaultTransport(secure)
		if err != nil {
			return nil, err
		}
		egress.Guard(t)
		s.transports[secure] = t
		return t, nil
	}
	t, err := minio.DefaultTransport(secure)
	if err != nil {
		return nil, err
	}
	egress.Guard(t)
	t.IdleConnTimeout = customIdleTimeout
	if tlsConfig != nil {
		t.TLSClientConfig = tlsConfig
	}
	if proxy != nil {
		t.Proxy = http.ProxyURL(proxy)
	}
	return t, nil
}

// cloudTransport returns the HTTP transport of a Google Cloud Storage or
// Azure client (its token requests included), behind the limits of each
// host (Limiter): a shared one without a proxy, so connections are reused
// across jobs, and a job's own one with a proxy.
func (s *Source) cloudTransport(proxy *url.URL) http.RoundTripper {
	if proxy == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.cloud == nil {
			t := http.DefaultTransport.(*http.Transport).Clone()
			t.MaxIdleConnsPerHost = 16
			s.withRootCAs(t)
			s.cloud = t
		}
		return hostlimit.Wrap(s.cloud, s.Limiter)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.IdleConnTimeout = customIdleTimeout
	t.Proxy = http.ProxyURL(proxy)
	s.withRootCAs(t)
	return hostlimit.Wrap(t, s.Limiter)
}

// withRootCAs makes t trust s.rootCAs instead of the system's, when set.
func (s *Source) withRootCAs(t *http.Transport) {
	if s.rootCAs != nil {
		t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: s.rootCAs}
	}
}

// awsCredentials finds credentials with the AWS chain minio-go provides:
// the AWS_* environment, the shared credentials file, then the instance,
// container (ECS, EKS Pod Identity) or web identity (IRSA) endpoints. It
// fails, as Flux does, when none of them has credentials.
func awsCredentials(ctx context.Context, transport, stsTransport http.RoundTripper, stsEndpoint string) (*credentials.Credentials, error) {
	client := &http.Client{Transport: transport}
	iam := &credentials.IAM{Client: client}
	if stsEndpoint != "" {
		if !stsEndpointPattern.MatchString(stsEndpoint) {
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason,
				"AWS authentication failed: invalid STS endpoint: '%s'. must match %s", stsEndpoint, stsEndpointPattern)
		}
		if os.Getenv("AWS_WEB_IDENTITY_TOKEN_FILE") != "" {
			// The web identity (IRSA) is exchanged at spec.sts.endpoint;
			// the instance metadata, when it is what answers, keeps its
			// own address.
			iam.Endpoint = stsEndpoint
			iam.Client = &http.Client{Transport: stsTransport}
		}
	}
	creds := credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{},
		iam,
	})
	cc := &credentials.CredContext{Client: iam.Client, Context: ctx}
	v, err := creds.GetWithContext(cc)
	if (err != nil || v.AccessKeyID == "") && os.Getenv("AWS_WEB_IDENTITY_TOKEN_FILE") != "" {
		// The chain hides why its last link failed: STS's answer (a role
		// that may not be assumed, a token it does not trust) is what to
		// fix.
		if _, werr := iam.RetrieveWithCredContext(cc); werr != nil {
			err = fmt.Errorf("web identity exchange at STS: %w", werr)
		}
	}
	if err == nil && v.AccessKeyID == "" {
		err = errors.New("no credentials in the environment, the shared credentials file or the instance metadata")
	}
	if err != nil {
		return nil, source.Failed(sourcev1.AuthenticationFailedReason, "AWS authentication failed: %w", err)
	}
	return creds, nil
}
