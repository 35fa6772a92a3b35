package packager

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// TestLateJobLeavesLatest packages a source's newest job, then jobs of
// older revisions requested before it that finish after it (their
// packager was cut off from the bus, the job done again elsewhere and a
// newer one stored): the latest pointer, and so status.url, stays at the
// newest job's artifact, and retention, which keeps the pointer's target,
// keeps the artifact the source's status names (the newest job's, as the
// watcher drops late outcomes) however many late artifacts are stored
// after it. Without the order, the pointer followed the last job stored,
// and with no grace period retention deleted the status artifact.
func TestLateJobLeavesLatest(t *testing.T) {
	for _, tt := range []struct {
		records, late int
	}{
		{records: 1, late: 1},
		{records: 2, late: 2}, // the default count: two late jobs
	} {
		t.Run(fmt.Sprintf("records %d, %d late", tt.records, tt.late), func(t *testing.T) {
			opts := defaultOptions()
			opts.RetentionRecords, opts.RetentionTTL = tt.records, 0
			h := newHarness(t, harnessOptions{opts: opts})
			requested := time.Now().UTC()

			newest := fetched("job-newest", "podinfo", "newest.tar.gz")
			newest.Job.RequestedAt = requested
			tree := stagingTar(t, writeTree(t, requested))
			status := h.packaged(newest, tree).Artifact
			newestDigest := h.sha256File(status.Path)

			for i := range tt.late {
				late := fetched(fmt.Sprintf("job-late-%d", i), "podinfo", fmt.Sprintf("late-%d.tar.gz", i))
				late.Job.RequestedAt = requested.Add(-time.Duration(tt.late-i) * time.Minute)
				// Other content, so that the pointer's target is told
				// apart by its bytes.
				content := rawTar(t, &tar.Header{Name: fmt.Sprintf("late-%d.txt", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(i + 1)})
				if out := h.packaged(late, content); out.Artifact == nil {
					t.Fatalf("late job %d: no artifact in its outcome", i)
				}
			}

			if got := h.sha256File(srcDir + "/" + storage.LatestName); got != newestDigest {
				t.Errorf("latest.tar.gz holds %s, want the newest job's artifact (%s)", got, newestDigest)
			}
			if _, err := os.Stat(h.file(status.Path)); err != nil {
				t.Errorf("the artifact the status names is gone: %v (the source holds %q)", err, dirNames(t, h.file(srcDir)))
			}
			if got := h.metric("headwater_latest_pointer_superseded_total", nil); got != float64(tt.late) {
				t.Errorf("headwater_latest_pointer_superseded_total = %v, want %d", got, tt.late)
			}
		})
	}
}

// TestLateJobOnEmptySourceSetsLatest packages a job whose record says
// nothing yet: any request time moves a pointer that no job ordered.
func TestLateJobOnEmptySourceSetsLatest(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	f := fetched("job-1", "podinfo", "one.tar.gz")
	f.Job.RequestedAt = time.Unix(0, 0).UTC()
	out := h.packaged(f, stagingTar(t, writeTree(t, time.Now())))
	if got, want := h.sha256File(srcDir+"/"+storage.LatestName), h.sha256File(out.Artifact.Path); got != want {
		t.Errorf("latest.tar.gz holds %s, want %s", got, want)
	}
	if _, err := os.Stat(h.file(srcDir + "/" + storage.LatestName)); errors.Is(err, os.ErrNotExist) {
		t.Fatal("no latest pointer")
	}
}

// TestLateGenerateJobLeavesNewerOutput has an ArtifactGenerator job that
// no longer had output "y" (its spec dropped it) finish after a newer job
// that has it again stored y's artifact: the late job removes nothing of
// y, whose ExternalArtifact names the newer artifact. Before, it deleted
// y's pointer and every artifact of y.
func TestLateGenerateJobLeavesNewerOutput(t *testing.T) {
	store, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	reg := prometheus.NewRegistry()
	p := New(store, nil, defaultOptions(), NewMetrics(reg))
	ctx := context.Background()
	requested := time.Now().UTC()

	dir := storage.SourceDir(events.GeneratedKind, "default", "y")
	newer := dir + "/newer.tar.gz"
	if _, err := store.Put(ctx, newer, strings.NewReader("y, as the newer job made it")); err != nil {
		t.Fatal(err)
	}
	if err := store.SetLatest(ctx, dir+"/"+storage.LatestName, newer, requested); err != nil {
		t.Fatal(err)
	}

	late := &events.GenerateRequested{Job: events.Job{
		ID:          "late",
		Object:      events.ObjectRef{Kind: "ArtifactGenerator", Namespace: "default", Name: "gen", UID: "uid-gen", Generation: 1},
		RequestedAt: requested.Add(-time.Minute),
	}}
	previous := map[string]events.GeneratedOutput{"x": {Name: "x"}, "y": {Name: "y"}}
	if err := p.removeOutputs(ctx, late, []events.GeneratedOutput{{Name: "x"}}, previous); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{newer, dir + "/" + storage.LatestName} {
		if _, err := store.Stat(ctx, key); err != nil {
			t.Errorf("%s after the late job: %v", key, err)
		}
	}
	if got := testutil.ToFloat64(p.metrics.LatestSuperseded); got != 1 {
		t.Errorf("headwater_latest_pointer_superseded_total = %v, want 1", got)
	}

	// A job newer than the pointer's removes the output.
	newest := *late
	newest.Job.RequestedAt = requested.Add(time.Minute)
	if err := p.removeOutputs(ctx, &newest, []events.GeneratedOutput{{Name: "x"}}, previous); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Stat(ctx, newer); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("%s after a newer job without y: %v, want ErrNotFound", newer, err)
	}
}
