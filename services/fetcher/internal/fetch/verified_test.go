package fetch

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// openCounting counts the objects a handler opens (reads through).
type openCounting struct {
	storage.Storage
	opens atomic.Int64
}

func (s *openCounting) Open(ctx context.Context, key string) (storage.Object, error) {
	s.opens.Add(1)
	return s.Storage.Open(ctx, key)
}

// TestVerifiedArtifactIsNotReadAgain reconciles an unchanged revision
// several times: the stored artifact is read through the first time only,
// while storage describes it the same way and the interval lasts. An
// artifact replaced by one of another size is caught at once; damage that
// keeps its size and modification time, only once the interval has passed.
func TestVerifiedArtifactIsNotReadAgain(t *testing.T) {
	now := time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC)
	var counting *openCounting
	e := newEnv(t, 5, func(h *Handler) {
		counting = &openCounting{Storage: h.Storage}
		h.Storage = counting
		h.Verified = &storage.Verified{Interval: time.Hour, Now: func() time.Time { return now }}
	})
	prev := e.artifact(t, "artifact bytes", "artifact bytes")
	unchanged := func(job string) {
		t.Helper()
		e.request(t, job, func(r *events.FetchRequested) { r.Previous = prev })
		if out := e.outcome(t, events.TypeFetchUnchanged); out.Artifact == nil || out.Artifact.Digest != prev.Digest {
			t.Fatalf("%s: outcome %+v, want the stored artifact", job, out)
		}
	}
	unchanged("job-1")
	unchanged("job-2")
	unchanged("job-3")
	if n := counting.opens.Load(); n != 1 {
		t.Fatalf("the artifact was read %d times in three unchanged reconciles, want 1", n)
	}

	// Bit rot: the same size and modification time, other bytes.
	file := filepath.Join(e.store.Path(), filepath.FromSlash(prev.Path))
	fi, err := os.Stat(file)
	must(t, err)
	must(t, os.WriteFile(file, []byte("artifact byteZ"), 0o644))
	must(t, os.Chtimes(file, fi.ModTime(), fi.ModTime()))
	unchanged("job-4") // not seen within the interval: the trade-off
	now = now.Add(time.Hour)
	e.request(t, "job-5", func(r *events.FetchRequested) { r.Previous = prev })
	if f := e.fetched(t); len(f.Notices) != 1 || f.Notices[0].Reason != ArtifactVerificationFailedReason {
		t.Fatalf("after the interval: notices %+v, want ArtifactVerificationFailed", f.Notices)
	}

	// A replaced artifact (another size) is read, and caught, at once.
	_, err = e.store.Put(e.ctx, prev.Path, strings.NewReader("artifact bytes"))
	must(t, err)
	unchanged("job-6")
	opens := counting.opens.Load()
	_, err = e.store.Put(e.ctx, prev.Path, strings.NewReader("truncated"))
	must(t, err)
	e.request(t, "job-7", func(r *events.FetchRequested) { r.Previous = prev })
	if f := e.fetched(t); len(f.Notices) != 1 || f.Notices[0].Reason != ArtifactVerificationFailedReason {
		t.Fatalf("a replaced artifact: notices %+v, want ArtifactVerificationFailed", f.Notices)
	}
	if n := counting.opens.Load(); n != opens+1 {
		t.Errorf("the replaced artifact was read %d times, want 1", n-opens)
	}
}
