package bucketfetch

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"net/url"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"

	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
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
	if spec.STS != nil {
		return source.StalledError(sourcev1.InvalidSTSConfigurationReason,
			"STS authentication (spec.sts, provider '%s') is not supported yet", spec.STS.Provider)
	}
	if spec.ServiceAccountName != "" {
		return source.StalledError(sourcev1.InvalidProviderConfigurationReason,
			"authentication with spec.serviceAccountName is not supported yet")
	}
	return nil
}

// open validates the bucket name for the spec's provider and builds the
// provider's store. It also returns a fingerprint of the Secrets' data it
// read (see secrets.Fingerprint), which names the access in the content
// identity.
func (s *Source) open(ctx context.Context, namespace string, spec *sourcev1.BucketSpec) (store, string, error) {
	switch spec.Provider {
	case sourcev1.BucketProviderGoogle:
		return s.newGCSStore(ctx, namespace, spec)
	case sourcev1.BucketProviderAzure:
		return s.newAzureStore(ctx, namespace, spec)
	}
	if err := s3utils.CheckValidBucketName(spec.BucketName); err != nil {
		return nil, "", source.StalledError(sourcev1.BucketOperationFailedReason, "invalid bucket name '%s': %w", spec.BucketName, err)
	}
	client, access, err := s.newClient(ctx, namespace, spec)
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
func (s *Source) newClient(ctx context.Context, namespace string, spec *sourcev1.BucketSpec) (*minio.Client, string, error) {
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
	case spec.Provider == sourcev1.BucketProviderAmazon:
		if opts.Creds, err = awsCredentials(ctx, transport); err != nil {
			return nil, "", err
		}
	}
	client, err := minio.New(spec.Endpoint, opts)
	if err != nil {
		return nil, "", source.StalledError(sourcev1.URLInvalidReason, "invalid endpoint '%s': %w", spec.Endpoint, err)
	}
	return client, secrets.Fingerprint(keys, proxyData, certData), nil
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
			s.cloud = t
		}
		return hostlimit.Wrap(s.cloud, s.Limiter)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.IdleConnTimeout = customIdleTimeout
	t.Proxy = http.ProxyURL(proxy)
	return hostlimit.Wrap(t, s.Limiter)
}

// awsCredentials finds credentials with the AWS chain minio-go provides:
// the AWS_* environment, the shared credentials file, then the instance,
// container (ECS, EKS Pod Identity) or web identity (IRSA) endpoints. It
// fails, as Flux does, when none of them has credentials.
func awsCredentials(ctx context.Context, transport http.RoundTripper) (*credentials.Credentials, error) {
	client := &http.Client{Transport: transport}
	creds := credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{},
		&credentials.IAM{Client: client},
	})
	v, err := creds.GetWithContext(&credentials.CredContext{Client: client, Context: ctx})
	if err == nil && v.AccessKeyID == "" {
		err = errors.New("no credentials in the environment, the shared credentials file or the instance metadata")
	}
	if err != nil {
		return nil, source.Failed(sourcev1.AuthenticationFailedReason, "AWS authentication failed: %w", err)
	}
	return creds, nil
}
