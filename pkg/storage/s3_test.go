package storage_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/opencontainers/go-digest"

	"github.com/headwater-gitops/headwater/pkg/flagenv"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
)

// unknownLength hides everything but Read, so nothing can learn the size.
type unknownLength struct{ r io.Reader }

func (u unknownLength) Read(p []byte) (int, error) { return u.r.Read(p) }

func TestS3StreamedPut(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "artifacts")
	s, err := storage.NewS3(srv.Client, "artifacts", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const size = 40 << 20
	h := sha256.New()
	src := io.TeeReader(io.LimitReader(rand.NewChaCha8([32]byte{4}), size), h)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	info, err := s.Put(ctx, "bucket/ns/big/big.tar.gz", unknownLength{src})
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	t.Logf("40 MiB streamed Put allocated %d MiB in total", (after.TotalAlloc-before.TotalAlloc)>>20)
	want := digest.NewDigestFromBytes(digest.SHA256, h.Sum(nil)).String()

	if info.Size != size {
		t.Fatalf("Put size %d, want %d", info.Size, size)
	}
	// A multipart ETag ends in the number of parts: 40 MiB in 16 MiB parts.
	if !strings.HasSuffix(info.ETag, `-3"`) {
		t.Fatalf("ETag %s: want a 3-part multipart upload", info.ETag)
	}
	if err := storage.Verify(ctx, s, "bucket/ns/big/big.tar.gz", want); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	var mismatch *storage.DigestMismatchError
	if err := storage.Verify(ctx, s, "bucket/ns/big/big.tar.gz", digest.FromString("other").String()); !errors.As(err, &mismatch) {
		t.Fatalf("Verify against another digest: %v, want a DigestMismatchError", err)
	}
}

func TestS3AbortedUploadLeavesNothing(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "artifacts")
	s, err := storage.NewS3(srv.Client, "artifacts", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Two full parts are uploaded before the source fails.
	src := io.MultiReader(io.LimitReader(rand.NewChaCha8([32]byte{}), 40<<20), errReader{errors.New("source broke")})
	if _, err := s.Put(ctx, "k/obj", unknownLength{src}); err == nil {
		t.Fatal("Put from a failing reader succeeded")
	}
	if _, err := s.Stat(ctx, "k/obj"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Stat after a failed Put: %v, want ErrNotFound", err)
	}
	for up := range srv.Client.ListIncompleteUploads(ctx, "artifacts", "", true) {
		if up.Err != nil {
			t.Fatal(up.Err)
		}
		t.Fatalf("incomplete upload %s of %s left behind", up.UploadID, up.Key)
	}
}

func TestS3Prefix(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "shared")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := storage.NewS3(srv.Client, "shared", "installs/a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := storage.NewS3(srv.Client, "shared", "")
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, ctx, a, "gitrepository/ns/app/x.tar.gz", "in a")
	mustPut(t, ctx, b, "gitrepository/ns/app/y.tar.gz", "at the root")

	if _, err := srv.Client.StatObject(ctx, "shared", "installs/a/gitrepository/ns/app/x.tar.gz", minio.StatObjectOptions{}); err != nil {
		t.Fatalf("object is not under the prefix: %v", err)
	}
	if keys := listKeys(t, ctx, a, "gitrepository/ns/app"); strings.Join(keys, ",") != "gitrepository/ns/app/x.tar.gz" {
		t.Fatalf("List under the prefix = %v", keys)
	}
	if _, err := a.Stat(ctx, "gitrepository/ns/app/y.tar.gz"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("object outside the prefix is visible: %v", err)
	}
	for _, bad := range []string{"../x", "a/./b"} {
		if _, err := storage.NewS3(srv.Client, "shared", bad); !errors.Is(err, storage.ErrInvalidKey) {
			t.Errorf("prefix %q: %v, want ErrInvalidKey", bad, err)
		}
	}
	if _, err := storage.NewS3(srv.Client, "no", ""); err == nil {
		t.Error("bucket name \"no\" (too short) accepted")
	}
}

func TestS3MissingBucketIsNotNotFound(t *testing.T) {
	srv := miniotest.New(t)
	s, err := storage.NewS3(srv.Client, "missing", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, statErr := s.Stat(ctx, "k/obj")
	_, openErr := s.Open(ctx, "k/obj")
	_, listErr := s.List(ctx, "k")
	for op, err := range map[string]error{"Stat": statErr, "Open": openErr, "List": listErr} {
		if err == nil || errors.Is(err, storage.ErrNotFound) {
			t.Errorf("%s in a missing bucket: %v; want an error other than ErrNotFound", op, err)
		}
	}
}

// TestPing: a storage whose bucket answers is ready; a missing bucket or
// a stopped server is not; a directory moved away or removed is not.
func TestPing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := miniotest.New(t)
	srv.MakeBucket(t, "artifacts")
	s3, err := storage.NewS3(srv.Client, "artifacts", "")
	if err != nil {
		t.Fatal(err)
	}
	missing, err := storage.NewS3(srv.Client, "missing", "")
	if err != nil {
		t.Fatal(err)
	}
	dirPath := t.TempDir() + "/store"
	dir, err := storage.NewDir(dirPath)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	if err := storage.Ping(ctx, s3); err != nil {
		t.Errorf("s3: %v", err)
	}
	if err := storage.Ping(ctx, dir); err != nil {
		t.Errorf("dir: %v", err)
	}
	if err := storage.Ping(ctx, missing); err == nil {
		t.Error("a missing bucket pings")
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := storage.Ping(ctx, s3); err == nil {
		t.Error("a stopped server pings")
	}
	if err := os.Rename(dirPath, dirPath+"-moved"); err != nil {
		t.Fatal(err)
	}
	if err := storage.Ping(ctx, dir); err == nil {
		t.Error("a directory moved away pings")
	}
	if err := os.Mkdir(dirPath, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := storage.Ping(ctx, dir); err == nil {
		t.Error("a directory replaced by another pings")
	}
}

func TestOptionsOpenS3(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "existing")
	const wrongSecret = "wrong-secret-never-printed"
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		bucket  string // checked to exist after Open
		wantErr string // substring of Open's error; "" for success
	}{
		{
			name:   "static keys from flags, bucket created",
			args:   []string{"-storage-s3-endpoint=" + srv.Endpoint, "-storage-s3-insecure", "-storage-s3-bucket=created", "-storage-s3-create-bucket", "-storage-s3-access-key=" + srv.AccessKey, "-storage-s3-secret-key=" + srv.SecretKey},
			bucket: "created",
		},
		{
			name:   "keys from the AWS environment, http scheme",
			args:   []string{"-storage-s3-endpoint=" + srv.URL(), "-storage-s3-bucket=existing", "-storage-s3-prefix=p"},
			env:    map[string]string{"AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey},
			bucket: "existing",
		},
		{
			name:   "secret key alone from the AWS environment",
			args:   []string{"-storage-s3-endpoint=" + srv.URL(), "-storage-s3-bucket=existing", "-storage-s3-access-key=" + srv.AccessKey},
			env:    map[string]string{"AWS_SECRET_ACCESS_KEY": srv.SecretKey},
			bucket: "existing",
		},
		{
			name: "everything from HEADWATER_ variables",
			env: map[string]string{
				"HEADWATER_STORAGE_BACKEND":       "s3",
				"HEADWATER_STORAGE_S3_ENDPOINT":   srv.URL(),
				"HEADWATER_STORAGE_S3_BUCKET":     "existing",
				"HEADWATER_STORAGE_S3_ACCESS_KEY": srv.AccessKey,
				"HEADWATER_STORAGE_S3_SECRET_KEY": srv.SecretKey,
			},
			bucket: "existing",
		},
		{
			name:    "missing bucket without create",
			args:    []string{"-storage-s3-endpoint=" + srv.URL(), "-storage-s3-bucket=absent", "-storage-s3-access-key=" + srv.AccessKey, "-storage-s3-secret-key=" + srv.SecretKey},
			wantErr: `bucket "absent" does not exist`,
		},
		{
			name:    "wrong secret key",
			args:    []string{"-storage-s3-endpoint=" + srv.URL(), "-storage-s3-bucket=existing", "-storage-s3-access-key=" + srv.AccessKey, "-storage-s3-secret-key=" + wrongSecret},
			wantErr: `bucket "existing"`,
		},
		{
			name:    "credentials in the endpoint",
			args:    []string{"-storage-s3-endpoint=http://user:" + wrongSecret + "@" + srv.Endpoint, "-storage-s3-bucket=existing"},
			wantErr: "must be host[:port]",
		},
		{
			name:    "access key without secret key",
			args:    []string{"-storage-s3-endpoint=" + srv.URL(), "-storage-s3-bucket=existing", "-storage-s3-access-key=" + srv.AccessKey},
			wantErr: "given together",
		},
		{
			name:    "https and insecure",
			args:    []string{"-storage-s3-endpoint=https://" + srv.Endpoint, "-storage-s3-insecure", "-storage-s3-bucket=existing"},
			wantErr: "contradicts",
		},
		{
			name:    "no bucket",
			args:    []string{"-storage-s3-endpoint=" + srv.URL()},
			wantErr: "--storage-s3-bucket is required",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Only the credentials a case gives are visible.
			t.Setenv("HOME", t.TempDir())
			for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} {
				t.Setenv(k, "")
			}
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var opts storage.Options
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			opts.BindFlags(fs)
			args := tt.args
			if tt.env["HEADWATER_STORAGE_BACKEND"] == "" {
				args = append([]string{"-storage-backend=s3"}, args...)
			}
			if err := flagenv.Parse(fs, args); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s, err := opts.OpenContext(ctx)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Open = %v, want an error with %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), wrongSecret) || strings.Contains(err.Error(), srv.SecretKey) {
					t.Fatalf("error %q shows a secret", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := s.(*storage.S3); !ok {
				t.Fatalf("Open returned %T, want *storage.S3", s)
			}
			if ok, err := srv.Client.BucketExists(ctx, tt.bucket); err != nil || !ok {
				t.Fatalf("bucket %s: exists %v, %v", tt.bucket, ok, err)
			}
			mustPut(t, ctx, s, "k/obj", tt.name)
			if got := mustRead(t, ctx, s, "k/obj"); got != tt.name {
				t.Fatalf("read back %q", got)
			}
		})
	}
}

func TestOptionsOpenDefaultsToDir(t *testing.T) {
	var opts storage.Options
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	opts.BindFlags(fs)
	if err := fs.Parse([]string{"-storage-path=" + t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	s, err := opts.OpenContext(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*storage.Dir); !ok {
		t.Fatalf("OpenContext returned %T, want *storage.Dir", s)
	}
	if err := storage.Close(s); err != nil {
		t.Fatal(err)
	}
	opts.Backend = "tape"
	if _, err := opts.OpenContext(t.Context()); err == nil || !strings.Contains(err.Error(), `unknown backend "tape"`) {
		t.Fatalf("unknown backend: %v", err)
	}
}

// TestS3RequestsPerOperation counts the requests of each operation on S3:
// the answer to a PUT, a GET or a copy describes the object, so no
// operation asks again (see docs/design.md, "What S3 costs").
func TestS3RequestsPerOperation(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "artifacts")
	client, requests := srv.CountingClient(t)
	s, err := storage.NewS3(client, "artifacts", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const dir = "gitrepository/ns/app"
	var put storage.Info
	for _, op := range []struct {
		name, want string
		run        func() error
	}{
		{"Put", "PUT=1", func() (err error) {
			put, err = s.Put(ctx, dir+"/a.tar.gz", strings.NewReader("content"))
			return err
		}},
		// Initiate, three parts, complete.
		{"Put, 40 MiB streamed", "POST=2 PUT=3", func() error {
			_, err := s.Put(ctx, dir+"/big.tar.gz", unknownLength{io.LimitReader(rand.NewChaCha8([32]byte{}), 40<<20)})
			return err
		}},
		{"Open and read through", "GET=1", func() error {
			obj, err := s.Open(ctx, put.Key)
			if err != nil {
				return err
			}
			defer obj.Close()
			_, err = io.Copy(io.Discard, obj)
			return err
		}},
		{"Open of a missing key", "GET=1", func() error {
			if _, err := s.Open(ctx, dir+"/missing"); !errors.Is(err, storage.ErrNotFound) {
				return fmt.Errorf("Open of a missing key: %v, want ErrNotFound", err)
			}
			return nil
		}},
		{"Stat", "HEAD=1", func() error { _, err := s.Stat(ctx, put.Key); return err }},
		{"Copy", "COPY=1 HEAD=1", func() error { _, err := s.Copy(ctx, put.Key, ".cache/a.tar.gz"); return err }},
		{"CopyMatching", "COPY=1", func() error { _, err := s.CopyMatching(ctx, put, "other/ns/app/a.tar.gz"); return err }},
		// Read the order record, write it, copy, read it again.
		{"SetLatest", "COPY=1 GET=2 PUT=1", func() error { return s.SetLatest(ctx, dir+"/"+storage.LatestName, put.Key, time.Now()) }},
		{"List", "LIST=1", func() error { _, err := s.List(ctx, dir); return err }},
		{"Delete", "DELETE=1", func() error { return s.Delete(ctx, dir+"/big.tar.gz") }},
	} {
		requests.Take()
		if err := op.run(); err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
		if got := requests.Take(); got != op.want {
			t.Errorf("%s: requests %s, want %s", op.name, got, op.want)
		}
	}
}
