package storage_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
)

// TestLatestRace has two replicas (two Dirs opened on one directory, two
// S3 clients on one bucket) move one source's pointer at once, for jobs
// requested in an order the writers do not follow: whatever lands when,
// the pointer ends at the newest job's artifact, and every job older than
// one that set it before it is refused rather than moving it back.
func TestLatestRace(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "artifacts")
	const writers, rounds = 8, 12
	backends := []struct {
		name string
		// replicas open the same storage twice, as two processes do.
		replicas func(t *testing.T) [2]storage.Storage
	}{
		{"dir", func(t *testing.T) [2]storage.Storage {
			path := t.TempDir()
			var out [2]storage.Storage
			for i := range out {
				d, err := storage.NewDir(path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { d.Close() })
				out[i] = d
			}
			return out
		}},
		{"s3", func(t *testing.T) [2]storage.Storage {
			var out [2]storage.Storage
			for i := range out {
				client, err := minio.New(srv.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, "")})
				if err != nil {
					t.Fatal(err)
				}
				s, err := storage.NewS3(client, "artifacts", "race")
				if err != nil {
					t.Fatal(err)
				}
				out[i] = s
			}
			return out
		}},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			replicas := b.replicas(t)
			requested := time.Date(2026, 12, 4, 23, 0, 0, 0, time.UTC)
			for round := range rounds {
				dir := storage.SourceDir("GitRepository", "ns", fmt.Sprintf("app-%d", round))
				latest := dir + "/" + storage.LatestName
				for w := range writers {
					mustPut(t, ctx, replicas[0], fmt.Sprintf("%s/%d.tar.gz", dir, w), fmt.Sprint(w))
				}
				// Writer w's job was requested w seconds in: start them
				// in a random order.
				var wg sync.WaitGroup
				errs := make([]error, writers)
				for _, w := range rand.Perm(writers) {
					wg.Go(func() {
						errs[w] = replicas[w%2].SetLatest(ctx, latest, fmt.Sprintf("%s/%d.tar.gz", dir, w), requested.Add(time.Duration(w)*time.Second))
					})
				}
				wg.Wait()
				for w, err := range errs {
					if err != nil && !errors.Is(err, storage.ErrSuperseded) {
						t.Fatalf("round %d: writer %d: %v", round, w, err)
					}
				}
				if errs[writers-1] != nil {
					t.Fatalf("round %d: the newest job was refused: %v", round, errs[writers-1])
				}
				for _, s := range replicas {
					if got := mustRead(t, ctx, s, latest); got != fmt.Sprint(writers-1) {
						t.Fatalf("round %d: latest holds writer %s's artifact, want the newest job's (%d)", round, got, writers-1)
					}
				}
				// The record agrees: an older job is refused now.
				if err := replicas[1].SetLatest(ctx, latest, dir+"/0.tar.gz", requested); !errors.Is(err, storage.ErrSuperseded) {
					t.Fatalf("round %d: SetLatest of the oldest job after the race = %v, want ErrSuperseded", round, err)
				}
			}
		})
	}
}

// BenchmarkSetLatest moves one pointer forward, one job after another, as
// the packager does once per stored artifact: on Dir a lock, a record
// rewritten and a symlink renamed; on S3 GET, PUT, COPY and GET. The
// "copy" case is the single CopyObject that moved a pointer on S3 before
// it followed job order.
func BenchmarkSetLatest(b *testing.B) {
	srv := miniotest.New(b)
	srv.MakeBucket(b, "artifacts")
	d, err := storage.NewDir(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	s3, err := storage.NewS3(srv.Client, "artifacts", "bench")
	if err != nil {
		b.Fatal(err)
	}
	// Each run (b.Run calls its function more than once) moves a pointer
	// of its own, so a run's jobs are never older than the last run's.
	runs := 0
	setup := func(b *testing.B, s storage.Storage) (latest, target string) {
		runs++
		dir := storage.SourceDir("GitRepository", "ns", fmt.Sprintf("app-%d", runs))
		target = dir + "/a.tar.gz"
		if _, err := s.Put(context.Background(), target, strings.NewReader("artifact")); err != nil {
			b.Fatal(err)
		}
		return dir + "/" + storage.LatestName, target
	}
	for _, bk := range []struct {
		name string
		s    storage.Storage
	}{{"dir", d}, {"s3", s3}} {
		b.Run(bk.name, func(b *testing.B) {
			ctx := context.Background()
			latest, target := setup(b, bk.s)
			requested := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
			for b.Loop() {
				requested = requested.Add(time.Second)
				if err := bk.s.SetLatest(ctx, latest, target, requested); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("s3 copy", func(b *testing.B) {
		ctx := context.Background()
		latest, target := setup(b, s3)
		for b.Loop() {
			if _, err := srv.Client.CopyObject(ctx,
				minio.CopyDestOptions{Bucket: "artifacts", Object: "bench/" + latest},
				minio.CopySrcOptions{Bucket: "artifacts", Object: "bench/" + target}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
