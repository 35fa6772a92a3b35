package storage

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Options select and configure the shared storage of a service. Every
// service that touches artifacts binds the same flags, so one set of
// environment variables configures them all.
type Options struct {
	// Backend is "dir" (the embedded default) or "s3".
	Backend string
	// Path is the directory of the dir backend.
	Path string
	// S3 configures the s3 backend.
	S3 S3Options
}

// S3Options configure the s3 backend: an S3-compatible bucket.
type S3Options struct {
	// Endpoint is the server's host[:port]. An http:// or https:// scheme
	// is accepted and chooses plain HTTP or TLS.
	Endpoint string
	// Bucket holds the objects.
	Bucket string
	// Prefix is prepended to every key, so one bucket can hold several
	// installations.
	Prefix string
	// Region of the bucket; empty lets the client discover it.
	Region string
	// Insecure talks plain HTTP instead of TLS.
	Insecure bool
	// AccessKey and SecretKey are static credentials. When both are empty,
	// the standard chain is used: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
	// (and AWS_SESSION_TOKEN), MINIO_ROOT_USER / MINIO_ROOT_PASSWORD, the
	// AWS and mc credential files, then IAM (EC2, ECS, EKS web identity).
	AccessKey, SecretKey string
	// CreateBucket creates the bucket at start if it does not exist;
	// otherwise a missing bucket fails the start.
	CreateBucket bool
}

// bucketCheckTimeout bounds the check (or creation) of the bucket at start.
const bucketCheckTimeout = 30 * time.Second

// BindFlags registers the storage flags on fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Backend, "storage-backend", "dir", "Shared artifact storage: dir or s3.")
	fs.StringVar(&o.Path, "storage-path", "/data", "Directory of the dir storage backend (a volume shared by every replica).")
	fs.StringVar(&o.S3.Endpoint, "storage-s3-endpoint", "s3.amazonaws.com", "S3 endpoint host[:port] of the s3 storage backend (an http:// or https:// scheme chooses plain HTTP or TLS).")
	fs.StringVar(&o.S3.Bucket, "storage-s3-bucket", "", "Bucket of the s3 storage backend.")
	fs.StringVar(&o.S3.Prefix, "storage-s3-prefix", "", "Key prefix of every object in the s3 storage backend.")
	fs.StringVar(&o.S3.Region, "storage-s3-region", "", "Region of the s3 storage backend's bucket (discovered when empty).")
	fs.BoolVar(&o.S3.Insecure, "storage-s3-insecure", false, "Talk plain HTTP, not TLS, to the s3 storage backend.")
	fs.StringVar(&o.S3.AccessKey, "storage-s3-access-key", "", "Access key of the s3 storage backend (default: AWS_ACCESS_KEY_ID, then the AWS credential chain).")
	fs.StringVar(&o.S3.SecretKey, "storage-s3-secret-key", "", "Secret key of the s3 storage backend (default: AWS_SECRET_ACCESS_KEY, then the AWS credential chain).")
	fs.BoolVar(&o.S3.CreateBucket, "storage-s3-create-bucket", false, "Create the s3 storage backend's bucket at start if it does not exist.")
}

// OpenContext returns the configured storage; Close releases it. For s3 it
// checks that the bucket exists (creating it if asked) within ctx and 30
// seconds, so a wrong endpoint, bucket or key fails the start with a clear
// error.
func (o *Options) OpenContext(ctx context.Context) (Storage, error) {
	switch o.Backend {
	case "dir", "":
		if o.Path == "" {
			return nil, errors.New("storage: --storage-path is required for the dir backend")
		}
		return NewDir(o.Path)
	case "s3":
		return o.S3.open(ctx)
	default:
		return nil, fmt.Errorf("storage: unknown backend %q", o.Backend)
	}
}

// Close releases what s holds open, if anything: a Dir's directory. A
// service opens its storage with OpenContext and closes it on the way out.
func Close(s Storage) error {
	if c, ok := s.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Pinger is a Storage that can tell whether it is reachable, cheaply.
type Pinger interface {
	// Ping returns an error when the storage cannot be used now.
	Ping(ctx context.Context) error
}

// Ping tells whether s is reachable now (a /readyz check): nil for a
// Storage that is no Pinger.
func Ping(ctx context.Context, s Storage) error {
	if p, ok := s.(Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// ReadyCheck is a /readyz check of s: Ping, bounded by timeout.
func ReadyCheck(s Storage, timeout time.Duration) func() error {
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return Ping(ctx, s)
	}
}

// open connects to the bucket. Errors never include the secret key.
func (o S3Options) open(ctx context.Context) (*S3, error) {
	if o.Bucket == "" {
		return nil, errors.New("storage: --storage-s3-bucket is required for the s3 backend")
	}
	client, err := o.Client()
	if err != nil {
		return nil, err
	}
	s, err := NewS3(client, o.Bucket, o.Prefix)
	if err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, bucketCheckTimeout)
	defer cancel()
	exists, err := client.BucketExists(ctx, o.Bucket)
	switch {
	case err != nil:
		return nil, fmt.Errorf("storage: bucket %q at %s: %w", o.Bucket, client.EndpointURL().Host, err)
	case exists:
		return s, nil
	case !o.CreateBucket:
		return nil, fmt.Errorf("storage: bucket %q does not exist at %s (--storage-s3-create-bucket creates it)", o.Bucket, client.EndpointURL().Host)
	}
	if err := client.MakeBucket(ctx, o.Bucket, minio.MakeBucketOptions{Region: o.Region}); err != nil {
		// Another replica may have created it meanwhile.
		if code := minio.ToErrorResponse(err).Code; code != minio.BucketAlreadyOwnedByYou && code != minio.BucketAlreadyExists {
			return nil, fmt.Errorf("storage: create bucket %q at %s: %w", o.Bucket, client.EndpointURL().Host, err)
		}
	}
	return s, nil
}

// Client returns a minio-go client for the endpoint, with the credentials
// described on S3Options.
func (o S3Options) Client() (*minio.Client, error) {
	host, secure, err := o.endpoint()
	if err != nil {
		return nil, err
	}
	creds, err := o.credentials()
	if err != nil {
		return nil, err
	}
	client, err := minio.New(host, &minio.Options{Creds: creds, Secure: secure, Region: o.Region})
	if err != nil {
		return nil, fmt.Errorf("storage: s3 endpoint %q: %w", host, err)
	}
	return client, nil
}

// endpoint splits Endpoint into the host minio-go wants and whether to use
// TLS.
func (o S3Options) endpoint() (host string, secure bool, err error) {
	if !strings.Contains(o.Endpoint, "://") {
		if o.Endpoint == "" {
			return "", false, errors.New("storage: --storage-s3-endpoint is required for the s3 backend")
		}
		return o.Endpoint, !o.Insecure, nil
	}
	u, err := url.Parse(o.Endpoint)
	if err != nil || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		// Never print the endpoint itself: it may carry credentials.
		return "", false, errors.New("storage: --storage-s3-endpoint must be host[:port] or http(s)://host[:port]")
	}
	switch u.Scheme {
	case "http":
		return u.Host, false, nil
	case "https":
		if o.Insecure {
			return "", false, fmt.Errorf("storage: --storage-s3-endpoint https://%s contradicts --storage-s3-insecure", u.Host)
		}
		return u.Host, true, nil
	default:
		return "", false, fmt.Errorf("storage: --storage-s3-endpoint scheme %q is not http or https", u.Scheme)
	}
}

// credentials are the static keys when given (either one completed from
// the AWS environment), else the standard chain.
func (o S3Options) credentials() (*credentials.Credentials, error) {
	if o.AccessKey == "" && o.SecretKey == "" {
		return credentials.NewChainCredentials([]credentials.Provider{
			&credentials.EnvAWS{},
			&credentials.EnvMinio{},
			&credentials.FileAWSCredentials{},
			&credentials.FileMinioClient{},
			&credentials.IAM{},
		}), nil
	}
	access, secret := o.AccessKey, o.SecretKey
	if access == "" {
		access = os.Getenv("AWS_ACCESS_KEY_ID")
	}
	if secret == "" {
		secret = os.Getenv("AWS_SECRET_ACCESS_KEY")
	}
	if access == "" || secret == "" {
		return nil, errors.New("storage: s3 access key and secret key must be given together (flags or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
	}
	return credentials.NewStaticV4(access, secret, ""), nil
}
