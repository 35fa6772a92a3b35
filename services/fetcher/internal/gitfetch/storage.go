package gitfetch

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/storage"
	"github.com/go-git/go-git/v5/storage/filesystem"
	"github.com/go-git/go-git/v5/storage/filesystem/dotgit"
	"github.com/go-git/go-git/v5/storage/memory"
)

// packStorage keeps a fetch's objects on disk, as the packfile the remote
// sent and its index, and everything else go-git records (configuration,
// references, the shallow list, the index of a checkout) in memory. A
// fetch is one packfile: on disk it costs the pack's two files in one
// directory, where a whole repository layout costs a dozen directories and
// files, which go-git writes one system call at a time; and the objects
// stay out of memory however large the repository is.
type packStorage struct {
	*filesystem.ObjectStorage
	memory.ConfigStorage
	memory.ReferenceStorage
	memory.ShallowStorage
	memory.IndexStorage
	memory.ModuleStorage
}

// the storage is a whole repository's to go-git.
var _ storage.Storer = (*packStorage)(nil)

// AddAlternate refuses: a fetch's objects come from its remote only.
func (*packStorage) AddAlternate(remote string) error {
	return fmt.Errorf("object storage: alternates are not supported (%s)", remote)
}

// newPackStorage returns a packStorage whose objects live under dir, which
// it creates. Close releases the packfiles it keeps open.
func newPackStorage(dir string) (*packStorage, error) {
	if err := os.MkdirAll(filepath.Join(dir, "objects", "pack"), 0o755); err != nil {
		return nil, fmt.Errorf("object storage: %w", err)
	}
	// Nothing else writes the directory while the fetch runs, so the
	// storage may cache what it listed and keep its packfiles open.
	opts := filesystem.Options{LargeObjectThreshold: largeObjectThreshold, ExclusiveAccess: true, KeepDescriptors: true}
	objects := filesystem.NewObjectStorageWithOptions(dotgit.NewWithOptions(osfs.New(dir), dotgit.Options{ExclusiveAccess: true}),
		cache.NewObjectLRU(objectCacheSize), opts)
	return &packStorage{
		ObjectStorage:    objects,
		ReferenceStorage: make(memory.ReferenceStorage),
		ModuleStorage:    make(memory.ModuleStorage),
	}, nil
}
