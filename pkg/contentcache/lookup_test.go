package contentcache

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

func TestKey(t *testing.T) {
	include := events.Include{Name: "lib", Artifact: meta.Artifact{Digest: "sha256:aa"}, ToPath: "lib"}
	base := func() (string, []string, string, []events.Include, int64) {
		return "GitRepository", []string{"https://example.com/repo.git", "-", "-", "-"}, "main@sha1:abc", []events.Include{include}, 0
	}
	key := func(mutate func(kind *string, identity []string, revision *string, includes *[]events.Include, maxFileSize *int64)) string {
		kind, identity, revision, includes, maxFileSize := base()
		if mutate != nil {
			mutate(&kind, identity, &revision, &includes, &maxFileSize)
		}
		return Key(kind, identity, revision, includes, maxFileSize)
	}
	same := key(nil)
	if len(same) != 64 || strings.Trim(same, "0123456789abcdef") != "" {
		t.Fatalf("key %q is not 64 hex digits", same)
	}
	if again := key(nil); again != same {
		t.Fatalf("the same parts gave %s and %s", same, again)
	}
	// Another include name is the same content.
	if k := key(func(_ *string, _ []string, _ *string, in *[]events.Include, _ *int64) {
		*in = []events.Include{{Name: "other", Artifact: meta.Artifact{Digest: "sha256:aa"}, ToPath: "lib"}}
	}); k != same {
		t.Errorf("the include's name changed the key")
	}
	changes := map[string]func(*string, []string, *string, *[]events.Include, *int64){
		"kind": func(k *string, _ []string, _ *string, _ *[]events.Include, _ *int64) { *k = "Bucket" },
		"url": func(_ *string, id []string, _ *string, _ *[]events.Include, _ *int64) {
			id[0] = "https://example.com/other.git"
		},
		"ignore":   func(_ *string, id []string, _ *string, _ *[]events.Include, _ *int64) { id[1] = "+*.md" },
		"revision": func(_ *string, _ []string, r *string, _ *[]events.Include, _ *int64) { *r = "main@sha1:abd" },
		"include digest": func(_ *string, _ []string, _ *string, in *[]events.Include, _ *int64) {
			*in = []events.Include{{Artifact: meta.Artifact{Digest: "sha256:ab"}, ToPath: "lib"}}
		},
		"include path": func(_ *string, _ []string, _ *string, in *[]events.Include, _ *int64) {
			*in = []events.Include{{Artifact: meta.Artifact{Digest: "sha256:aa"}, ToPath: "vendor"}}
		},
		"no include":    func(_ *string, _ []string, _ *string, in *[]events.Include, _ *int64) { *in = nil },
		"max file size": func(_ *string, _ []string, _ *string, _ *[]events.Include, m *int64) { *m = 1 << 20 },
		// Fields are delimited: moving a character between two changes the key.
		"boundaries": func(_ *string, id []string, _ *string, _ *[]events.Include, _ *int64) {
			id[0], id[1] = "https://example.com/repo.git-", ""
		},
	}
	seen := map[string]string{same: "base"}
	for name, change := range changes {
		k := key(change)
		if prev, dup := seen[k]; dup {
			t.Errorf("changing %s gives the key of %s", name, prev)
		}
		seen[k] = name
	}
}

// fixture is a directory storage with one cache entry for key.
type fixture struct {
	store *storage.Dir
	key   string
	index Index
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	store, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	f := &fixture{store: store, key: Key("GitRepository", []string{"u"}, "main@sha1:abc", nil, 0)}
	f.index = Index{
		Key: f.key, Artifact: ArtifactKey(f.key), Digest: "sha256:0123", Algorithm: "sha256", Size: 7,
		Revision: "main@sha1:abc", ArtifactName: "abc.tar.gz", EventMessage: "stored artifact for commit 'x'",
	}
	f.putIndex(t, f.index)
	if _, err := store.Put(context.Background(), ArtifactKey(f.key), strings.NewReader("tarball")); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) putIndex(t *testing.T, idx Index) {
	t.Helper()
	body, err := json.Marshal(idx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Put(context.Background(), IndexKey(f.key), strings.NewReader(string(body))); err != nil {
		t.Fatal(err)
	}
}

func TestLookup(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name     string
		mutate   func(t *testing.T, f *fixture)
		revision string
		hit      bool
	}{
		{name: "hit", revision: "main@sha1:abc", hit: true},
		{name: "another revision", revision: "main@sha1:abd"},
		{name: "no index", revision: "main@sha1:abc", mutate: func(t *testing.T, f *fixture) {
			if err := f.store.Delete(ctx, IndexKey(f.key)); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "artifact gone", revision: "main@sha1:abc", mutate: func(t *testing.T, f *fixture) {
			if err := f.store.Delete(ctx, ArtifactKey(f.key)); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "artifact of another size", revision: "main@sha1:abc", mutate: func(t *testing.T, f *fixture) {
			if _, err := f.store.Put(ctx, ArtifactKey(f.key), strings.NewReader("other tarball")); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "malformed index", revision: "main@sha1:abc", mutate: func(t *testing.T, f *fixture) {
			if _, err := f.store.Put(ctx, IndexKey(f.key), strings.NewReader("{not json")); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "index of another key", revision: "main@sha1:abc", mutate: func(t *testing.T, f *fixture) {
			idx := f.index
			idx.Key = strings.Repeat("0", 64)
			f.putIndex(t, idx)
		}},
		{name: "index naming another artifact", revision: "main@sha1:abc", mutate: func(t *testing.T, f *fixture) {
			idx := f.index
			idx.Artifact = "gitrepository/default/other/abc.tar.gz"
			f.putIndex(t, idx)
		}},
		{name: "digest of another algorithm", revision: "main@sha1:abc", mutate: func(t *testing.T, f *fixture) {
			idx := f.index
			idx.Algorithm = "sha512"
			f.putIndex(t, idx)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.mutate != nil {
				tc.mutate(t, f)
			}
			idx, err := Lookup(ctx, f.store, f.key, tc.revision)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.hit {
				if idx != nil {
					t.Fatalf("Lookup = %+v, want a miss", idx)
				}
				return
			}
			if idx == nil || !reflect.DeepEqual(*idx, f.index) {
				t.Fatalf("Lookup = %+v, want %+v", idx, f.index)
			}
		})
	}
}

// TestLookupWritesNothing: the fetcher looks entries up; only the packager
// writes the cache, old indexes included (Refresh).
func TestLookupWritesNothing(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	old := time.Now().Add(-2 * RefreshAfter)
	if err := os.Chtimes(filepath.Join(f.store.Path(), filepath.FromSlash(IndexKey(f.key))), old, old); err != nil {
		t.Fatal(err)
	}
	store := &readOnly{Storage: f.store}
	for _, revision := range []string{f.index.Revision, "main@sha1:abd"} {
		if _, err := Lookup(ctx, store, f.key, revision); err != nil {
			t.Fatal(err)
		}
	}
	if store.writes != nil {
		t.Errorf("Lookup wrote %q", store.writes)
	}
	if st, err := f.store.Stat(ctx, IndexKey(f.key)); err != nil || !st.ModTime.Equal(old) {
		t.Errorf("index after Lookup: %+v, %v; want it untouched", st, err)
	}
}

func TestRefresh(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	path := filepath.Join(f.store.Path(), filepath.FromSlash(IndexKey(f.key)))
	old := time.Now().Add(-2 * RefreshAfter)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	modTime := func() time.Time {
		t.Helper()
		st, err := f.store.Stat(ctx, IndexKey(f.key))
		if err != nil {
			t.Fatal(err)
		}
		return st.ModTime
	}
	idx := f.index
	idx.Artifact = ""

	// A recent index is left alone.
	if err := Refresh(ctx, f.store, idx, old.Add(RefreshAfter/2)); err != nil {
		t.Fatal(err)
	}
	if got := modTime(); !got.Equal(old) {
		t.Fatalf("index of age %s rewritten at %s", RefreshAfter/2, got)
	}
	// An old one is written again, the same.
	if err := Refresh(ctx, f.store, idx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := modTime(); time.Since(got) > time.Minute {
		t.Fatalf("index not refreshed: written %s", got)
	}
	if got, err := Lookup(ctx, f.store, f.key, f.index.Revision); err != nil || got == nil || !reflect.DeepEqual(*got, f.index) {
		t.Fatalf("after the refresh Lookup = %+v, %v; want %+v", got, err, f.index)
	}
	// One the janitor removed is written again.
	if err := f.store.Delete(ctx, IndexKey(f.key)); err != nil {
		t.Fatal(err)
	}
	if err := Refresh(ctx, f.store, idx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got, err := Lookup(ctx, f.store, f.key, f.index.Revision); err != nil || got == nil || !reflect.DeepEqual(*got, f.index) {
		t.Fatalf("after the index was removed and refreshed Lookup = %+v, %v; want %+v", got, err, f.index)
	}
}

// readOnly is a storage that records the writes asked of it and makes none.
type readOnly struct {
	storage.Storage
	writes []string
}

func (s *readOnly) Put(_ context.Context, key string, _ io.Reader) (storage.Info, error) {
	s.writes = append(s.writes, "put "+key)
	return storage.Info{}, errors.New("read-only")
}

func (s *readOnly) Delete(_ context.Context, key string) error {
	s.writes = append(s.writes, "delete "+key)
	return errors.New("read-only")
}

func (s *readOnly) SetLatest(_ context.Context, key, _ string, _ time.Time) error {
	s.writes = append(s.writes, "set latest "+key)
	return errors.New("read-only")
}

func (s *readOnly) Copy(_ context.Context, _, dst string) (storage.Info, error) {
	s.writes = append(s.writes, "copy to "+dst)
	return storage.Info{}, errors.New("read-only")
}
