package packager

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

func cacheOptions() Options {
	o := defaultOptions()
	o.ContentCacheTTL = time.Hour
	return o
}

func contentKey(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// readIndex reads the content cache index of key.
func (h *harness) readIndex(key string) contentcache.Index {
	h.t.Helper()
	obj, err := h.store.Open(context.Background(), contentcache.IndexKey(key))
	if err != nil {
		h.t.Fatal(err)
	}
	defer obj.Close()
	body, err := io.ReadAll(obj)
	if err != nil {
		h.t.Fatal(err)
	}
	var idx contentcache.Index
	if err := json.Unmarshal(body, &idx); err != nil {
		h.t.Fatal(err)
	}
	return idx
}

// cached packages content for source podinfo with the content key of
// content and returns the index the packager records for it.
func (h *harness) cached(content string) contentcache.Index {
	h.t.Helper()
	f := fetched("job-1", "podinfo", "abc.tar.gz")
	f.ContentKey = contentKey(content)
	h.packaged(f, stagingTar(h.t, writeTree(h.t, time.Unix(1, 0))))
	return h.readIndex(f.ContentKey)
}

// sameFile reports whether two keys are one file (a hard link).
func (h *harness) sameFile(a, b string) bool {
	h.t.Helper()
	fa, err := os.Stat(h.file(a))
	if err != nil {
		h.t.Fatal(err)
	}
	fb, err := os.Stat(h.file(b))
	if err != nil {
		h.t.Fatal(err)
	}
	return os.SameFile(fa, fb)
}

// reusing returns a Fetched job of source name that reuses idx.
func reusing(id, name string, idx contentcache.Index) *events.Fetched {
	f := fetched(id, name, idx.ArtifactName)
	f.Revision, f.EventMessage, f.ContentKey = idx.Revision, idx.EventMessage, idx.Key
	f.Reuse = &events.Reuse{Key: idx.Artifact, Digest: idx.Digest, Size: idx.Size}
	return f
}

func TestContentCacheRecordAndReuse(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: cacheOptions()})
	ctx := context.Background()
	key := contentKey("podinfo@abc")

	// Packaging fetched content records it.
	f := fetched("job-1", "podinfo", "abc.tar.gz")
	f.ContentKey = key
	first := h.packaged(f, stagingTar(t, writeTree(t, time.Unix(1, 0))))
	idx := h.readIndex(key)
	want := contentcache.Index{Key: key, Artifact: contentcache.ArtifactKey(key), Digest: first.Artifact.Digest, Algorithm: "sha256",
		Size: *first.Artifact.Size, Revision: f.Revision, ArtifactName: "abc.tar.gz", EventMessage: f.EventMessage}
	if !reflect.DeepEqual(idx, want) {
		t.Fatalf("index = %+v\nwant    %+v", idx, want)
	}
	if !h.sameFile(idx.Artifact, first.Artifact.Path) {
		t.Error("the cached artifact is not a link to the stored one")
	}

	// Another source reuses it: its own path, the same bytes, no copy.
	g := reusing("job-2", "other", idx)
	h.send(events.TypeFetched, g.Job, g)
	out := h.nextOutcome(events.TypePackaged, "job-2")
	path := storage.ArtifactKey(sourcev1.GitRepositoryKind, "default", "other", "abc.tar.gz")
	if a := out.Artifact; a == nil || a.Path != path || a.Digest != first.Artifact.Digest || *a.Size != *first.Artifact.Size ||
		a.Revision != f.Revision || a.LastUpdateTime.IsZero() {
		t.Fatalf("reused artifact = %+v, want %s with digest %s", out.Artifact, path, first.Artifact.Digest)
	}
	if out.EventMessage != f.EventMessage || out.Revision != f.Revision || len(out.Notices) != 1 {
		t.Errorf("outcome = %+v, want the job's revision, message and notices", out)
	}
	if !h.sameFile(path, idx.Artifact) {
		t.Error("the reused artifact is not a link to the cached one")
	}
	latest := storage.ArtifactKey(sourcev1.GitRepositoryKind, "default", "other", storage.LatestName)
	if err := storage.Verify(ctx, h.store, latest, first.Artifact.Digest); err != nil {
		t.Errorf("latest of the reusing source: %v", err)
	}
	eventually(t, "reuse counted", func() bool {
		return h.metric("headwater_content_cache_artifacts_total", map[string]string{"operation": "reused"}) == 1
	})
	if n := h.metric("headwater_content_cache_artifacts_total", map[string]string{"operation": "recorded"}); n != 1 {
		t.Errorf("recorded = %v, want 1", n)
	}

	// The first source goes away: the cache and the other source keep theirs.
	del := job("job-3", "podinfo")
	h.send(events.TypeDeleteRequested, del, &events.DeleteRequested{Job: del})
	h.nextOutcome(events.TypeDeleted, "job-3")
	for _, k := range []string{idx.Artifact, path} {
		if err := storage.Verify(ctx, h.store, k, first.Artifact.Digest); err != nil {
			t.Errorf("%s after the first source was deleted: %v", k, err)
		}
	}
}

func TestContentCacheOff(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	f := fetched("job-1", "podinfo", "abc.tar.gz")
	f.ContentKey = contentKey("x")
	h.packaged(f, stagingTar(t, writeTree(t, time.Unix(1, 0))))
	if objs, err := h.store.List(context.Background(), contentcache.Dir); err != nil || len(objs) != 0 {
		t.Errorf("content cache = %+v, %v; want nothing recorded with a TTL of 0", objs, err)
	}
}

func TestReuseFailures(t *testing.T) {
	cases := []struct {
		name string
		// setup records an entry and returns the reuse to ask for.
		setup func(h *harness, idx contentcache.Index) *events.Reuse
		// forgotten says the entry is removed from the cache.
		forgotten bool
	}{
		{
			name: "cached artifact gone",
			setup: func(h *harness, idx contentcache.Index) *events.Reuse {
				if err := h.store.Delete(context.Background(), idx.Artifact); err != nil {
					h.t.Fatal(err)
				}
				return &events.Reuse{Key: idx.Artifact, Digest: idx.Digest, Size: idx.Size}
			},
		},
		{
			name: "size does not match",
			setup: func(h *harness, idx contentcache.Index) *events.Reuse {
				return &events.Reuse{Key: idx.Artifact, Digest: idx.Digest, Size: idx.Size + 1}
			},
			forgotten: true,
		},
		{
			name: "digest does not match",
			setup: func(h *harness, idx contentcache.Index) *events.Reuse {
				return &events.Reuse{Key: idx.Artifact, Digest: "sha256:" + strings.Repeat("0", 64), Size: idx.Size}
			},
			forgotten: true,
		},
		{
			name: "not a cached artifact",
			setup: func(h *harness, idx contentcache.Index) *events.Reuse {
				return &events.Reuse{Key: storage.ArtifactKey(sourcev1.GitRepositoryKind, "default", "podinfo", "abc.tar.gz"),
					Digest: idx.Digest, Size: idx.Size}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOptions{opts: cacheOptions()})
			idx := h.cached("podinfo@abc")
			key := idx.Key

			// The other source already has an artifact of the revision,
			// which a failed reuse must leave as it is.
			stored := storage.ArtifactKey(sourcev1.GitRepositoryKind, "default", "other", "abc.tar.gz")
			const intact = "the previously stored, intact artifact"
			if _, err := h.store.Put(context.Background(), stored, strings.NewReader(intact)); err != nil {
				t.Fatal(err)
			}

			g := reusing("job-2", "other", idx)
			g.Reuse = tc.setup(h, idx)
			h.send(events.TypeFetched, g.Job, g)
			out := h.nextOutcome(events.TypePackageFailed, "job-2")
			if out.Failure == nil || out.Failure.Stalled || out.Failure.Condition != sourcev1.StorageOperationFailedCondition {
				t.Errorf("failure = %+v, want a StorageOperationFailed that does not stall", out.Failure)
			}
			if got, err := os.ReadFile(h.file(stored)); err != nil || string(got) != intact {
				t.Errorf("after a failed reuse the stored artifact is %q (%v), want it unchanged", got, err)
			}
			_, err := h.store.Stat(context.Background(), contentcache.IndexKey(key))
			if gone := err != nil; gone != tc.forgotten {
				t.Errorf("index removed = %v, want %v", gone, tc.forgotten)
			}
		})
	}
}

// TestReuseRefreshesTheIndex: the packager, the cache's one writer, keeps
// an entry in use from the janitor: copying it for a source writes its
// index again once it is older than contentcache.RefreshAfter, or when the
// janitor removed it meanwhile.
func TestReuseRefreshesTheIndex(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: cacheOptions()})
	ctx := context.Background()
	idx := h.cached("podinfo@abc")
	key := idx.Key
	indexTime := func() time.Time {
		t.Helper()
		st, err := h.store.Stat(ctx, contentcache.IndexKey(key))
		if err != nil {
			t.Fatal(err)
		}
		return st.ModTime
	}
	age := func(d time.Duration) time.Time {
		t.Helper()
		mt := time.Now().Add(-d).Truncate(time.Second)
		if err := os.Chtimes(h.file(contentcache.IndexKey(key)), mt, mt); err != nil {
			t.Fatal(err)
		}
		return mt
	}
	reuse := func(id, name string) {
		t.Helper()
		g := reusing(id, name, idx)
		h.send(events.TypeFetched, g.Job, g)
		// The index is refreshed before the artifact is announced.
		h.nextOutcome(events.TypePackaged, id)
	}

	// An index used a while ago is written again, the same.
	old := age(2 * contentcache.RefreshAfter)
	reuse("job-2", "other")
	if got := indexTime(); !got.After(old) {
		t.Errorf("index written at %s after a reuse, want it refreshed (it was written at %s)", got, old)
	}
	if got := h.readIndex(key); !reflect.DeepEqual(got, idx) {
		t.Errorf("refreshed index = %+v\nwant %+v", got, idx)
	}

	// A recent one is left alone.
	recent := age(contentcache.RefreshAfter / 2)
	reuse("job-3", "third")
	if got := indexTime(); !got.Equal(recent) {
		t.Errorf("index of age %s rewritten at %s", contentcache.RefreshAfter/2, got)
	}

	// One the janitor removed after the fetcher looked is written again.
	if err := h.store.Delete(ctx, contentcache.IndexKey(key)); err != nil {
		t.Fatal(err)
	}
	reuse("job-4", "fourth")
	if got := h.readIndex(key); !reflect.DeepEqual(got, idx) {
		t.Errorf("index written again = %+v\nwant %+v", got, idx)
	}
}
