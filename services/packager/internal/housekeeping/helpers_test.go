package housekeeping

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/pkg/storage"
)

// testStore is a directory storage whose objects a test writes with the
// age it needs.
type testStore struct {
	*storage.Dir
	t *testing.T
}

func newTestStore(t *testing.T) *testStore {
	s := &testStore{t: t}
	var err error
	if s.Dir, err = storage.NewDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// putAged stores content at key as if it was written age ago.
func (s *testStore) putAged(key, content string, age time.Duration) {
	s.t.Helper()
	if _, err := s.Put(context.Background(), key, bytes.NewBufferString(content)); err != nil {
		s.t.Fatal(err)
	}
	mt := time.Now().Add(-age)
	if err := os.Chtimes(filepath.Join(s.Path(), filepath.FromSlash(key)), mt, mt); err != nil {
		s.t.Fatal(err)
	}
}

// exists reports whether key is stored.
func (s *testStore) exists(key string) bool {
	_, err := s.Stat(context.Background(), key)
	return err == nil
}
