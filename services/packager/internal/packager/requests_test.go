package packager

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
)

// TestS3Requests counts the object-store requests of the packager's two
// hot paths on S3 (MinIO): a new artifact recorded in the content cache,
// and a source reusing it. The counts are what issue 11's scenario g pays
// per source; docs/design.md ("What S3 costs") explains each request, so
// a change of them shows here.
func TestS3Requests(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "artifacts")
	client, counter := srv.CountingClient(t)
	store, err := storage.NewS3(client, "artifacts", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := defaultOptions()
	opts.ContentCacheTTL = time.Hour
	pub := &recorder{}
	p := New(store, pub, opts, nil)

	const cacheKey = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	staged := stagingTar(t, writeFiles(t, appTree))
	first := fetched("job-1", "app", "abc.tar.gz")
	first.ContentKey = cacheKey
	if _, err := store.Put(ctx, first.Staging, bytes.NewReader(staged)); err != nil {
		t.Fatal(err)
	}
	counter.Take()

	// New content: GET the staged tar, PUT the artifact, move the latest
	// pointer in job order (GET its order record, PUT it conditionally,
	// COPY the artifact to the pointer, GET the record again), PUT the
	// cache's index and COPY the artifact into the cache, DELETE the staged
	// tar, LIST the source's directory.
	if err := p.packageFetched(ctx, first); err != nil {
		t.Fatal(err)
	}
	if got, want := counter.Take(), "COPY=2 DELETE=1 GET=3 LIST=1 PUT=3"; got != want {
		t.Errorf("new artifact: requests %s, want %s", got, want)
	}
	out := pub.sent[0].out

	// Reuse: GET the cached artifact (its digest is checked), COPY it to
	// the source's key and to its latest pointer (with the order record's
	// GET, PUT and GET), HEAD the cache's index
	// (written a moment ago, so not written again), DELETE the staging key,
	// LIST the source's directory.
	second := fetched("job-2", "other", "abc.tar.gz")
	second.Reuse = &events.Reuse{Key: contentcache.ArtifactKey(cacheKey), Digest: out.Artifact.Digest, Size: *out.Artifact.Size}
	if err := p.packageFetched(ctx, second); err != nil {
		t.Fatal(err)
	}
	if got, want := counter.Take(), "COPY=2 DELETE=1 GET=3 HEAD=1 LIST=1 PUT=1"; got != want {
		t.Errorf("reuse: requests %s, want %s", got, want)
	}
	if err := storage.Verify(ctx, store, "gitrepository/default/other/"+storage.LatestName, out.Artifact.Digest); err != nil {
		t.Errorf("the reusing source's latest pointer: %v", err)
	}
}
