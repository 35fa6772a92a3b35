package packager

import (
	"context"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// The job's metadata (an OCI artifact's annotations) becomes the stored
// artifact's, and the content cache's index keeps it for reuse.
func TestArtifactMetadata(t *testing.T) {
	opts := defaultOptions()
	opts.ContentCacheTTL = time.Hour
	h := newHarness(t, harnessOptions{opts: opts})
	f := fetched("job-md", "app", "sha256:abc.tar.gz")
	f.Job.Object.Kind = sourcev1.OCIRepositoryKind
	f.Format = events.FormatFile
	f.Metadata = map[string]string{"org.opencontainers.image.revision": "main@sha1:1234"}
	f.ContentKey = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	out := h.packaged(f, []byte("layer bytes"))
	if got := out.Artifact.Metadata["org.opencontainers.image.revision"]; got != "main@sha1:1234" {
		t.Errorf("artifact metadata %v, want the job's", out.Artifact.Metadata)
	}
	idx, err := contentcache.Lookup(context.Background(), h.store, f.ContentKey, f.Revision)
	if err != nil || idx == nil || idx.Metadata["org.opencontainers.image.revision"] != "main@sha1:1234" {
		t.Errorf("cache index %+v, %v: want the metadata recorded", idx, err)
	}
}
