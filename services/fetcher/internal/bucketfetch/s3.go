package bucketfetch

import (
	"context"
	"fmt"
	"io"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/s3utils"
)

// s3Store is a bucket of an S3-compatible server (providers generic and
// aws), through minio-go.
type s3Store struct {
	client *minio.Client
	bucket string
}

var _ store = (*s3Store)(nil)

func (s *s3Store) exists(ctx context.Context) (bool, error) {
	return s.client.BucketExists(ctx, s.bucket)
}

// list lists recursively; Google's S3-compatible (interoperability)
// endpoint only serves ListObjects V1, as Flux's minio client knows.
func (s *s3Store) list(ctx context.Context, prefix string, visit func(string, object) error) error {
	// Stop the lister if visit or the listing fails half-way.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for o := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{
		Prefix:    prefix,
		Recursive: true,
		UseV1:     s3utils.IsGoogleEndpoint(*s.client.EndpointURL()),
	}) {
		if o.Err != nil {
			return o.Err
		}
		if err := visit(o.Key, object{etag: o.ETag, size: o.Size}); err != nil {
			return err
		}
	}
	return nil
}

func (s *s3Store) get(ctx context.Context, key string) (io.ReadCloser, object, error) {
	body, info, _, err := minio.Core{Client: s.client}.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		if minio.ToErrorResponse(err).Code == minio.NoSuchKey {
			return nil, object{}, fmt.Errorf("%w: %w", errNoSuchObject, err)
		}
		return nil, object{}, err
	}
	return body, object{etag: info.ETag, size: info.Size}, nil
}
