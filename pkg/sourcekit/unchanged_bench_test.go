package sourcekit

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// countingStore counts the bytes read through the objects it opens.
type countingStore struct {
	storage.Storage
	read atomic.Int64
}

func (s *countingStore) Open(ctx context.Context, key string) (storage.Object, error) {
	obj, err := s.Storage.Open(ctx, key)
	if err != nil {
		return nil, err
	}
	return &countingObject{Object: obj, read: &s.read}, nil
}

type countingObject struct {
	storage.Object
	read *atomic.Int64
}

func (o *countingObject) Read(p []byte) (int, error) {
	n, err := o.Object.Read(p)
	o.read.Add(int64(n))
	return n, err
}

// BenchmarkUnchangedCheck is a steady plug-in source's job: a 4 MiB
// artifact stored on directory storage, a Fetch that answers unchanged
// (a 304), a quiet job (nothing is published). It reports the bytes of
// the stored artifact read per job besides the time.
func BenchmarkUnchangedCheck(b *testing.B) {
	const size = 4 << 20
	dir := b.TempDir()
	dirStore, err := storage.NewDir(filepath.Join(dir, "storage"))
	if err != nil {
		b.Fatal(err)
	}
	store := &countingStore{Storage: dirStore}
	ctx := context.Background()
	content := make([]byte, size)
	if _, err := rand.Read(content); err != nil {
		b.Fatal(err)
	}
	const key = "widget/ns/w/a.tar.gz"
	if _, err := dirStore.Put(ctx, key, bytes.NewReader(content)); err != nil {
		b.Fatal(err)
	}
	sum := sha256.Sum256(content)
	prev := &meta.Artifact{Path: key, Revision: "v1", Digest: "sha256:" + hex.EncodeToString(sum[:])}
	fetches := 0
	fetch := func(_ context.Context, req *Request) (*Result, error) {
		fetches++
		if req.Previous == nil {
			b.Fatal("the intact artifact was not offered as Previous")
		}
		return &Result{Unchanged: true}, nil
	}
	// The kit's defaults (BindFlags): the stored artifact is trusted for
	// an hour while storage describes it the same way.
	h := newHandler("Widget", fetch, store, nil, nil, Options{WorkDir: dir, Timeout: time.Minute, VerifyInterval: storage.DefaultVerifyInterval})
	msg := &events.Message{Data: &events.FetchRequested{
		Job:      events.Job{ID: "j", Object: events.ObjectRef{Kind: "Widget", Namespace: "ns", Name: "w"}},
		Previous: prev, Quiet: true,
		Plugin: &events.PluginSpec{APIVersion: "example.com/v1", Kind: "Widget"},
	}}
	b.ResetTimer()
	for b.Loop() {
		if err := h.handle(ctx, msg, bus.Delivery{}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if fetches == 0 {
		b.Fatal("Fetch was never called")
	}
	b.ReportMetric(float64(store.read.Load())/float64(fetches), "B-read/op")
}
