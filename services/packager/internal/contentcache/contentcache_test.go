package contentcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/headwater-gitops/headwater/pkg/storage"
)

// key returns a content key made from s.
func key(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func newStore(t *testing.T) *storage.Dir {
	t.Helper()
	s, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func put(t *testing.T, s *storage.Dir, k, content string) {
	t.Helper()
	if _, err := s.Put(context.Background(), k, strings.NewReader(content)); err != nil {
		t.Fatal(err)
	}
}

// age sets the modification time of key to now-age.
func age(t *testing.T, s *storage.Dir, k string, age time.Duration) {
	t.Helper()
	mt := time.Now().Add(-age)
	if err := os.Chtimes(filepath.Join(s.Path(), filepath.FromSlash(k)), mt, mt); err != nil {
		t.Fatal(err)
	}
}

func exists(s *storage.Dir, k string) bool {
	_, err := s.Stat(context.Background(), k)
	return err == nil
}

func TestRecord(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	put(t, s, "gitrepository/default/app/abc.tar.gz", "tarball")
	k := key("app")
	idx := Index{Key: k, Digest: "sha256:00", Algorithm: "sha256", Size: 7, Revision: "main@sha1:abc",
		ArtifactName: "abc.tar.gz", EventMessage: "stored artifact for commit 'x'"}
	if err := Record(ctx, s, "gitrepository/default/app/abc.tar.gz", idx); err != nil {
		t.Fatal(err)
	}
	obj, err := s.Open(ctx, IndexKey(k))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(obj)
	obj.Close()
	if err != nil {
		t.Fatal(err)
	}
	// The format the fetcher reads (its package contentcache).
	want := `{"key":"` + k + `","artifact":".cache/` + k + `.tar.gz","digest":"sha256:00","algorithm":"sha256","size":7,` +
		`"revision":"main@sha1:abc","artifactName":"abc.tar.gz","eventMessage":"stored artifact for commit 'x'"}`
	if string(body) != want {
		t.Errorf("index = %s\nwant    %s", body, want)
	}
	var got Index
	if err := json.Unmarshal(body, &got); err != nil || got.Artifact != ArtifactKey(k) {
		t.Errorf("index decodes to %+v, %v", got, err)
	}
	if err := storage.Verify(ctx, s, ArtifactKey(k), "sha256:"+hex.EncodeToString(sha256sum("tarball"))); err != nil {
		t.Errorf("cached artifact: %v", err)
	}

	// A size that does not match is an error.
	idx.Size = 8
	if err := Record(ctx, s, "gitrepository/default/app/abc.tar.gz", idx); err == nil {
		t.Error("Record accepted a size that does not match")
	}
	for _, bad := range []string{"", "../x", strings.Repeat("A", 64), strings.Repeat("a", 63)} {
		idx.Key = bad
		if err := Record(ctx, s, "gitrepository/default/app/abc.tar.gz", idx); err == nil {
			t.Errorf("Record accepted key %q", bad)
		}
	}
	if err := Forget(ctx, s, k); err != nil {
		t.Fatal(err)
	}
	if exists(s, IndexKey(k)) || exists(s, ArtifactKey(k)) {
		t.Error("Forget left the entry")
	}
	if !exists(s, "gitrepository/default/app/abc.tar.gz") {
		t.Error("Forget removed the source's artifact")
	}
}

func sha256sum(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

func TestKeyOfArtifact(t *testing.T) {
	k := key("x")
	for in, want := range map[string]bool{
		ArtifactKey(k):                             true,
		IndexKey(k):                                false,
		".cache/" + k:                              false,
		".staging/" + k + ".tar.gz":                false,
		"gitrepository/default/app/abc.tar.gz":     false,
		".cache/" + strings.ToUpper(k) + ".tar.gz": false,
		".cache/sub/" + k + ".tar.gz":              false,
	} {
		got, ok := KeyOfArtifact(in)
		if ok != want || (ok && got != k) {
			t.Errorf("KeyOfArtifact(%q) = %q, %v; want %v", in, got, ok, want)
		}
	}
}

func TestSweep(t *testing.T) {
	const ttl = time.Hour
	s := newStore(t)
	ctx := context.Background()
	entry := func(name string, indexAge, artifactAge time.Duration, withIndex, withArtifact bool) string {
		k := key(name)
		if withIndex {
			put(t, s, IndexKey(k), "{}")
			age(t, s, IndexKey(k), indexAge)
		}
		if withArtifact {
			put(t, s, ArtifactKey(k), name)
			age(t, s, ArtifactKey(k), artifactAge)
		}
		return k
	}
	fresh := entry("fresh", time.Minute, 3*ttl, true, true) // in use: its index was refreshed
	expired := entry("expired", 2*ttl, 2*ttl, true, true)
	wanted := entry("expired-but-wanted", 2*ttl, 2*ttl, true, true)
	orphan := entry("orphan", 0, time.Second, false, true)
	noArtifact := entry("index-without-artifact", 2*ttl, 0, true, false)
	put(t, s, Dir+"/README", "not an entry")
	age(t, s, Dir+"/README", 10*ttl)

	jobsErr := errors.New("stream unavailable")
	var failJobs bool
	j := &Janitor{Store: s, TTL: ttl, Log: testr.New(t), Jobs: func(context.Context) (map[string]bool, error) {
		if failJobs {
			return nil, jobsErr
		}
		return map[string]bool{ArtifactKey(wanted): true}, nil
	}}

	deleted, err := j.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(deleted)
	want := []string{IndexKey(expired), ArtifactKey(expired), IndexKey(wanted), IndexKey(noArtifact), ArtifactKey(orphan)}
	slices.Sort(want)
	if !slices.Equal(deleted, want) {
		t.Errorf("deleted %q\nwant    %q", deleted, want)
	}
	for k, keep := range map[string]bool{
		IndexKey(fresh): true, ArtifactKey(fresh): true,
		ArtifactKey(wanted): true, // a pending job copies it
		Dir + "/README":     true,
		IndexKey(expired):   false, ArtifactKey(expired): false, ArtifactKey(orphan): false, IndexKey(noArtifact): false,
	} {
		if got := exists(s, k); got != keep {
			t.Errorf("%s exists = %v, want %v", k, got, keep)
		}
	}

	// Without the pending jobs, indexes still expire but no artifact goes.
	failJobs = true
	again := entry("expired-again", 2*ttl, 2*ttl, true, true)
	deleted, err = j.Sweep(ctx)
	if !errors.Is(err, jobsErr) {
		t.Fatalf("Sweep without jobs: %v, want the jobs' error", err)
	}
	if !slices.Equal(deleted, []string{IndexKey(again)}) || !exists(s, ArtifactKey(again)) || !exists(s, ArtifactKey(wanted)) {
		t.Errorf("Sweep without jobs deleted %q", deleted)
	}

	// Once no job wants it, the artifact goes.
	failJobs = false
	j.Jobs = func(context.Context) (map[string]bool, error) { return map[string]bool{}, nil }
	deleted, err = j.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(deleted)
	want = []string{ArtifactKey(wanted), ArtifactKey(again)}
	slices.Sort(want)
	if !slices.Equal(deleted, want) {
		t.Errorf("deleted %q, want %q", deleted, want)
	}
	if !exists(s, IndexKey(fresh)) || !exists(s, ArtifactKey(fresh)) {
		t.Error("the entry in use was removed")
	}
}

func TestRunDisabled(t *testing.T) {
	s := newStore(t)
	k := key("old")
	put(t, s, IndexKey(k), "{}")
	age(t, s, IndexKey(k), 24*time.Hour)
	j := &Janitor{Store: s, TTL: 0, Log: testr.New(t), Jobs: func(context.Context) (map[string]bool, error) { return nil, nil }}
	done := make(chan struct{})
	go func() { j.Run(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run with a TTL of 0 did not return")
	}
	if !exists(s, IndexKey(k)) {
		t.Error("a disabled janitor deleted an entry")
	}
}
