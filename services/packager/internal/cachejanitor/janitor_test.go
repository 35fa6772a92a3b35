package cachejanitor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/headwater-gitops/headwater/pkg/contentcache"
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

func TestSweep(t *testing.T) {
	const ttl = time.Hour
	s := newStore(t)
	ctx := context.Background()
	entry := func(name string, indexAge, artifactAge time.Duration, withIndex, withArtifact bool) string {
		k := key(name)
		if withIndex {
			put(t, s, contentcache.IndexKey(k), "{}")
			age(t, s, contentcache.IndexKey(k), indexAge)
		}
		if withArtifact {
			put(t, s, contentcache.ArtifactKey(k), name)
			age(t, s, contentcache.ArtifactKey(k), artifactAge)
		}
		return k
	}
	fresh := entry("fresh", time.Minute, 3*ttl, true, true) // in use: its index was refreshed
	expired := entry("expired", 2*ttl, 2*ttl, true, true)
	wanted := entry("expired-but-wanted", 2*ttl, 2*ttl, true, true)
	orphan := entry("orphan", 0, time.Second, false, true)
	noArtifact := entry("index-without-artifact", 2*ttl, 0, true, false)
	put(t, s, contentcache.Dir+"/README", "not an entry")
	age(t, s, contentcache.Dir+"/README", 10*ttl)

	jobsErr := errors.New("stream unavailable")
	var failJobs bool
	j := &Janitor{Store: s, TTL: ttl, Log: testr.New(t), Jobs: func(context.Context) (map[string]bool, error) {
		if failJobs {
			return nil, jobsErr
		}
		return map[string]bool{contentcache.ArtifactKey(wanted): true}, nil
	}}

	deleted, err := j.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(deleted)
	want := []string{contentcache.IndexKey(expired), contentcache.ArtifactKey(expired), contentcache.IndexKey(wanted), contentcache.IndexKey(noArtifact), contentcache.ArtifactKey(orphan)}
	slices.Sort(want)
	if !slices.Equal(deleted, want) {
		t.Errorf("deleted %q\nwant    %q", deleted, want)
	}
	for k, keep := range map[string]bool{
		contentcache.IndexKey(fresh): true, contentcache.ArtifactKey(fresh): true,
		contentcache.ArtifactKey(wanted): true, // a pending job copies it
		contentcache.Dir + "/README":     true,
		contentcache.IndexKey(expired):   false, contentcache.ArtifactKey(expired): false, contentcache.ArtifactKey(orphan): false, contentcache.IndexKey(noArtifact): false,
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
	if !slices.Equal(deleted, []string{contentcache.IndexKey(again)}) || !exists(s, contentcache.ArtifactKey(again)) || !exists(s, contentcache.ArtifactKey(wanted)) {
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
	want = []string{contentcache.ArtifactKey(wanted), contentcache.ArtifactKey(again)}
	slices.Sort(want)
	if !slices.Equal(deleted, want) {
		t.Errorf("deleted %q, want %q", deleted, want)
	}
	if !exists(s, contentcache.IndexKey(fresh)) || !exists(s, contentcache.ArtifactKey(fresh)) {
		t.Error("the entry in use was removed")
	}
}

func TestRunDisabled(t *testing.T) {
	s := newStore(t)
	k := key("old")
	put(t, s, contentcache.IndexKey(k), "{}")
	age(t, s, contentcache.IndexKey(k), 24*time.Hour)
	j := &Janitor{Store: s, TTL: 0, Log: testr.New(t), Jobs: func(context.Context) (map[string]bool, error) { return nil, nil }}
	done := make(chan struct{})
	go func() { j.Run(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run with a TTL of 0 did not return")
	}
	if !exists(s, contentcache.IndexKey(k)) {
		t.Error("a disabled janitor deleted an entry")
	}
}
