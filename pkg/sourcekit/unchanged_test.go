package sourcekit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// TestUnchangedCheckReadsTheArtifactOnce runs a steady source's quiet
// jobs: the stored artifact is read through at the first check only,
// while storage describes it the same way; one replaced by another size
// is read, found corrupt and not offered as Previous.
func TestUnchangedCheckReadsTheArtifactOnce(t *testing.T) {
	dir := t.TempDir()
	dirStore, err := storage.NewDir(filepath.Join(dir, "storage"))
	if err != nil {
		t.Fatal(err)
	}
	store := &countingStore{Storage: dirStore}
	ctx := context.Background()
	const key = "widget/ns/w/a.tar.gz"
	if _, err := dirStore.Put(ctx, key, strings.NewReader("artifact")); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("artifact"))
	prev := &meta.Artifact{Path: key, Revision: "v1", Digest: "sha256:" + hex.EncodeToString(sum[:])}
	var offered []*meta.Artifact
	fetch := func(_ context.Context, req *Request) (*Result, error) {
		offered = append(offered, req.Previous)
		if req.Previous == nil {
			return nil, Final("Gone", "no previous")
		}
		return &Result{Unchanged: true}, nil
	}
	h := newHandler("Widget", fetch, store, nil, nil, Options{WorkDir: dir, Timeout: time.Minute, VerifyInterval: time.Hour})
	msg := &events.Message{Data: &events.FetchRequested{
		Job:      events.Job{ID: "j", Object: events.ObjectRef{Kind: "Widget", Namespace: "ns", Name: "w"}},
		Previous: prev, Quiet: true,
		Plugin: &events.PluginSpec{APIVersion: "example.com/v1", Kind: "Widget"},
	}}
	for i := range 3 {
		if err := h.handle(ctx, msg, bus.Delivery{}); err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
	}
	if n := store.read.Load(); n != int64(len("artifact")) {
		t.Errorf("%d bytes read in three checks, want the artifact's %d once", n, len("artifact"))
	}
	if _, err := dirStore.Put(ctx, key, strings.NewReader("truncated")); err != nil {
		t.Fatal(err)
	}
	err = h.handle(ctx, msg, bus.Delivery{})
	if len(offered) != 4 || offered[3] != nil || err == nil {
		t.Errorf("a replaced artifact: offered %v, err %v; want it not offered", offered, err)
	}
}
