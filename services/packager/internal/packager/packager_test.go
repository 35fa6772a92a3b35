package packager

import (
	"archive/tar"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

const srcDir = "gitrepository/default/podinfo"

func TestPackageFetched(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	f := fetched("job-1", "podinfo", "abc.tar.gz")
	h.stage(f, stagingTar(t, writeTree(t, time.Now())))
	before := time.Now()
	h.send(events.TypeFetched, f.Job, f)

	out := h.nextOutcome(events.TypePackaged, "job-1")
	key := srcDir + "/abc.tar.gz"
	a := out.Artifact
	if a == nil {
		t.Fatal("Packaged outcome has no artifact")
	}
	if a.Path != key || a.Revision != f.Revision || out.Revision != f.Revision || a.URL != "" {
		t.Errorf("artifact = %+v, want path %s, revision %s, no URL", a, key, f.Revision)
	}
	if got, want := a.Digest, h.sha256File(key); got != want {
		t.Errorf("digest = %s, want the stored file's %s", got, want)
	}
	fi, err := os.Stat(h.file(key))
	if err != nil {
		t.Fatal(err)
	}
	if a.Size == nil || *a.Size != fi.Size() {
		t.Errorf("size = %v, want %d", a.Size, fi.Size())
	}
	if a.LastUpdateTime.Time.Before(before.Truncate(time.Second)) {
		t.Errorf("lastUpdateTime %s is before the job was sent (%s)", a.LastUpdateTime, before)
	}
	if out.EventMessage != f.EventMessage || !slices.Equal(out.Notices, f.Notices) || out.Failure != nil {
		t.Errorf("outcome = %+v, want the job's event message and notices, no failure", out)
	}

	// latest.tar.gz resolves to the artifact.
	if target, err := os.Readlink(h.file(srcDir + "/" + storage.LatestName)); err != nil || target != "abc.tar.gz" {
		t.Errorf("latest -> %q (%v), want abc.tar.gz", target, err)
	}
	if err := storage.Verify(context.Background(), h.store, srcDir+"/"+storage.LatestName, a.Digest); err != nil {
		t.Errorf("latest does not have the artifact's digest: %v", err)
	}
	// The staged content is gone.
	h.stagingGone(f)

	// The artifact holds the tree, with normalised headers, in canonical order.
	var names []string
	for _, e := range h.untar(key) {
		names = append(names, e.hdr.Name)
		hdr := e.hdr
		if hdr.Uid != 0 || hdr.Gid != 0 || hdr.Uname != "" || hdr.Gname != "" || !hdr.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: header not normalised: uid %d gid %d uname %q gname %q mtime %s",
				hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname, hdr.ModTime)
		}
		if hdr.Typeflag == tar.TypeDir {
			if hdr.Mode != 0o755 {
				t.Errorf("%s: mode %o, want 755", hdr.Name, hdr.Mode)
			}
			continue
		}
		want, ok := testTree[hdr.Name]
		if !ok {
			t.Errorf("unexpected file %s", hdr.Name)
			continue
		}
		wantMode := int64(0o644)
		if want.mode&0o111 != 0 {
			wantMode = 0o755
		}
		if hdr.Mode != wantMode || e.content != want.content {
			t.Errorf("%s: mode %o content %q, want %o %q", hdr.Name, hdr.Mode, e.content, wantMode, want.content)
		}
	}
	wantNames := []string{
		"README.md", "deploy/", "deploy/app.yaml", "deploy/nested/", "deploy/nested/config.json",
		"empty/", "scripts/", "scripts/run.sh", "scripts/zz-last-in-order.t",
	}
	if !slices.Equal(names, wantNames) {
		t.Errorf("entries = %q, want %q", names, wantNames)
	}

	if got := h.metric("headwater_artifact_bytes", nil); got != 1 {
		t.Errorf("headwater_artifact_bytes count = %v, want 1", got)
	}
	eventually(t, "job counted as success", func() bool {
		return h.metric("headwater_jobs_total", map[string]string{"type": events.TypeFetched, "result": "success"}) == 1
	})
}

func TestPackagingIsDeterministic(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	// The same tree written at different times, packaged by two jobs.
	trees := []string{writeTree(t, time.Now()), writeTree(t, time.Now().Add(-48*time.Hour))}
	var digests []string
	for i, root := range trees {
		id := []string{"job-a", "job-b"}[i]
		f := fetched(id, "podinfo", id+".tar.gz")
		digests = append(digests, h.packaged(f, stagingTar(t, root)).Artifact.Digest)
	}
	if digests[0] != digests[1] {
		t.Errorf("same content, different digests: %q", digests)
	}
	if h.sha256File(srcDir+"/job-a.tar.gz") != h.sha256File(srcDir+"/job-b.tar.gz") {
		t.Error("same content, different artifact bytes")
	}
}

func TestDigestAlgorithm(t *testing.T) {
	opts := defaultOptions()
	opts.DigestAlgo = "sha512"
	h := newHarness(t, harnessOptions{opts: opts})
	f := fetched("job-1", "podinfo", "abc.tar.gz")
	h.stage(f, stagingTar(t, writeTree(t, time.Now())))
	h.send(events.TypeFetched, f.Job, f)

	out := h.nextOutcome(events.TypePackaged, "job-1")
	b, err := os.ReadFile(h.file(out.Artifact.Path))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha512.Sum512(b)
	if want := "sha512:" + hex.EncodeToString(sum[:]); out.Artifact.Digest != want {
		t.Errorf("digest = %s, want %s", out.Artifact.Digest, want)
	}
}

func TestRetention(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()}) // keep 2, TTL 1m
	ctx := context.Background()
	now := time.Now()
	// Older artifacts of the source, by age; the latest pointer is at the
	// newest of them, as the last job left it.
	ages := map[string]time.Duration{
		"young.tar.gz": 30 * time.Second, // next newest after the new one: kept by count
		"old-1.tar.gz": 10 * time.Minute, // beyond the count and the TTL: deleted
		"old-2.tar.gz": 20 * time.Minute,
		"old-3.tar.gz": 30 * time.Minute,
		"other.tar.gz": 40 * time.Minute,
	}
	for name, age := range ages {
		key := srcDir + "/" + name
		if _, err := h.store.Put(ctx, key, strings.NewReader(name)); err != nil {
			t.Fatal(err)
		}
		mt := now.Add(-age)
		if err := os.Chtimes(h.file(key), mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.store.SetLatest(ctx, srcDir+"/"+storage.LatestName, srcDir+"/young.tar.gz", time.Time{}); err != nil {
		t.Fatal(err)
	}

	f := fetched("job-new", "podinfo", "new.tar.gz")
	h.stage(f, stagingTar(t, writeTree(t, now)))
	h.send(events.TypeFetched, f.Job, f)
	h.nextOutcome(events.TypePackaged, "job-new")

	// Two records: the new artifact and the next newest survive.
	eventually(t, "garbage collected", func() bool { return h.metric("headwater_gc_deleted_total", nil) == 4 })
	got := dirNames(t, h.file(srcDir))
	want := []string{"latest.tar.gz", "new.tar.gz", "young.tar.gz"}
	if !slices.Equal(got, want) {
		t.Errorf("after GC the source holds %q, want %q", got, want)
	}
}

func TestRetentionKeepsYoungArtifactsBeyondTheCount(t *testing.T) {
	opts := defaultOptions()
	opts.RetentionRecords = 1
	h := newHarness(t, harnessOptions{opts: opts})
	ctx := context.Background()
	now := time.Now()
	for name, age := range map[string]time.Duration{
		"a.tar.gz": 20 * time.Second, // within TTL: kept although beyond the count
		"b.tar.gz": 40 * time.Second, // within TTL: kept
		"c.tar.gz": 2 * time.Minute,  // deleted
		"d.tar.gz": time.Hour,        // deleted
	} {
		key := srcDir + "/" + name
		if _, err := h.store.Put(ctx, key, strings.NewReader(name)); err != nil {
			t.Fatal(err)
		}
		mt := now.Add(-age)
		if err := os.Chtimes(h.file(key), mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	f := fetched("job-new", "podinfo", "new.tar.gz")
	h.stage(f, stagingTar(t, writeTree(t, now)))
	h.send(events.TypeFetched, f.Job, f)
	h.nextOutcome(events.TypePackaged, "job-new")

	eventually(t, "garbage collected", func() bool { return h.metric("headwater_gc_deleted_total", nil) == 2 })
	got := dirNames(t, h.file(srcDir))
	want := []string{"a.tar.gz", "b.tar.gz", "latest.tar.gz", "new.tar.gz"}
	if !slices.Equal(got, want) {
		t.Errorf("after GC the source holds %q, want %q", got, want)
	}
}

func TestHostileStagingIsRejected(t *testing.T) {
	tests := []struct {
		name    string
		content func(t *testing.T) []byte
		want    string // in the failure message
	}{
		{
			name: "parent directory",
			content: func(t *testing.T) []byte {
				return rawTar(t, &tar.Header{Name: "ok.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2},
					&tar.Header{Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4})
			},
			want: `unable to archive artifact to storage: unsafe path in archive: "../evil"`,
		},
		{
			name: "nested parent directory",
			content: func(t *testing.T) []byte {
				return rawTar(t, &tar.Header{Name: "a/../../evil", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4})
			},
			want: `unable to archive artifact to storage: unsafe path in archive: "a/../../evil"`,
		},
		{
			name: "absolute path",
			content: func(t *testing.T) []byte {
				return rawTar(t, &tar.Header{Name: "/etc/cron.d/evil", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4})
			},
			want: `unable to archive artifact to storage: unsafe path in archive: "/etc/cron.d/evil"`,
		},
		{
			name: "file over the size limit",
			content: func(t *testing.T) []byte {
				return rawTar(t, &tar.Header{Name: "big.bin", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4096})
			},
			want: "unable to archive artifact to storage: file too large: big.bin is 4096 bytes, over the limit of 1024",
		},
		{
			name: "not a tar",
			content: func(*testing.T) []byte {
				return []byte(strings.Repeat("this is not a tar archive\n", 40))
			},
			want: "unable to archive artifact to storage: read staged content:",
		},
		{
			name: "truncated tar",
			content: func(t *testing.T) []byte {
				b := rawTar(t, &tar.Header{Name: "cut.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 900})
				return b[:700]
			},
			want: "unable to archive artifact to storage: copy cut.txt: unexpected EOF",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := defaultOptions()
			opts.MaxFileSize = 1024
			h := newHarness(t, harnessOptions{opts: opts})
			key := srcDir + "/abc.tar.gz"

			good := fetched("job-good", "podinfo", "abc.tar.gz")
			prev := h.packaged(good, stagingTar(t, writeTree(t, time.Now()))).Artifact

			// The hostile job targets the same file name.
			bad := fetched("job-bad", "podinfo", "abc.tar.gz")
			h.stage(bad, tt.content(t))
			h.send(events.TypeFetched, bad.Job, bad)
			out := h.nextOutcome(events.TypePackageFailed, "job-bad")

			fl := out.Failure
			if fl == nil || fl.Condition != sourcev1.StorageOperationFailedCondition ||
				fl.Reason != sourcev1.ArchiveOperationFailedReason || fl.Stalled {
				t.Fatalf("failure = %+v, want StorageOperationFailed/ArchiveOperationFailed, not stalled", fl)
			}
			if !strings.HasPrefix(fl.Message, tt.want) {
				t.Errorf("message = %q, want it to start with %q", fl.Message, tt.want)
			}
			if out.Artifact != nil || out.Revision != bad.Revision {
				t.Errorf("outcome = %+v, want the revision and no artifact", out)
			}
			// The previous artifact is untouched and still the latest.
			if got := h.sha256File(key); got != prev.Digest {
				t.Errorf("previous artifact changed: digest %s, was %s", got, prev.Digest)
			}
			if err := storage.Verify(context.Background(), h.store, srcDir+"/"+storage.LatestName, prev.Digest); err != nil {
				t.Errorf("latest: %v", err)
			}
			// Nothing escaped, nothing is left half-written.
			if got, want := dirNames(t, h.file(srcDir)), []string{"abc.tar.gz", "latest.tar.gz"}; !slices.Equal(got, want) {
				t.Errorf("source dir holds %q, want %q", got, want)
			}
			if _, err := os.Stat(filepath.Join(h.store.Path(), "evil")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("evil file written: %v", err)
			}
			eventually(t, "job rejected", func() bool {
				return h.metric("headwater_jobs_total", map[string]string{"type": events.TypeFetched, "result": "failed"}) == 1
			})
			h.stagingGone(bad)
		})
	}
}

func TestRedelivery(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	ctx := context.Background()
	a := fetched("job-a", "podinfo", "a.tar.gz")
	first := h.packaged(a, stagingTar(t, writeTree(t, time.Now()))).Artifact

	// A newer job moves the latest pointer on.
	b := fetched("job-b", "podinfo", "b.tar.gz")
	h.packaged(b, rawTar(t, &tar.Header{Name: "other.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3}))

	// job-a is delivered again (its ack was lost): its staged content is
	// gone, its artifact is stored. The bus would drop the repeated
	// Packaged as a duplicate, so record what the packager publishes.
	rec := &recorder{}
	p := New(h.store, rec, defaultOptions(), nil)
	if err := p.Handle(ctx, message(t, events.TypeFetched, a), bus.Delivery{Attempt: 2}); err != nil {
		t.Fatalf("redelivery: %v", err)
	}
	got := rec.only(t, events.TypePackaged).Artifact
	if got.Digest != first.Digest || *got.Size != *first.Size || got.Path != first.Path || got.Revision != first.Revision {
		t.Errorf("redelivered artifact = %+v, want %+v", got, first)
	}
	if target, _ := os.Readlink(h.file(srcDir + "/" + storage.LatestName)); target != "b.tar.gz" {
		t.Errorf("latest -> %q after the redelivery, want it left at b.tar.gz", target)
	}

	// With neither staged content nor artifact, the job fails.
	gone := fetched("job-gone", "podinfo", "gone.tar.gz")
	h.send(events.TypeFetched, gone.Job, gone)
	out := h.nextOutcome(events.TypePackageFailed, "job-gone")
	if out.Failure == nil || !strings.Contains(out.Failure.Message, "is gone") {
		t.Errorf("failure = %+v, want staged content gone", out.Failure)
	}
}

func TestStorageFailuresAreRetried(t *testing.T) {
	failing := func(s storage.Storage) storage.Storage { return &failingPuts{Storage: s} }
	h := newHarness(t, harnessOptions{opts: defaultOptions(), wrap: failing})
	f := fetched("job-1", "podinfo", "abc.tar.gz")
	h.stage(f, stagingTar(t, writeTree(t, time.Now())))
	h.send(events.TypeFetched, f.Job, f)

	// Reported at once, as every transient failure, and retried after a
	// backoff.
	out := h.nextOutcome(events.TypePackageFailed, "job-1")
	if out.Failure == nil || out.Failure.Stalled || out.Failure.Reason != sourcev1.ArchiveOperationFailedReason ||
		!strings.Contains(out.Failure.Message, "disk on fire") {
		t.Errorf("failure = %+v, want the storage error, not stalled", out.Failure)
	}
	eventually(t, "job retried", func() bool {
		return h.metric("headwater_jobs_total", map[string]string{"type": events.TypeFetched, "result": "retry"}) >= 2
	})
	// The retries report the same failure: one message on the bus.
	if _, err := h.results.Next(jetstream.FetchMaxWait(100 * time.Millisecond)); err == nil {
		t.Error("a second result was published for a job still being retried")
	}
	if _, err := h.store.Stat(context.Background(), f.Staging); err != nil {
		t.Errorf("staging of a retried job: %v", err)
	}
	if names := dirNames(t, h.file(srcDir)); len(names) != 0 {
		t.Errorf("a failed write left %q", names)
	}
}

func TestStorageFailureOnLastAttemptFails(t *testing.T) {
	failing := func(s storage.Storage) storage.Storage { return &failingPuts{Storage: s} }
	h := newHarness(t, harnessOptions{opts: defaultOptions(), wrap: failing, maxAttempts: 1})
	f := fetched("job-1", "podinfo", "abc.tar.gz")
	h.stage(f, stagingTar(t, writeTree(t, time.Now())))
	h.send(events.TypeFetched, f.Job, f)

	out := h.nextOutcome(events.TypePackageFailed, "job-1")
	if out.Failure == nil || out.Failure.Reason != sourcev1.ArchiveOperationFailedReason ||
		!strings.Contains(out.Failure.Message, "disk on fire") {
		t.Errorf("failure = %+v, want the storage error", out.Failure)
	}
	eventually(t, "job rejected", func() bool {
		return h.metric("headwater_jobs_total", map[string]string{"type": events.TypeFetched, "result": "failed"}) == 1
	})
}

func TestDeleteRequested(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	for _, f := range []*events.Fetched{
		fetched("job-1", "podinfo", "one.tar.gz"),
		fetched("job-2", "podinfo", "two.tar.gz"),
		fetched("job-3", "neighbour", "three.tar.gz"),
	} {
		h.packaged(f, stagingTar(t, writeTree(t, time.Now())))
	}

	j := job("job-delete", "podinfo")
	h.send(events.TypeDeleteRequested, j, &events.DeleteRequested{Job: j})
	out := h.nextOutcome(events.TypeDeleted, "job-delete")
	if out.Artifact != nil || out.Failure != nil {
		t.Errorf("deleted outcome = %+v", out)
	}
	if _, err := os.Lstat(h.file(srcDir)); !errors.Is(err, os.ErrNotExist) {
		if names := dirNames(t, h.file(srcDir)); len(names) != 0 {
			t.Errorf("source dir still holds %q", names)
		}
	}
	// The neighbour is untouched.
	if got, want := dirNames(t, h.file("gitrepository/default/neighbour")), []string{"latest.tar.gz", "three.tar.gz"}; !slices.Equal(got, want) {
		t.Errorf("neighbour holds %q, want %q", got, want)
	}
}

func TestMalformedMessagesAreTerminated(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	ctx := context.Background()
	subject := events.PackageSubject("GitRepository")

	// Not a CloudEvent at all.
	if _, err := h.conn.JS.Publish(ctx, subject, []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	// A CloudEvent the packager does not handle.
	stray := job("job-stray", "podinfo")
	h.send(events.TypeFetchFailed, stray, &events.Outcome{Job: stray})
	// A Fetched job pointing outside the staging area.
	escape := fetched("job-escape", "podinfo", "x.tar.gz")
	escape.Staging = srcDir + "/x.tar.gz"
	h.send(events.TypeFetched, escape.Job, escape)
	// A good job after them all.
	good := fetched("job-good", "podinfo", "good.tar.gz")
	h.stage(good, stagingTar(t, writeTree(t, time.Now())))
	h.send(events.TypeFetched, good.Job, good)

	// Two results, in any order: the escape fails, the good job is stored.
	seen := map[string]*events.Outcome{}
	for range 2 {
		m := h.next()
		out := m.Data.(*events.Outcome)
		seen[m.Event.Type()+"/"+out.Job.ID] = out
	}
	if out := seen[events.TypePackageFailed+"/job-escape"]; out == nil || !strings.Contains(out.Failure.Message, "invalid staging key") {
		t.Errorf("escape outcome = %+v, want invalid staging key", out)
	}
	if seen[events.TypePackaged+"/job-good"] == nil {
		t.Errorf("good job not packaged: %v", seen)
	}
	eventually(t, "malformed messages rejected", func() bool {
		return h.metric("headwater_jobs_total", map[string]string{"type": "malformed", "result": "rejected"}) == 1 &&
			h.metric("headwater_jobs_total", map[string]string{"type": events.TypeFetchFailed, "result": "rejected"}) == 1 &&
			h.metric("headwater_jobs_total", map[string]string{"type": events.TypeFetched, "result": "failed"}) == 1
	})
}

func TestJobValidation(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(f *events.Fetched)
		want   string
	}{
		{"artifact name with a slash", func(f *events.Fetched) { f.ArtifactName = "../other/x.tar.gz" }, "invalid artifact name"},
		{"hidden artifact name", func(f *events.Fetched) { f.ArtifactName = ".x.tar.gz" }, "invalid artifact name"},
		{"artifact name of the pointer", func(f *events.Fetched) { f.ArtifactName = storage.LatestName }, "latest pointer"},
		{"staging outside the staging area", func(f *events.Fetched) { f.Staging = "gitrepository/default/podinfo/a.tar.gz" }, "invalid staging key"},
		{"staging below the staging area", func(f *events.Fetched) { f.Staging = ".staging/a/b.tar" }, "invalid staging key"},
		{"namespace climbing", func(f *events.Fetched) { f.Job.Object.Namespace = ".." }, "invalid object"},
		{"name with a slash", func(f *events.Fetched) { f.Job.Object.Name = "a/b" }, "invalid object"},
		{"kind with a slash", func(f *events.Fetched) { f.Job.Object.Kind = "GitRepository/default" }, "invalid object"},
	}
	store, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// What an invalid staging key names is not the job's to delete.
	other := "gitrepository/default/podinfo/a.tar.gz"
	if _, err := store.Put(ctx, other, strings.NewReader("artifact")); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := fetched("job-1", "podinfo", "a.tar.gz")
			tt.mutate(f)
			rec := &recorder{}
			p := New(store, rec, defaultOptions(), nil)
			m := &events.Message{Data: f}
			err := p.Handle(ctx, m, bus.Delivery{Attempt: 1})
			fl := failure.As(err)
			if fl == nil || fl.Handling != failure.Final {
				t.Fatalf("Handle = %v, want a final failure", err)
			}
			if err := p.Report(ctx, m, fl); err != nil {
				t.Fatal(err)
			}
			out := rec.only(t, events.TypePackageFailed)
			if !strings.Contains(out.Failure.Message, tt.want) {
				t.Errorf("message = %q, want it to contain %q", out.Failure.Message, tt.want)
			}
			if _, err := store.Stat(ctx, other); err != nil {
				t.Errorf("%s after the report: %v", other, err)
			}
		})
	}
}

// failingPuts is a storage whose writes break after a few bytes.
type failingPuts struct {
	storage.Storage
}

func (s *failingPuts) Put(_ context.Context, _ string, r io.Reader) (storage.Info, error) {
	if _, err := io.ReadFull(r, make([]byte, 16)); err != nil {
		return storage.Info{}, err
	}
	return storage.Info{}, errors.New("disk on fire")
}

// recorder is a Publisher that keeps what it is given, or fails with err.
type recorder struct {
	mu   sync.Mutex
	sent []recorded
	err  error
}

type recorded struct {
	eventType string
	out       *events.Outcome
}

func (r *recorder) Publish(_ context.Context, _, eventType string, _ events.Job, data any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	out := data.(events.Outcome)
	r.sent = append(r.sent, recorded{eventType, &out})
	return nil
}

// only returns the one outcome recorded, checking its type.
func (r *recorder) only(t *testing.T, eventType string) *events.Outcome {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sent) != 1 || r.sent[0].eventType != eventType {
		t.Fatalf("published %+v, want one %s", r.sent, eventType)
	}
	return r.sent[0].out
}

// message encodes and decodes data as the worker would hand it over.
func message(t *testing.T, eventType string, data any) *events.Message {
	t.Helper()
	j := events.JobOf(data)
	body, err := events.Encode("test", eventType, events.MessageID(j, eventType), events.ObjectSubject(j.Object), data)
	if err != nil {
		t.Fatal(err)
	}
	m, err := events.Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// dirNames lists a directory's entries, sorted; none when it is missing.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
