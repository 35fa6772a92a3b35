package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/s3utils"
)

const (
	// s3PartSize is the part size of streamed (multipart) uploads. minio-go
	// holds one buffer of this size per large Put in flight, so such a Put
	// holds at most 18 MiB whatever its size (this buffer plus the probe
	// below, grown to at most 2 MiB); with S3's limit of 10,000 parts it caps
	// an object at 160 GiB. Parts are uploaded one after another: two in
	// flight (minio-go's ConcurrentStreamParts) held 34 MiB and, in scenario
	// c on MinIO, raised the fetcher's and the packager's peak memory by
	// about 30 MiB each without a clear gain in time.
	s3PartSize = 16 << 20
	// s3SinglePutMax is the largest object stored with a single PUT. Put reads
	// up to this much first: a smaller object (most artifacts) costs one
	// request and a buffer of its own size; a larger one is streamed in parts.
	s3SinglePutMax = 1 << 20
)

// S3 is a Storage in an S3-compatible bucket (AWS S3, MinIO, ...), under an
// optional key prefix, so every replica of every service sees the same
// objects and they outlive every process.
//
// Writes are atomic because S3's are: a PUT or a completed multipart upload
// replaces an object at once. The latest pointer is a server-side copy of its
// target (a symlink on Dir), and List recognises pointers by their name,
// LatestName. An upload aborted by a crash leaves an incomplete multipart
// upload behind, invisible to readers; a bucket lifecycle rule
// (AbortIncompleteMultipartUpload) reclaims its space.
type S3 struct {
	client *minio.Client
	bucket string
	prefix string // "" or a clean key ending in "/"
}

var _ Storage = (*S3)(nil)

// NewS3 stores objects in bucket through client, each key under prefix
// ("" for the bucket's root). It makes no request.
func NewS3(client *minio.Client, bucket, prefix string) (*S3, error) {
	if client == nil {
		return nil, errors.New("s3 storage: no client")
	}
	if err := s3utils.CheckValidBucketName(bucket); err != nil {
		return nil, fmt.Errorf("s3 storage: bucket %q: %w", bucket, err)
	}
	prefix = strings.Trim(prefix, "/")
	if prefix != "" {
		if _, err := CleanKey(prefix); err != nil {
			return nil, fmt.Errorf("s3 storage: prefix: %w", err)
		}
		prefix += "/"
	}
	return &S3{client: client, bucket: bucket, prefix: prefix}, nil
}

// Ping checks that the bucket answers (a HEAD of the bucket).
func (s *S3) Ping(ctx context.Context) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	switch {
	case err != nil:
		return fmt.Errorf("s3 storage %s: %w", s.bucket, err)
	case !ok:
		return fmt.Errorf("s3 storage: bucket %s does not exist", s.bucket)
	}
	return nil
}

// Bucket is the bucket the storage lives in.
func (s *S3) Bucket() string { return s.bucket }

// String describes the storage as s3://<bucket>/<prefix>, for logs.
func (s *S3) String() string { return "s3://" + s.bucket + "/" + s.prefix }

// Put stores r's content under key with one PUT when it is small, and as a
// streamed multipart upload of unknown length otherwise, so memory stays
// bounded whatever the size. A failed upload is aborted and leaves the
// previous object in place. The PUT's (or the completed upload's) answer
// describes the object, so Put makes no further request: the Info's key,
// size and ETag are the store's, its ModTime the writer's clock when the
// store answered (S3 does not return the time it stamped; Stat does).
func (s *S3) Put(ctx context.Context, key string, r io.Reader) (Info, error) {
	key, err := CleanKey(key)
	if err != nil {
		return Info{}, err
	}
	r = contextReader{ctx, r}
	var head bytes.Buffer
	if _, err := head.ReadFrom(io.LimitReader(r, s3SinglePutMax+1)); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	opts := minio.PutObjectOptions{PartSize: s3PartSize}
	var ui minio.UploadInfo
	if head.Len() <= s3SinglePutMax {
		ui, err = s.client.PutObject(ctx, s.bucket, s.object(key), bytes.NewReader(head.Bytes()), int64(head.Len()), opts)
	} else {
		ui, err = s.client.PutObject(ctx, s.bucket, s.object(key), io.MultiReader(&head, r), -1, opts)
	}
	if err != nil {
		return Info{}, s.fail("put", key, err)
	}
	return Info{Key: key, Size: ui.Size, ModTime: time.Now().UTC().Truncate(time.Second), ETag: quoteETag(ui.ETag)}, nil
}

// Open opens key for reading with one GET, whose answer describes the
// object. The object is pinned by its ETag: if it is replaced while being
// read, reads fail rather than mix two versions. Reading stops working
// when ctx ends.
func (s *S3) Open(ctx context.Context, key string) (Object, error) {
	key, err := CleanKey(key)
	if err != nil {
		return nil, err
	}
	obj, err := s.client.GetObject(ctx, s.bucket, s.object(key), minio.GetObjectOptions{})
	if err != nil {
		return nil, s.fail("open", key, err)
	}
	// A first Read, even of nothing, sends the GET whose answer describes
	// the object; a first Stat would send a HEAD, then the GET at the
	// first Read: one request instead of two.
	if _, err := obj.Read(nil); err != nil && !errors.Is(err, io.EOF) {
		_ = obj.Close()
		return nil, s.fail("open", key, err)
	}
	oi, err := obj.Stat()
	if err != nil {
		_ = obj.Close()
		return nil, s.fail("open", key, err)
	}
	return &s3Object{Object: obj, info: s3Info(key, oi)}, nil
}

// Stat describes key.
func (s *S3) Stat(ctx context.Context, key string) (Info, error) {
	key, err := CleanKey(key)
	if err != nil {
		return Info{}, err
	}
	oi, err := s.client.StatObject(ctx, s.bucket, s.object(key), minio.StatObjectOptions{})
	if err != nil {
		return Info{}, s.fail("stat", key, err)
	}
	return s3Info(key, oi), nil
}

// Delete removes key; a missing key is not an error. A latest pointer's
// order record goes with it (a second DELETE).
func (s *S3) Delete(ctx context.Context, key string) error {
	key, err := CleanKey(key)
	if err != nil {
		return err
	}
	if err := s.remove(ctx, key); err != nil {
		return err
	}
	// A deleted latest pointer forgets its job's time (its order record).
	if path.Base(key) == LatestName {
		return s.remove(ctx, orderKey(key))
	}
	return nil
}

// remove deletes one object; a missing one is not an error.
func (s *S3) remove(ctx context.Context, key string) error {
	if err := s.client.RemoveObject(ctx, s.bucket, s.object(key), minio.RemoveObjectOptions{}); err != nil {
		if err := s.fail("delete", key, err); !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	return nil
}

// List describes the objects directly under dir, sorted by key. Deeper
// objects, names starting with "." and latest pointers (objects named
// LatestName) are left out.
func (s *S3) List(ctx context.Context, dir string) ([]Info, error) {
	dir, err := CleanKey(dir)
	if err != nil {
		return nil, err
	}
	// Stop the listing's goroutine when returning early.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	prefix := s.object(dir) + "/"
	var out []Info
	for oi := range s.client.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix}) {
		if oi.Err != nil {
			return nil, s.fail("list", dir, oi.Err)
		}
		name := strings.TrimPrefix(oi.Key, prefix)
		// Common prefixes ("sub/") stand for deeper objects.
		if name == "" || strings.Contains(name, "/") || strings.HasPrefix(name, ".") || name == LatestName {
			continue
		}
		out = append(out, s3Info(dir+"/"+name, oi))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// SetLatest makes key a server-side copy of target, an object in the same
// directory: S3 has no symlinks, and a copy replaces key atomically. S3
// cannot make a copy conditional on what it replaces, so the order is
// kept by the pointer's order record, which a PUT can replace
// conditionally: SetLatest reads it (a GET), replaces it if no newer job
// wrote it (a PUT with If-Match, or If-None-Match for the first; a lost
// race starts over), copies target to key, and reads the record again.
// A newer job's record there may mean that job's copy landed before this
// one and was overwritten, so its target is copied, until the record read
// is the one the last copy was made for: whoever copies last checks last,
// so the pointer ends at the newest record's target. Uncontended, that is
// four requests (GET, PUT, COPY, GET). A missing target wraps
// ErrNotFound. S3 copies objects up to 5 GiB this way.
func (s *S3) SetLatest(ctx context.Context, key, target string, requestedAt time.Time) error {
	key, err := checkPointer(key, target)
	if err != nil {
		return err
	}
	want := orderRecord{RequestedAt: requestedAt.UTC(), Target: path.Base(target)}
	if err := s.claimOrder(ctx, key, want); err != nil {
		return err
	}
	return s.copyInOrder(ctx, key, want)
}

// DeleteLatest removes the pointer key unless its order record says a
// newer job set it: it writes a record with no target as SetLatest writes
// one, removes the pointer and reads the record again, applying a newer
// job's record found there (copyInOrder).
func (s *S3) DeleteLatest(ctx context.Context, key string, requestedAt time.Time) error {
	key, err := CleanKey(key)
	if err != nil {
		return err
	}
	want := orderRecord{RequestedAt: requestedAt.UTC()}
	if err := s.claimOrder(ctx, key, want); err != nil {
		return err
	}
	return s.copyInOrder(ctx, key, want)
}

// copyInOrder applies claimed, the record SetLatest or DeleteLatest wrote,
// to the pointer key (copies its target there, or removes the pointer for
// a record with none), then every newer record it reads after doing so,
// until the record read is the one it last applied.
func (s *S3) copyInOrder(ctx context.Context, key string, claimed orderRecord) error {
	dir := path.Dir(key)
	copied := claimed
	for range s3OrderAttempts {
		if copied.Target == "" {
			if err := s.remove(ctx, key); err != nil {
				return err
			}
		} else if _, err := s.client.CopyObject(ctx,
			minio.CopyDestOptions{Bucket: s.bucket, Object: s.object(key)},
			minio.CopySrcOptions{Bucket: s.bucket, Object: s.object(dir + "/" + copied.Target)}); err != nil {
			return s.fail("set latest "+key+" to", dir+"/"+copied.Target, err)
		}
		now, _, err := s.readOrder(ctx, key)
		if err != nil {
			return fmt.Errorf("set latest %s: %w", key, err)
		}
		if now.same(copied) {
			return nil
		}
		copied = now
	}
	return fmt.Errorf("set latest %s: the order record kept changing after %d copies", key, s3OrderAttempts)
}

// LatestTarget reads the pointer's order record (a GET): the pointer is a
// copy, and a copy of an object uploaded in parts has an ETag of its own,
// so its target cannot be told by comparing ETags. The record names the
// newest job's target even while that job's copy is on its way.
func (s *S3) LatestTarget(ctx context.Context, key string) (string, error) {
	key, err := CleanKey(key)
	if err != nil {
		return "", err
	}
	r, _, err := s.readOrder(ctx, key)
	if err != nil {
		return "", fmt.Errorf("latest target %s: %w", key, err)
	}
	if r.Target == "" {
		return "", fmt.Errorf("latest target %s: no order record: %w", key, ErrNotFound)
	}
	return path.Dir(key) + "/" + r.Target, nil
}

// s3OrderAttempts bounds the rounds of SetLatest's conditional writes and
// copies: each lost round means another replica moved the same pointer
// meanwhile.
const s3OrderAttempts = 10

// claimOrder replaces the order record of pointer key with want unless
// it says a newer job set the pointer (ErrSuperseded).
func (s *S3) claimOrder(ctx context.Context, key string, want orderRecord) error {
	body := want.encode()
	for range s3OrderAttempts {
		old, etag, err := s.readOrder(ctx, key)
		if err != nil {
			return fmt.Errorf("set latest %s: %w", key, err)
		}
		if old.supersedes(want.RequestedAt) {
			return superseded(key, old, want.RequestedAt)
		}
		var opts minio.PutObjectOptions
		if etag == "" {
			opts.SetMatchETagExcept("*")
		} else {
			opts.SetMatchETag(etag)
		}
		_, err = s.client.PutObject(ctx, s.bucket, s.object(orderKey(key)), bytes.NewReader(body), int64(len(body)), opts)
		if err == nil {
			return nil
		}
		if !conditionFailed(err) {
			return s.fail("set latest "+key+": write", orderKey(key), err)
		}
	}
	return fmt.Errorf("set latest %s: the order record kept changing after %d attempts", key, s3OrderAttempts)
}

// readOrder reads the order record of pointer key and its ETag
// (unquoted); a missing record is the zero record with no ETag.
func (s *S3) readOrder(ctx context.Context, key string) (orderRecord, string, error) {
	rk := orderKey(key)
	obj, err := s.client.GetObject(ctx, s.bucket, s.object(rk), minio.GetObjectOptions{})
	if err != nil {
		return orderRecord{}, "", s.fail("read", rk, err)
	}
	defer obj.Close()
	b, err := io.ReadAll(io.LimitReader(obj, 1<<16))
	if err != nil {
		if err = s.fail("read", rk, err); errors.Is(err, ErrNotFound) {
			return orderRecord{}, "", nil
		}
		return orderRecord{}, "", err
	}
	oi, err := obj.Stat()
	if err != nil {
		return orderRecord{}, "", s.fail("read", rk, err)
	}
	return decodeOrder(b), strings.Trim(oi.ETag, `"`), nil
}

// conditionFailed reports whether a conditional write failed on its
// condition: 412, or 409 when S3 saw a concurrent conditional write.
func conditionFailed(err error) bool {
	resp := minio.ToErrorResponse(err)
	return resp.Code == minio.PreconditionFailed || resp.StatusCode == http.StatusPreconditionFailed ||
		resp.Code == "ConditionalRequestConflict" || resp.StatusCode == http.StatusConflict
}

// s3CopyMax is the largest object S3 copies with one CopyObject request;
// a larger one is copied in parts (UploadPartCopy).
const s3CopyMax = 5 << 30

// Copy makes dst a server-side copy of src: the bytes never leave the
// store, and the copy replaces dst atomically. It costs two requests: a
// HEAD of src, then a copy conditional on the ETag that HEAD saw
// (CopyMatching), whose answer describes dst. An object over 5 GiB is
// copied as a multipart copy, still server-side. The copy has its own
// ModTime and ETag.
func (s *S3) Copy(ctx context.Context, src, dst string) (Info, error) {
	src, err := CleanKey(src)
	if err != nil {
		return Info{}, err
	}
	if dst, err = CleanKey(dst); err != nil {
		return Info{}, err
	}
	info, err := s.Stat(ctx, src)
	if err != nil {
		return Info{}, fmt.Errorf("copy %w", err)
	}
	return s.CopyMatching(ctx, info, dst)
}

// CopyMatching makes dst a server-side copy of the object src describes,
// with one request (CopyObject with x-amz-copy-source-if-match) when it is
// at most 5 GiB; a larger one is a multipart copy, then a HEAD of dst. A
// src.Key that now holds another object wraps ErrChanged, a missing one
// ErrNotFound.
func (s *S3) CopyMatching(ctx context.Context, src Info, dst string) (Info, error) {
	key, err := CleanKey(src.Key)
	if err != nil {
		return Info{}, err
	}
	if dst, err = CleanKey(dst); err != nil {
		return Info{}, err
	}
	if key == dst {
		st, err := s.Stat(ctx, key)
		if err != nil {
			return Info{}, fmt.Errorf("copy %w", err)
		}
		if st.ETag != src.ETag {
			return Info{}, fmt.Errorf("copy %s: %w", key, ErrChanged)
		}
		return st, nil
	}
	to := minio.CopyDestOptions{Bucket: s.bucket, Object: s.object(dst)}
	from := minio.CopySrcOptions{Bucket: s.bucket, Object: s.object(key), MatchETag: strings.Trim(src.ETag, `"`)}
	if src.Size > s3CopyMax {
		if _, err := s.client.ComposeObject(ctx, to, from); err != nil {
			return Info{}, s.copyFail(key, dst, err)
		}
		return s.Stat(ctx, dst)
	}
	ui, err := s.client.CopyObject(ctx, to, from)
	if err != nil {
		return Info{}, s.copyFail(key, dst, err)
	}
	// The copy's answer carries the time with milliseconds, a HEAD (Stat)
	// in whole seconds: Info says what a HEAD says.
	return Info{Key: dst, Size: src.Size, ModTime: ui.LastModified.UTC().Truncate(time.Second), ETag: quoteETag(ui.ETag)}, nil
}

// copyFail wraps the error of a copy; a failed ETag precondition wraps
// ErrChanged.
func (s *S3) copyFail(src, dst string, err error) error {
	if resp := minio.ToErrorResponse(err); resp.Code == "PreconditionFailed" || resp.StatusCode == http.StatusPreconditionFailed {
		return fmt.Errorf("copy %s to %s: %w", src, dst, ErrChanged)
	}
	return s.fail("copy "+src+" to", dst, err)
}

// object is the S3 object name of a clean key.
func (s *S3) object(key string) string { return s.prefix + key }

// fail wraps an S3 error, mapping a missing object to ErrNotFound. A missing
// bucket is a configuration error, not a missing object, and stays as is.
func (s *S3) fail(op, key string, err error) error {
	resp := minio.ToErrorResponse(err)
	if resp.Code == minio.NoSuchKey || (resp.StatusCode == http.StatusNotFound && resp.Code != minio.NoSuchBucket) {
		return fmt.Errorf("%s %s: %w", op, key, ErrNotFound)
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

type s3Object struct {
	*minio.Object
	info Info
}

func (o *s3Object) Info() Info { return o.info }

// s3Info describes an object; minio-go strips the quotes of S3's ETag and
// Info's ETag carries them, ready for an HTTP header.
func s3Info(key string, oi minio.ObjectInfo) Info {
	return Info{
		Key:     key,
		Size:    oi.Size,
		ModTime: oi.LastModified,
		ETag:    quoteETag(oi.ETag),
	}
}

// quoteETag quotes an ETag as minio-go gives it (without quotes).
func quoteETag(etag string) string { return `"` + strings.Trim(etag, `"`) + `"` }
