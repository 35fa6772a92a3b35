package fetchjob

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// refusing is a storage that takes nothing (full).
type refusing struct{ storage.Storage }

func (refusing) Put(_ context.Context, _ string, r io.Reader) (storage.Info, error) {
	return storage.Info{}, errors.New("no space left on device")
}

func newStore(t *testing.T) *storage.Dir {
	t.Helper()
	s, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// staged returns the names of the entries of the tar staged at key.
func staged(t *testing.T, s storage.Storage, key string) []string {
	t.Helper()
	obj, err := s.Open(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer obj.Close()
	var names []string
	tr := tar.NewReader(obj)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
}

// TestStageTree stages a tree as a tar, without what Exclude leaves out;
// a file over the limit fails the job for good, a storage that refuses the
// content for now, each as Flux's StorageOperationFailed.
func TestStageTree(t *testing.T) {
	ctx := context.Background()
	tree := fstest.MapFS{
		"deploy/app.yaml": {Data: []byte("kind: x\n")},
		"deploy/big.bin":  {Data: []byte("0123456789a")},
		".git/HEAD":       {Data: []byte("ref: main\n")},
	}
	exclude := func(rel string, _ bool) bool { return rel == ".git" }
	store := newStore(t)
	size, err := StageTree(ctx, store, ".staging/a.tar", tree, archive.TarOptions{Exclude: exclude})
	if err != nil || size == 0 {
		t.Fatalf("StageTree = %d, %v", size, err)
	}
	if got := staged(t, store, ".staging/a.tar"); !slices.Contains(got, "deploy/app.yaml") || !slices.Contains(got, "deploy/big.bin") ||
		slices.ContainsFunc(got, func(n string) bool { return strings.HasPrefix(n, ".git") }) {
		t.Errorf("staged %v, want deploy/ without .git", got)
	}

	cases := []struct {
		name     string
		store    storage.Storage
		max      int64
		handling failure.Handling
		message  string
	}{
		{name: "too large", store: store, max: 10, handling: failure.Final,
			message: "unable to archive artifact to storage: file too large: deploy/big.bin is 11 bytes, over the limit of 10"},
		{name: "storage refuses", store: refusing{store}, handling: failure.Transient,
			message: "unable to archive artifact to storage: no space left on device"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := StageTree(ctx, tc.store, ".staging/b.tar", tree, archive.TarOptions{MaxFileSize: tc.max})
			f := failure.As(err)
			if f == nil || f.Handling != tc.handling || f.Condition != sourcev1.StorageOperationFailedCondition ||
				f.Reason != sourcev1.ArchiveOperationFailedReason || f.Data().Message != tc.message {
				t.Errorf("StageTree: %v (%+v), want %v %q", err, f, tc.handling, tc.message)
			}
		})
	}
}

// TestStageFile stages a file byte for byte; a file that cannot be read,
// or a storage that refuses it, is StorageOperationFailed.
func TestStageFile(t *testing.T) {
	ctx := context.Background()
	store := newStore(t)
	file := filepath.Join(t.TempDir(), "chart.tgz")
	if err := os.WriteFile(file, []byte("chart bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	size, err := StageFile(ctx, store, ".staging/c.tar", file)
	if err != nil || size != int64(len("chart bytes")) {
		t.Fatalf("StageFile = %d, %v", size, err)
	}
	obj, err := store.Open(ctx, ".staging/c.tar")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(obj)
	obj.Close()
	if err != nil || string(got) != "chart bytes" {
		t.Errorf("staged %q, %v", got, err)
	}
	for name, tc := range map[string]struct {
		store   storage.Storage
		file    string
		message string
	}{
		"missing file":    {store, filepath.Join(t.TempDir(), "gone"), "unable to stage artifact: "},
		"storage refuses": {refusing{store}, file, "unable to copy artifact to storage: no space left on device"},
	} {
		_, err := StageFile(ctx, tc.store, ".staging/d.tar", tc.file)
		if f := failure.As(err); f == nil || f.Condition != sourcev1.StorageOperationFailedCondition ||
			!strings.HasPrefix(f.Data().Message, tc.message) {
			t.Errorf("%s: %v, want StorageOperationFailed %q", name, err, tc.message)
		}
	}
}

// TestWorkDir makes an empty directory that its remove function removes;
// a parent that cannot hold one is DirCreationFailed.
func TestWorkDir(t *testing.T) {
	parent := t.TempDir()
	dir, remove, err := WorkDir(context.Background(), parent)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(dir) != parent {
		t.Errorf("work dir %s is not in %s", dir, parent)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	remove()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("work dir left after remove: %v", err)
	}
	_, _, err = WorkDir(context.Background(), filepath.Join(parent, "no", "such"))
	if f := failure.As(err); f == nil || f.Reason != sourcev1.DirCreationFailedReason || f.Handling != failure.Transient {
		t.Errorf("WorkDir in a missing parent: %v, want DirCreationFailed", err)
	}
}
