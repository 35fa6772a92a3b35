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
)

// TestStagedFileIsStoredAsIs checks the pipeline's input for content staged
// as the artifact itself (a Helm chart, an index, an OCI blob): the bytes
// are stored unchanged, with their digest, latest and retention as for a
// tree; includes and files over the limit fail without retries.
func TestStagedFileIsStoredAsIs(t *testing.T) {
	opts := defaultOptions()
	opts.MaxFileSize = 1 << 10
	h := newHarness(t, harnessOptions{opts: opts})

	chart := bytes.Repeat([]byte("podinfo-6.5.0 chart bytes\n"), 30) // 780 bytes
	f := fetched("job-file", "podinfo", "podinfo-6.5.0.tgz")
	f.Format = events.FormatFile
	out := h.packaged(f, chart)
	key := srcDir + "/podinfo-6.5.0.tgz"
	stored, err := os.ReadFile(h.file(key))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stored, chart) {
		t.Errorf("stored %d bytes, not the staged file's %d unchanged", len(stored), len(chart))
	}
	sum := sha256.Sum256(chart)
	if a := out.Artifact; a == nil || a.Path != key || a.Digest != "sha256:"+hex.EncodeToString(sum[:]) || *a.Size != int64(len(chart)) {
		t.Errorf("artifact %+v, want %s with the file's digest and size", a, key)
	}

	tests := []struct {
		name, want string
		mutate     func(*events.Fetched)
		content    []byte
	}{
		{"with includes", "takes no includes", func(f *events.Fetched) {
			f.Includes = []events.Include{{Name: "lib", ToPath: "lib"}}
		}, chart},
		{"over the limit", "file too large", func(*events.Fetched) {}, bytes.Repeat([]byte("x"), 2<<10)},
		{"unknown format", "unknown staged format", func(f *events.Fetched) { f.Format = "zip" }, chart},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := fetched("job-bad-"+string(rune('a'+i)), "podinfo", "other.tgz")
			f.Format = events.FormatFile
			tc.mutate(f)
			h.stage(f, tc.content)
			h.send(events.TypeFetched, f.Job, f)
			out := h.nextOutcome(events.TypePackageFailed, f.Job.ID)
			if fl := out.Failure; fl == nil || fl.Condition != sourcev1.StorageOperationFailedCondition ||
				fl.Reason != sourcev1.ArchiveOperationFailedReason || !strings.Contains(fl.Message, tc.want) {
				t.Errorf("failure %+v, want StorageOperationFailed/ArchiveOperationFailed saying %q", fl, tc.want)
			}
			eventually(t, "the job terminated, not retried", func() bool {
				return h.metric("headwater_jobs_total", map[string]string{"type": events.TypeFetched, "result": "failed"}) >= float64(i+1)
			})
			if _, err := os.Stat(h.file(srcDir + "/other.tgz")); err == nil {
				t.Error("a failed job left an artifact")
			}
			h.stagingGone(f)
		})
	}
}
