package packager

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// TestFailureClassification runs the pipeline with one step failing at a
// time and checks what the failure says: its condition, reason and
// handling, or that it is the platform's error.
func TestFailureClassification(t *testing.T) {
	const (
		libDir   = "gitrepository/default/lib/"
		cacheKey = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	)
	// fixture is a source's storage with the job's staged content, an
	// artifact of source lib to include, and a content cache entry.
	type fixture struct {
		store *storage.Dir
		job   *events.Fetched
		lib   events.Include
		reuse *events.Reuse
	}
	newFixture := func(t *testing.T) *fixture {
		store, err := storage.NewDir(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		ctx := context.Background()
		var libArtifact bytes.Buffer
		res, err := archive.Canonicalize(&libArtifact, bytes.NewReader(stagingTar(t, writeFiles(t, libTree))), archive.CanonicalOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cached := libArtifact.Bytes()
		for key, b := range map[string][]byte{libDir + "lib.tar.gz": cached, contentcache.ArtifactKey(cacheKey): cached} {
			if _, err := store.Put(ctx, key, bytes.NewReader(b)); err != nil {
				t.Fatal(err)
			}
		}
		f := fetched("job-1", "app", "app.tar.gz")
		if _, err := store.Put(ctx, f.Staging, bytes.NewReader(stagingTar(t, writeFiles(t, appTree)))); err != nil {
			t.Fatal(err)
		}
		lib := events.Include{Name: "lib", ToPath: "lib"}
		lib.Artifact.Path, lib.Artifact.Digest = libDir+"lib.tar.gz", res.Digest.String()
		return &fixture{store: store, job: f, lib: lib,
			reuse: &events.Reuse{Key: contentcache.ArtifactKey(cacheKey), Digest: res.Digest.String(), Size: res.Size}}
	}
	stage := func(content []byte) func(*testing.T, *fixture) {
		return func(t *testing.T, fx *fixture) {
			if _, err := fx.store.Put(context.Background(), fx.job.Staging, bytes.NewReader(content)); err != nil {
				t.Fatal(err)
			}
		}
	}
	include := func(from string) func(*testing.T, *fixture) {
		return func(_ *testing.T, fx *fixture) {
			in := fx.lib
			in.FromPath = from
			fx.job.Includes = []events.Include{in}
		}
	}
	reuse := func(_ *testing.T, fx *fixture) { fx.job.Reuse = fx.reuse }

	type want struct {
		condition, reason string
		handling          failure.Handling
		message           string // the message starts with it
	}
	const archiving = "unable to archive artifact to storage: "
	storageFailed := func(msg string) *want {
		return &want{sourcev1.StorageOperationFailedCondition, sourcev1.ArchiveOperationFailedReason, failure.Transient, archiving + msg}
	}
	contentFailed := func(msg string) *want {
		return &want{sourcev1.StorageOperationFailedCondition, sourcev1.ArchiveOperationFailedReason, failure.Final, archiving + msg}
	}
	cases := []struct {
		step  string
		setup func(*testing.T, *fixture)
		fault fault
		// bus makes publishing fail.
		bus bool
		// want is nil for the platform's error.
		want *want
	}{
		{step: "plan: invalid artifact name", setup: func(_ *testing.T, fx *fixture) { fx.job.ArtifactName = "../x.tar.gz" },
			want: contentFailed("invalid artifact name")},
		{step: "plan: invalid cached artifact key", setup: func(_ *testing.T, fx *fixture) {
			fx.job.Reuse = &events.Reuse{Key: libDir + "lib.tar.gz"}
		}, want: contentFailed("invalid cached artifact key")},
		{step: "includes: path outside the artifact", setup: include("../up"),
			want: &want{sourcev1.IncludeUnavailableCondition, "IllegalPath", failure.Stalling, "path calculation for include 'lib' failed"}},
		{step: "staged content: open", fault: fault{op: "open", prefix: storage.StagingDir}, want: storageFailed("open staged content: disk on fire")},
		{step: "staged content: read", fault: fault{op: "read", prefix: storage.StagingDir},
			want: storageFailed("read staged content: connection reset by peer")},
		{step: "staged content: read, with includes", setup: include(""), fault: fault{op: "read", prefix: storage.StagingDir},
			want: storageFailed("read staged content: connection reset by peer")},
		{step: "staged content: gone, artifact not stored", setup: func(t *testing.T, fx *fixture) {
			if err := fx.store.Delete(context.Background(), fx.job.Staging); err != nil {
				t.Fatal(err)
			}
		}, want: contentFailed("staged content .staging/")},
		{step: "canonicalise: not a tar", setup: stage([]byte(strings.Repeat("not a tar\n", 100))),
			want: contentFailed("read staged content: archive/tar")},
		{step: "canonicalise: unsafe path", setup: stage(rawTar(t, &tar.Header{Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})),
			want: contentFailed(`unsafe path in archive: "../evil"`)},
		{step: "merge: staged content out of order", setup: func(t *testing.T, fx *fixture) {
			include("")(t, fx)
			stage(rawTar(t, &tar.Header{Name: "b", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1},
				&tar.Header{Name: "a", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1}))(t, fx)
		}, want: contentFailed("entries not in canonical order")},
		{step: "includes: artifact missing", setup: func(t *testing.T, fx *fixture) {
			include("")(t, fx)
			fx.job.Includes[0].Artifact.Path = libDir + "gone.tar.gz"
		}, want: &want{sourcev1.IncludeUnavailableCondition, "NoArtifact", failure.Final, "no artifact available for include 'lib'"}},
		{step: "includes: open", setup: include(""), fault: fault{op: "open", prefix: libDir},
			want: storageFailed("open artifact of include 'lib': disk on fire")},
		{step: "includes: read", setup: include(""), fault: fault{op: "read", prefix: libDir},
			want: storageFailed("read artifact of include 'lib': connection reset by peer")},
		{step: "merge: fromPath not in the included artifact", setup: include("nope"),
			want: &want{sourcev1.StorageOperationFailedCondition, "CopyFailure", failure.Final, "failed to copy 'lib' include"}},
		{step: "merge: included artifact of another digest", setup: func(t *testing.T, fx *fixture) {
			include("")(t, fx)
			fx.job.Includes[0].Artifact.Digest = "sha256:" + strings.Repeat("0", 64)
		}, want: &want{sourcev1.IncludeUnavailableCondition, "NoArtifact", failure.Final, "no artifact available for include 'lib': failed to verify"}},
		{step: "store: write", fault: fault{op: "put", prefix: appDir}, want: storageFailed("store artifact: disk on fire")},
		{step: "store: write, with includes", setup: include(""), fault: fault{op: "put", prefix: appDir},
			want: storageFailed("store artifact: disk on fire")},
		{step: "store: short write", fault: fault{op: "short-put", prefix: appDir}, want: storageFailed("store artifact " + appDir)},
		{step: "reuse: cached artifact gone", setup: func(t *testing.T, fx *fixture) {
			reuse(t, fx)
			if err := fx.store.Delete(context.Background(), fx.reuse.Key); err != nil {
				t.Fatal(err)
			}
		}, want: contentFailed("cached artifact .cache/" + cacheKey + ".tar.gz is gone")},
		{step: "reuse: cached artifact of another size", setup: func(t *testing.T, fx *fixture) {
			reuse(t, fx)
			fx.reuse.Size++
		}, want: contentFailed("cached artifact .cache/")},
		{step: "reuse: cached artifact with another digest", setup: func(t *testing.T, fx *fixture) {
			reuse(t, fx)
			fx.reuse.Digest = "sha256:" + strings.Repeat("0", 64)
		}, want: contentFailed("cached artifact .cache/" + cacheKey + ".tar.gz does not match its digest")},
		{step: "reuse: open", setup: reuse, fault: fault{op: "open", prefix: contentcache.Dir}, want: storageFailed("disk on fire")},
		{step: "reuse: read", setup: reuse, fault: fault{op: "read", prefix: contentcache.Dir}, want: storageFailed("read artifact .cache/")},
		{step: "reuse: copy", setup: reuse, fault: fault{op: "copy", prefix: contentcache.Dir}, want: storageFailed("copy cached artifact: disk on fire")},
		{step: "reuse: cached artifact replaced after the check", setup: reuse, fault: fault{op: "replace", prefix: contentcache.Dir},
			want: storageFailed("copy cached artifact: copy .cache/")},
		{step: "latest", fault: fault{op: "latest", prefix: appDir}, want: storageFailed("update latest pointer: disk on fire")},
		{step: "latest, reused", setup: reuse, fault: fault{op: "latest", prefix: appDir}, want: storageFailed("update latest pointer: disk on fire")},
		{step: "announce", bus: true},
	}
	for _, tc := range cases {
		t.Run(tc.step, func(t *testing.T) {
			fx := newFixture(t)
			if tc.setup != nil {
				tc.setup(t, fx)
			}
			tc.fault.Storage = fx.store
			pub := &recorder{}
			if tc.bus {
				pub.err = errors.New("nats: no responders")
			}
			p := New(&tc.fault, pub, defaultOptions(), nil)
			err := p.packageFetched(context.Background(), fx.job)
			if err == nil {
				t.Fatal("the job succeeded")
			}
			got := failure.As(err)
			if tc.want == nil {
				if got != nil {
					t.Fatalf("failure = %+v, want the platform's error", got)
				}
				return
			}
			if got == nil {
				t.Fatalf("error = %v, want a failure", err)
			}
			if got.Condition != tc.want.condition || got.Reason != tc.want.reason || got.Handling != tc.want.handling ||
				!strings.HasPrefix(got.Error(), tc.want.message) {
				t.Errorf("failure = %s/%s %s %q\nwant      %s/%s %s %q...", got.Condition, got.Reason, got.Handling, got.Error(),
					tc.want.condition, tc.want.reason, tc.want.handling, tc.want.message)
			}
			if _, err := fx.store.Stat(context.Background(), appDir+"/app.tar.gz"); err == nil && got.Handling != failure.Transient {
				t.Error("a failed job stored an artifact")
			}
		})
	}
}

// fault is a storage one operation of which fails for the keys under
// prefix: "open", "read" (an object whose reads break halfway), "replace"
// (an object written again, with the same bytes, as soon as it is opened), "put",
// "short-put" (stored, but reported one byte short), "stat", "copy" (of
// a source key) or "latest".
type fault struct {
	storage.Storage
	op, prefix string
}

var errDiskOnFire = errors.New("disk on fire")

func (f *fault) hit(op, key string) bool { return f.op == op && strings.HasPrefix(key, f.prefix) }

func (f *fault) Open(ctx context.Context, key string) (storage.Object, error) {
	if f.hit("open", key) {
		return nil, errDiskOnFire
	}
	obj, err := f.Storage.Open(ctx, key)
	if err == nil && f.hit("replace", key) {
		// The same bytes written again: another object, by its ETag.
		if _, err := f.Storage.Put(ctx, key, io.NewSectionReader(obj.(io.ReaderAt), 0, obj.Info().Size)); err != nil {
			return nil, err
		}
	}
	if err != nil || !f.hit("read", key) {
		return obj, err
	}
	return &brokenObject{Object: obj, left: obj.Info().Size / 2}, nil
}

func (f *fault) Put(ctx context.Context, key string, r io.Reader) (storage.Info, error) {
	switch {
	case f.hit("put", key):
		if _, err := io.ReadFull(r, make([]byte, 16)); err != nil {
			return storage.Info{}, err
		}
		return storage.Info{}, errDiskOnFire
	case f.hit("short-put", key):
		info, err := f.Storage.Put(ctx, key, r)
		info.Size--
		return info, err
	}
	return f.Storage.Put(ctx, key, r)
}

func (f *fault) Stat(ctx context.Context, key string) (storage.Info, error) {
	if f.hit("stat", key) {
		return storage.Info{}, errDiskOnFire
	}
	return f.Storage.Stat(ctx, key)
}

func (f *fault) Copy(ctx context.Context, src, dst string) (storage.Info, error) {
	if f.hit("copy", src) {
		return storage.Info{}, errDiskOnFire
	}
	return f.Storage.Copy(ctx, src, dst)
}

func (f *fault) CopyMatching(ctx context.Context, src storage.Info, dst string) (storage.Info, error) {
	if f.hit("copy", src.Key) {
		return storage.Info{}, errDiskOnFire
	}
	return f.Storage.CopyMatching(ctx, src, dst)
}

func (f *fault) SetLatest(ctx context.Context, key, target string, requestedAt time.Time) error {
	if f.hit("latest", key) {
		return errDiskOnFire
	}
	return f.Storage.SetLatest(ctx, key, target, requestedAt)
}
