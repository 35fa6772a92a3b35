package fetchjob

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/opencontainers/go-digest"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// opensCounted counts the objects opened (read through) in a Storage.
type opensCounted struct {
	storage.Storage
	opens atomic.Int64
}

func (s *opensCounted) Open(ctx context.Context, key string) (storage.Object, error) {
	s.opens.Add(1)
	return s.Storage.Open(ctx, key)
}

// TestCheckPrevious checks stored artifacts in each state: intact, gone,
// at a key storage refuses, corrupt, with a digest that cannot be read.
func TestCheckPrevious(t *testing.T) {
	store, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const key = "widget/ns/w/a.tar.gz"
	if _, err := store.Put(ctx, key, strings.NewReader("artifact")); err != nil {
		t.Fatal(err)
	}
	intact := digest.SHA256.FromString("artifact").String()
	other := digest.SHA256.FromString("other").String()
	cases := []struct {
		name        string
		prev        meta.Artifact
		wantReason  string
		wantMessage string
	}{
		{name: "intact", prev: meta.Artifact{Path: key, Digest: intact}},
		{name: "missing", prev: meta.Artifact{Path: "widget/ns/w/gone.tar.gz", Digest: intact},
			wantReason: events.ArtifactMissingReason, wantMessage: "artifact 'widget/ns/w/gone.tar.gz' is missing from storage: rebuilding"},
		{name: "invalid key", prev: meta.Artifact{Path: "../escape.tar.gz", Digest: intact},
			wantReason: events.ArtifactMissingReason, wantMessage: "artifact '../escape.tar.gz' is missing from storage: rebuilding"},
		{name: "corrupt", prev: meta.Artifact{Path: key, Digest: other},
			wantReason:  events.ArtifactVerificationFailedReason,
			wantMessage: "failed to verify integrity of artifact: computed digest doesn't match '" + other + "'"},
		{name: "unreadable digest", prev: meta.Artifact{Path: key, Digest: "sha256:nope"},
			wantReason: events.ArtifactVerificationFailedReason, wantMessage: "failed to verify integrity of artifact: verify " + key},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			notice, err := CheckPrevious(ctx, store, nil, &tc.prev)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantReason == "" {
				if notice != nil {
					t.Fatalf("notice %+v for an intact artifact", notice)
				}
				return
			}
			if notice == nil || !notice.Warning || notice.Reason != tc.wantReason || !strings.HasPrefix(notice.Message, tc.wantMessage) {
				t.Errorf("notice %+v, want a Warning %s %q", notice, tc.wantReason, tc.wantMessage)
			}
		})
	}
}

// TestCheckPreviousThroughVerified reads an artifact found intact once,
// while storage describes it unchanged.
func TestCheckPreviousThroughVerified(t *testing.T) {
	dir, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := &opensCounted{Storage: dir}
	ctx := context.Background()
	prev := &meta.Artifact{Path: "widget/ns/w/a.tar.gz", Digest: digest.SHA256.FromString("artifact").String()}
	if _, err := dir.Put(ctx, prev.Path, strings.NewReader("artifact")); err != nil {
		t.Fatal(err)
	}
	verified := &storage.Verified{Interval: time.Hour}
	for range 3 {
		if notice, err := CheckPrevious(ctx, store, verified, prev); notice != nil || err != nil {
			t.Fatalf("CheckPrevious = %+v, %v", notice, err)
		}
	}
	if n := store.opens.Load(); n != 1 {
		t.Errorf("the artifact was read %d times in three checks, want 1", n)
	}
	if _, err := dir.Put(ctx, prev.Path, strings.NewReader("truncated")); err != nil {
		t.Fatal(err)
	}
	if notice, err := CheckPrevious(ctx, store, verified, prev); err != nil || notice == nil ||
		notice.Reason != events.ArtifactVerificationFailedReason {
		t.Errorf("a replaced artifact: %+v, %v; want ArtifactVerificationFailed", notice, err)
	}
}

func TestHasNotice(t *testing.T) {
	notices := []events.Notice{{Reason: events.ArtifactMissingReason}}
	if !HasNotice(notices, events.ArtifactMissingReason) || HasNotice(notices, events.ArtifactVerificationFailedReason) || HasNotice(nil, "x") {
		t.Errorf("HasNotice is wrong about %+v", notices)
	}
}
