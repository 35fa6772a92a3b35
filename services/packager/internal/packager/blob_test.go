package packager

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// A blob staged as it is (an OCI layer with layer operation copy) is
// stored unchanged, with the digest of its bytes and the job's metadata.
func TestPackageBlob(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	blob := []byte("\x1f\x8b not canonicalised, not even a valid gzip")
	sum := sha256.Sum256(blob)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	f := fetched("job-blob", "layer", digest+".tar.gz")
	f.Job.Object.Kind = sourcev1.OCIRepositoryKind
	f.StagedAs = events.StagedBlob
	f.Metadata = map[string]string{"org.opencontainers.image.revision": "main@sha1:1234"}
	out := h.packaged(f, blob)

	key := storage.SourceDir(sourcev1.OCIRepositoryKind, "default", "layer") + "/" + digest + ".tar.gz"
	a := out.Artifact
	if a.Path != key || a.Digest != digest || a.Size == nil || *a.Size != int64(len(blob)) {
		t.Errorf("artifact %+v, want %s with the blob's digest %s and size %d", a, key, digest, len(blob))
	}
	if a.Metadata["org.opencontainers.image.revision"] != "main@sha1:1234" {
		t.Errorf("artifact metadata %v, want the job's", a.Metadata)
	}
	stored, err := os.ReadFile(h.file(key))
	if err != nil || !bytes.Equal(stored, blob) {
		t.Errorf("stored %q, %v; want the blob as it is", stored, err)
	}

	t.Run("over the size limit", func(t *testing.T) {
		opts := defaultOptions()
		opts.MaxFileSize = 8
		h := newHarness(t, harnessOptions{opts: opts})
		f := fetched("job-big", "layer", "big.tar.gz")
		f.StagedAs = events.StagedBlob
		h.stage(f, blob)
		h.send(events.TypeFetched, f.Job, f)
		out := h.nextOutcome(events.TypePackageFailed, f.Job.ID)
		if out.Failure == nil || !strings.Contains(out.Failure.Message, "over the limit of 8") {
			t.Errorf("failure %+v, want the size limit", out.Failure)
		}
	})
	t.Run("unknown form", func(t *testing.T) {
		f := fetched("job-odd", "layer", "odd.tar.gz")
		f.StagedAs = "zip"
		h.stage(f, blob)
		h.send(events.TypeFetched, f.Job, f)
		out := h.nextOutcome(events.TypePackageFailed, f.Job.ID)
		if out.Failure == nil || !strings.Contains(out.Failure.Message, `unknown form of staged content "zip"`) {
			t.Errorf("failure %+v", out.Failure)
		}
	})
}
