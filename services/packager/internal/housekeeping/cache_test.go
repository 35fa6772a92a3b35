package housekeeping

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/headwater-gitops/headwater/pkg/contentcache"
)

// key returns the content key of a source named name.
func key(name string) string {
	return contentcache.Key("GitRepository", []string{name}, "main@sha1:1", nil, 0)
}

func TestSweepCache(t *testing.T) {
	const ttl = time.Hour
	s := newTestStore(t)
	ctx := context.Background()
	entry := func(name string, indexAge, artifactAge time.Duration, withIndex, withArtifact bool) string {
		k := key(name)
		if withIndex {
			s.putAged(contentcache.IndexKey(k), "{}", indexAge)
		}
		if withArtifact {
			s.putAged(contentcache.ArtifactKey(k), name, artifactAge)
		}
		return k
	}
	fresh := entry("fresh", time.Minute, 3*ttl, true, true) // in use: its index was refreshed
	expired := entry("expired", 2*ttl, 2*ttl, true, true)
	wanted := entry("expired-but-wanted", 2*ttl, 2*ttl, true, true)
	orphan := entry("orphan", 0, time.Second, false, true)
	noArtifact := entry("index-without-artifact", 2*ttl, 0, true, false)
	s.putAged(contentcache.Dir+"/README", "not an entry", 10*ttl)

	jobsErr := errors.New("stream unavailable")
	var failJobs bool
	j := &Janitor{Store: s, CacheTTL: ttl, Log: testr.New(t), Pending: func(context.Context) (map[string]bool, error) {
		if failJobs {
			return nil, jobsErr
		}
		return map[string]bool{contentcache.ArtifactKey(wanted): true}, nil
	}}

	deleted, err := j.SweepCache(ctx)
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
		if got := s.exists(k); got != keep {
			t.Errorf("%s exists = %v, want %v", k, got, keep)
		}
	}

	// Without the pending jobs, indexes still expire but no artifact goes.
	failJobs = true
	again := entry("expired-again", 2*ttl, 2*ttl, true, true)
	deleted, err = j.SweepCache(ctx)
	if !errors.Is(err, jobsErr) {
		t.Fatalf("Sweep without jobs: %v, want the jobs' error", err)
	}
	if !slices.Equal(deleted, []string{contentcache.IndexKey(again)}) || !s.exists(contentcache.ArtifactKey(again)) || !s.exists(contentcache.ArtifactKey(wanted)) {
		t.Errorf("Sweep without jobs deleted %q", deleted)
	}

	// Once no job wants it, the artifact goes.
	failJobs = false
	j.Pending = func(context.Context) (map[string]bool, error) { return map[string]bool{}, nil }
	deleted, err = j.SweepCache(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(deleted)
	want = []string{contentcache.ArtifactKey(wanted), contentcache.ArtifactKey(again)}
	slices.Sort(want)
	if !slices.Equal(deleted, want) {
		t.Errorf("deleted %q, want %q", deleted, want)
	}
	if !s.exists(contentcache.IndexKey(fresh)) || !s.exists(contentcache.ArtifactKey(fresh)) {
		t.Error("the entry in use was removed")
	}
}

func TestRunDisabled(t *testing.T) {
	s := newTestStore(t)
	k := key("old")
	s.putAged(contentcache.IndexKey(k), "{}", 24*time.Hour)
	j := &Janitor{Store: s, Log: testr.New(t), Pending: func(context.Context) (map[string]bool, error) { return nil, nil }}
	done := make(chan struct{})
	go func() { j.Run(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run with a TTL of 0 did not return")
	}
	if !s.exists(contentcache.IndexKey(k)) {
		t.Error("a disabled janitor deleted an entry")
	}
}
