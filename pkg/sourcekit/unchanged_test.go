package sourcekit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strings"
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

// steady is a steady plug-in source: its artifact stored on directory
// storage (counted as it is read), its Fetch answering unchanged when
// offered the artifact as Previous, and its quiet job (nothing is
// published).
type steady struct {
	dir   *storage.Dir
	store *countingStore
	h     *handler
	msg   *events.Message
	// fetches counts Fetch's calls, notOffered those without Previous.
	fetches, notOffered int
}

const steadyKey = "widget/ns/w/a.tar.gz"

func newSteady(tb testing.TB, content []byte, verifyInterval time.Duration) *steady {
	tb.Helper()
	work := tb.TempDir()
	dir, err := storage.NewDir(filepath.Join(work, "storage"))
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := dir.Put(context.Background(), steadyKey, bytes.NewReader(content)); err != nil {
		tb.Fatal(err)
	}
	sum := sha256.Sum256(content)
	prev := &meta.Artifact{Path: steadyKey, Revision: "v1", Digest: "sha256:" + hex.EncodeToString(sum[:])}
	s := &steady{dir: dir, store: &countingStore{Storage: dir}}
	fetch := func(_ context.Context, req *Request) (*Result, error) {
		s.fetches++
		if req.Previous == nil {
			s.notOffered++
			return nil, Final("NoPrevious", "the stored artifact was not offered")
		}
		return &Result{Unchanged: true}, nil
	}
	s.h = newHandler("Widget", fetch, s.store, nil, nil, Options{WorkDir: work, Timeout: time.Minute, VerifyInterval: verifyInterval})
	s.msg = &events.Message{Data: &events.FetchRequested{
		Job:      events.Job{ID: "j", Object: events.ObjectRef{Kind: "Widget", Namespace: "ns", Name: "w"}},
		Previous: prev, Quiet: true,
		Plugin: &events.PluginSpec{APIVersion: "example.com/v1", Kind: "Widget"},
	}}
	return s
}

// check runs the source's job.
func (s *steady) check() error { return s.h.handle(context.Background(), s.msg, bus.Delivery{}) }

// TestUnchangedCheckReadsTheArtifactOnce runs a steady source's jobs: the
// stored artifact is read through at the first check only, while storage
// describes it the same way; one replaced by another size is read, found
// corrupt and not offered as Previous.
func TestUnchangedCheckReadsTheArtifactOnce(t *testing.T) {
	s := newSteady(t, []byte("artifact"), time.Hour)
	for i := range 3 {
		if err := s.check(); err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
	}
	if n := s.store.read.Load(); n != int64(len("artifact")) {
		t.Errorf("%d bytes read in three checks, want the artifact's %d once", n, len("artifact"))
	}
	if _, err := s.dir.Put(context.Background(), steadyKey, strings.NewReader("truncated")); err != nil {
		t.Fatal(err)
	}
	if err := s.check(); err == nil || s.fetches != 4 || s.notOffered != 1 {
		t.Errorf("a replaced artifact: err %v, %d fetches, %d without Previous; want it not offered", err, s.fetches, s.notOffered)
	}
}
