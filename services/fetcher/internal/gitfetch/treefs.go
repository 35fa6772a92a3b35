package gitfetch

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// treeFS is a commit's tree as a read-only file system, read straight from
// the fetched packfile: the fetcher archives it (archive.WriteTarFS) and
// reads its ignore rules (ignore.LoadFS) without checking it out, so a
// fetch writes no work tree and walks no disk. It is built by plainTree
// only for trees that need nothing a checkout does (no symbolic links, no
// submodules, only names that are safe as they are); the others are
// checked out. Blobs over go-git's large object threshold stream from the
// packfile. A treeFS is not safe for concurrent use.
type treeFS struct {
	// s holds the objects.
	s storer.EncodedObjectStorer
	// dirs holds every directory of the tree by its slash-separated path,
	// "." for the root, with its entries sorted by name.
	dirs map[string]*treeDir
}

// treeDir is one directory of a treeFS.
type treeDir struct {
	entries []fs.DirEntry
}

// plainTree returns the tree of commit as a treeFS, or ok false when it
// holds a symbolic link, a submodule or a name that the checkout's checks
// (go-git's) must judge, such as a .git lookalike or a non-ASCII name. It
// reads every tree object of the commit from s, and no blob.
func plainTree(s storer.EncodedObjectStorer, commit *object.Commit) (_ *treeFS, ok bool, err error) {
	root, err := object.GetTree(s, commit.TreeHash)
	if err != nil {
		return nil, false, fmt.Errorf("read tree of commit %s: %w", commit.Hash, err)
	}
	t := &treeFS{s: s, dirs: map[string]*treeDir{}}
	ok, err = t.add(".", root)
	if err != nil || !ok {
		return nil, ok, err
	}
	return t, true, nil
}

// add records tree at dir and, recursively, its subtrees; false when the
// tree is not plain.
func (t *treeFS) add(dir string, tree *object.Tree) (bool, error) {
	d := &treeDir{entries: make([]fs.DirEntry, 0, len(tree.Entries))}
	for i := range tree.Entries {
		e := &tree.Entries[i]
		if !plainName(e.Name) {
			return false, nil
		}
		entry := &treeEntry{s: t.s, entry: e}
		switch e.Mode {
		case filemode.Dir:
			sub, err := object.GetTree(t.s, e.Hash)
			if err != nil {
				return false, fmt.Errorf("read tree %s: %w", path.Join(dir, e.Name), err)
			}
			if ok, err := t.add(path.Join(dir, e.Name), sub); err != nil || !ok {
				return ok, err
			}
		case filemode.Regular, filemode.Executable, filemode.Deprecated:
		default: // a symbolic link, a submodule
			return false, nil
		}
		d.entries = append(d.entries, entry)
	}
	// Git orders a directory's entries as if its name ended in '/'; a
	// file system lists them by name.
	slices.SortFunc(d.entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	t.dirs[dir] = d
	return true, nil
}

// plainName reports whether a tree entry's name can be used as it is: one
// path element of printable ASCII without characters some file system
// reserves, not ".", "..", a name ending in a dot, or a .git lookalike.
func plainName(name string) bool {
	if name == "" || name == "." || name == ".." || name[len(name)-1] == '.' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`/\:*?"<>|`, c) >= 0 {
			return false
		}
	}
	lower := strings.ToLower(name)
	return lower != ".git" && lower != "git~1"
}

// Open opens the file or directory name.
func (t *treeFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if d, ok := t.dirs[name]; ok {
		return &treeDirFile{name: name, dir: d}, nil
	}
	parent, ok := t.dirs[path.Dir(name)]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	base := path.Base(name)
	i, found := slices.BinarySearchFunc(parent.entries, base, func(e fs.DirEntry, n string) int { return strings.Compare(e.Name(), n) })
	if !found {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	e := parent.entries[i].(*treeEntry)
	info, err := e.Info()
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return &treeFile{info: info, blob: e.blob}, nil
}

// ReadDir lists the directory name, sorted by name.
func (t *treeFS) ReadDir(name string) ([]fs.DirEntry, error) {
	d, ok := t.dirs[name]
	if !ok {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	return slices.Clone(d.entries), nil
}

// treeEntry is a tree entry as an fs.DirEntry; its blob is read on the
// first Info.
type treeEntry struct {
	s     storer.EncodedObjectStorer
	entry *object.TreeEntry
	blob  *object.Blob
}

func (e *treeEntry) Name() string      { return e.entry.Name }
func (e *treeEntry) IsDir() bool       { return e.entry.Mode == filemode.Dir }
func (e *treeEntry) Type() fs.FileMode { return e.mode().Type() }

// mode is the entry's mode as a checkout writes it.
func (e *treeEntry) mode() fs.FileMode {
	switch e.entry.Mode {
	case filemode.Dir:
		return fs.ModeDir | 0o755
	case filemode.Executable:
		return 0o755
	}
	return 0o644
}

// Info describes the entry; for a file it reads the blob's header.
func (e *treeEntry) Info() (fs.FileInfo, error) {
	var size int64
	if !e.IsDir() {
		if e.blob == nil {
			b, err := object.GetBlob(e.s, e.entry.Hash)
			if err != nil {
				return nil, fmt.Errorf("read blob %s of %s: %w", e.entry.Hash, e.entry.Name, err)
			}
			e.blob = b
		}
		size = e.blob.Size
	}
	return entryInfo{name: e.entry.Name, mode: e.mode(), size: size}, nil
}

// entryInfo is the fs.FileInfo of a tree entry.
type entryInfo struct {
	name string
	mode fs.FileMode
	size int64
}

func (i entryInfo) Name() string       { return i.name }
func (i entryInfo) Size() int64        { return i.size }
func (i entryInfo) Mode() fs.FileMode  { return i.mode }
func (i entryInfo) ModTime() time.Time { return time.Time{} }
func (i entryInfo) IsDir() bool        { return i.mode.IsDir() }
func (i entryInfo) Sys() any           { return nil }

// treeFile is an open blob.
type treeFile struct {
	info fs.FileInfo
	blob *object.Blob
	r    io.ReadCloser
}

func (f *treeFile) Stat() (fs.FileInfo, error) { return f.info, nil }

// Read reads the blob, opening its reader on the first call.
func (f *treeFile) Read(p []byte) (int, error) {
	if f.r == nil {
		r, err := f.blob.Reader()
		if err != nil {
			return 0, err
		}
		f.r = r
	}
	return f.r.Read(p)
}

func (f *treeFile) Close() error {
	if f.r == nil {
		return nil
	}
	return f.r.Close()
}

// treeDirFile is an open directory.
type treeDirFile struct {
	name string
	dir  *treeDir
	read int
}

func (f *treeDirFile) Stat() (fs.FileInfo, error) {
	return entryInfo{name: path.Base(f.name), mode: fs.ModeDir | 0o755}, nil
}

func (f *treeDirFile) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: f.name, Err: errors.New("is a directory")}
}

func (f *treeDirFile) Close() error { return nil }

// ReadDir returns the next n entries (all when n <= 0), as fs.ReadDirFile.
func (f *treeDirFile) ReadDir(n int) ([]fs.DirEntry, error) {
	rest := f.dir.entries[f.read:]
	if n <= 0 {
		f.read = len(f.dir.entries)
		return slices.Clone(rest), nil
	}
	if len(rest) == 0 {
		return nil, io.EOF
	}
	n = min(n, len(rest))
	f.read += n
	return slices.Clone(rest[:n]), nil
}

// ErrUnsafeTreePath is the error of a tree entry whose name no checkout may
// write: ".", "..", a name holding a path separator or a NUL, or ".git" in
// any case. Git itself never writes such a tree; a hostile client can.
var ErrUnsafeTreePath = errors.New("invalid path in the tree")

// checkTreeNames walks the tree of commit (tree objects only, no blob) and
// returns ErrUnsafeTreePath, naming the entry, for the first entry whose
// name could climb out of the work tree or write into its .git.
func checkTreeNames(s storer.EncodedObjectStorer, commit *object.Commit) error {
	root, err := object.GetTree(s, commit.TreeHash)
	if err != nil {
		return fmt.Errorf("read tree of commit %s: %w", commit.Hash, err)
	}
	return checkTree(s, "", root)
}

func checkTree(s storer.EncodedObjectStorer, dir string, tree *object.Tree) error {
	for i := range tree.Entries {
		e := &tree.Entries[i]
		p := e.Name
		if dir != "" {
			p = dir + "/" + e.Name
		}
		if e.Name == "" || e.Name == "." || e.Name == ".." || strings.ContainsAny(e.Name, "/\\\x00") || strings.EqualFold(e.Name, ".git") {
			return fmt.Errorf("%w: '%s'", ErrUnsafeTreePath, p)
		}
		if e.Mode != filemode.Dir {
			continue
		}
		sub, err := object.GetTree(s, e.Hash)
		if err != nil {
			return fmt.Errorf("read tree %s: %w", p, err)
		}
		if err := checkTree(s, p, sub); err != nil {
			return err
		}
	}
	return nil
}
