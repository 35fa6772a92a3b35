package storage

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Dir is a Storage in a local directory, which may be a volume shared by
// every replica (ReadWriteMany). All access goes through an os.Root, so no
// key, symlink or ".." can reach outside the directory.
type Dir struct {
	root *os.Root
	// latestLocks serialise SetLatest within the process, by record.
	latestLocks [latestStripes]chan struct{}
}

var _ Storage = (*Dir)(nil)

// NewDir opens (creating if needed) a directory storage at dir.
func NewDir(dir string) (*Dir, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("storage dir %s: %w", dir, err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("storage dir %s: %w", dir, err)
	}
	d := &Dir{root: root}
	for i := range d.latestLocks {
		d.latestLocks[i] = make(chan struct{}, 1)
	}
	return d, nil
}

// Close releases the directory.
func (d *Dir) Close() error { return d.root.Close() }

// Ping checks that the directory is still there, the one opened (not a
// volume gone and an empty directory in its place), and readable.
func (d *Dir) Ping(_ context.Context) error {
	opened, err := d.root.Stat(".")
	if err != nil {
		return fmt.Errorf("storage dir %s: %w", d.root.Name(), err)
	}
	now, err := os.Stat(d.root.Name())
	if err != nil {
		return fmt.Errorf("storage dir %s: %w", d.root.Name(), err)
	}
	if !os.SameFile(opened, now) {
		return fmt.Errorf("storage dir %s: replaced since it was opened", d.root.Name())
	}
	return nil
}

// Path is the directory the storage lives in.
func (d *Dir) Path() string { return d.root.Name() }

// Put writes r to a temporary file beside key, syncs it and renames it over
// key, so the write is atomic.
func (d *Dir) Put(ctx context.Context, key string, r io.Reader) (Info, error) {
	key, err := CleanKey(key)
	if err != nil {
		return Info{}, err
	}
	dir, _ := path.Split(key)
	tmp := tempKey(key)
	f, err := d.createIn(dir, tmp)
	if err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = f.Close()
			_ = d.root.Remove(tmp)
		}
	}()
	if _, err := io.Copy(f, contextReader{ctx, r}); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	// Staged content is scratch: a job whose staged content a crash lost
	// is redelivered and stages it again, so it is not worth a flush to
	// the disk. Everything else must be on the disk before it appears.
	if !strings.HasPrefix(key, StagingDir+"/") {
		if err := f.Sync(); err != nil {
			return Info{}, fmt.Errorf("put %s: sync: %w", key, err)
		}
	}
	fi, err := f.Stat()
	if err != nil {
		return Info{}, fmt.Errorf("put %s: stat: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return Info{}, fmt.Errorf("put %s: close: %w", key, err)
	}
	if err := d.root.Rename(tmp, key); err != nil {
		return Info{}, fmt.Errorf("put %s: rename: %w", key, err)
	}
	committed = true
	return info(key, fi), nil
}

// createIn creates the new file name in dir, creating dir first (openIn).
func (d *Dir) createIn(dir, name string) (*os.File, error) {
	return d.openIn(dir, name, os.O_WRONLY|os.O_CREATE|os.O_EXCL)
}

// openIn opens the file name in dir with flag (which creates it),
// creating dir first. Delete prunes directories it leaves empty, so a
// concurrent Delete may remove dir between the two steps, and a concurrent
// MkdirAll of the same directory may make ours fail with "file exists";
// the pair is retried until the file exists (once it does, dir is not
// empty and stays).
func (d *Dir) openIn(dir, name string, flag int) (*os.File, error) {
	var err error
	for range 100 {
		if dir != "" {
			err = d.root.MkdirAll(strings.TrimSuffix(dir, "/"), 0o755)
			if errors.Is(err, fs.ErrExist) {
				continue
			}
			if err != nil {
				return nil, err
			}
		}
		var f *os.File
		f, err = d.root.OpenFile(name, flag, 0o644)
		if err == nil || !errors.Is(err, fs.ErrNotExist) {
			return f, err
		}
	}
	return nil, err
}

// Open opens key, following a latest pointer.
func (d *Dir) Open(_ context.Context, key string) (Object, error) {
	key, err := CleanKey(key)
	if err != nil {
		return nil, err
	}
	f, err := d.root.Open(key)
	if err != nil {
		return nil, notFound(key, err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("open %s: %w", key, err)
	}
	if !fi.Mode().IsRegular() {
		_ = f.Close()
		return nil, fmt.Errorf("open %s: %w", key, ErrNotFound)
	}
	return &dirObject{File: f, info: info(key, fi)}, nil
}

// Stat describes key, following a latest pointer.
func (d *Dir) Stat(_ context.Context, key string) (Info, error) {
	key, err := CleanKey(key)
	if err != nil {
		return Info{}, err
	}
	fi, err := d.root.Stat(key)
	if err != nil {
		return Info{}, notFound(key, err)
	}
	if !fi.Mode().IsRegular() {
		return Info{}, fmt.Errorf("stat %s: %w", key, ErrNotFound)
	}
	return info(key, fi), nil
}

// Delete removes key and then any directories it leaves empty; a latest
// pointer's order record goes with it.
func (d *Dir) Delete(_ context.Context, key string) error {
	key, err := CleanKey(key)
	if err != nil {
		return err
	}
	if err := d.remove(key); err != nil {
		return err
	}
	// A deleted latest pointer forgets its job's time (its order record).
	if path.Base(key) == LatestName {
		return d.remove(orderKey(key))
	}
	return nil
}

// remove removes key and then any directories it leaves empty.
func (d *Dir) remove(key string) error {
	if err := d.root.Remove(key); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	// Prune empty parents; Remove fails harmlessly on a non-empty one. The
	// staging directory stays: every job stages in it.
	for dir := path.Dir(key); dir != "." && dir != "/" && dir != StagingDir; dir = path.Dir(dir) {
		if d.root.Remove(dir) != nil {
			break
		}
	}
	return nil
}

// List describes the regular files directly in dir, sorted by key. Latest
// pointers (symlinks) and temporary files are left out.
func (d *Dir) List(_ context.Context, dir string) ([]Info, error) {
	dir, err := CleanKey(dir)
	if err != nil {
		return nil, err
	}
	f, err := d.root.Open(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var out []Info
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, info(dir+"/"+e.Name(), fi))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// SetLatest points key at target with a relative symlink, replaced
// atomically by renaming a new symlink over the old one, unless the
// pointer's order record says a newer job set it. The record file is
// locked while it is read and rewritten and the symlink renamed, against
// this process's other goroutines and (flock) other processes, on this
// host or, through NFS, on others sharing the volume. The record is
// rewritten before the symlink: a crash between the two leaves the
// pointer where it was, for the job's redelivery (requested at the same
// time) or a newer job to move.
func (d *Dir) SetLatest(ctx context.Context, key, target string, requestedAt time.Time) error {
	key, err := checkPointer(key, target)
	if err != nil {
		return err
	}
	rec, err := d.claimOrder(ctx, "set latest", key, orderRecord{RequestedAt: requestedAt.UTC(), Target: path.Base(target)})
	if err != nil {
		return err
	}
	defer rec.unlock()
	tmp := tempKey(key)
	if err := d.root.Symlink(path.Base(target), tmp); err != nil {
		return fmt.Errorf("set latest %s: %w", key, err)
	}
	if err := d.root.Rename(tmp, key); err != nil {
		_ = d.root.Remove(tmp)
		return fmt.Errorf("set latest %s: %w", key, err)
	}
	return nil
}

// DeleteLatest removes the pointer unless its order record says a newer
// job set it, under the record's lock as SetLatest, and leaves the record
// saying when it was removed.
func (d *Dir) DeleteLatest(ctx context.Context, key string, requestedAt time.Time) error {
	key, err := CleanKey(key)
	if err != nil {
		return err
	}
	rec, err := d.claimOrder(ctx, "delete latest", key, orderRecord{RequestedAt: requestedAt.UTC()})
	if err != nil {
		return err
	}
	defer rec.unlock()
	return d.remove(key)
}

// claimOrder locks the order record of the pointer key and writes next
// into it, unless the record says a newer job than next's set the pointer
// (ErrSuperseded). The caller moves the pointer, then unlocks the record;
// op names the operation in errors.
func (d *Dir) claimOrder(ctx context.Context, op, key string, next orderRecord) (*orderFile, error) {
	rec, err := d.lockOrder(ctx, orderKey(key))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", op, key, err)
	}
	old, err := rec.read()
	switch {
	case err != nil:
		rec.unlock()
		return nil, fmt.Errorf("%s %s: %w", op, key, err)
	case old.supersedes(next.RequestedAt):
		rec.unlock()
		return nil, superseded(key, old, next.RequestedAt)
	}
	if err := rec.write(next); err != nil {
		rec.unlock()
		return nil, fmt.Errorf("%s %s: %w", op, key, err)
	}
	return rec, nil
}

// LatestTarget reads the pointer's symlink.
func (d *Dir) LatestTarget(_ context.Context, key string) (string, error) {
	key, err := CleanKey(key)
	if err != nil {
		return "", err
	}
	fi, err := d.root.Lstat(key)
	if err != nil {
		return "", fmt.Errorf("latest target %w", notFound(key, err))
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		return "", fmt.Errorf("latest target %s: not a pointer: %w", key, ErrNotFound)
	}
	link, err := d.root.Readlink(key)
	if err != nil {
		return "", fmt.Errorf("latest target %w", notFound(key, err))
	}
	return path.Join(path.Dir(key), link), nil
}

// orderFile is a pointer's order record file, opened and locked.
type orderFile struct {
	f       *os.File
	release func()
}

// lockOrder opens (creating it empty) the order record file key and
// locks it: first among this Dir's goroutines (flock on NFS locks for the
// whole process, not per open file), then against other processes. Both
// waits end with ctx.
func (d *Dir) lockOrder(ctx context.Context, key string) (*orderFile, error) {
	stripe := d.latestLocks[stripeOf(key)]
	select {
	case stripe <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("lock %s: %w", key, ctx.Err())
	}
	f, err := d.openIn(path.Dir(key), key, os.O_RDWR|os.O_CREATE)
	if err != nil {
		<-stripe
		return nil, fmt.Errorf("lock %w", notFound(key, err))
	}
	if err := lockFile(ctx, f); err != nil {
		_ = f.Close()
		<-stripe
		return nil, fmt.Errorf("lock %s: %w", key, err)
	}
	return &orderFile{f: f, release: func() {
		// Closing the file drops its lock.
		_ = f.Close()
		<-stripe
	}}, nil
}

// unlock releases the file's locks.
func (o *orderFile) unlock() { o.release() }

// read reads the record; an empty file is the zero record.
func (o *orderFile) read() (orderRecord, error) {
	b, err := io.ReadAll(io.NewSectionReader(o.f, 0, 1<<16))
	if err != nil {
		return orderRecord{}, fmt.Errorf("read order record: %w", err)
	}
	return decodeOrder(b), nil
}

// write replaces the record in place: renaming a new file over it would
// leave the waiters locking the old one.
func (o *orderFile) write(r orderRecord) error {
	b := r.encode()
	if _, err := o.f.WriteAt(b, 0); err != nil {
		return fmt.Errorf("write order record: %w", err)
	}
	if err := o.f.Truncate(int64(len(b))); err != nil {
		return fmt.Errorf("write order record: %w", err)
	}
	return nil
}

// latestStripes is the number of in-process locks the order records of a
// Dir share, by the hash of their key.
const latestStripes = 64

// stripeOf is the in-process lock of an order record.
func stripeOf(key string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % latestStripes)
}

// Copy makes dst a hard link to src's file, made under a temporary name
// beside dst and renamed over it, so the copy is atomic and costs no bytes:
// both keys share one file, its ModTime and so its ETag, until either is
// replaced (every write replaces a file, none changes one in place). Where
// the file system cannot link, the bytes are copied with Put. A latest
// pointer as src is copied as its target's content.
func (d *Dir) Copy(ctx context.Context, src, dst string) (Info, error) {
	return d.copy(ctx, src, dst, "")
}

// CopyMatching is Copy, checking that the file linked (or read) is the one
// src describes: the link is made under its temporary name, described,
// and renamed over dst only when its ETag is src's.
func (d *Dir) CopyMatching(ctx context.Context, src Info, dst string) (Info, error) {
	if src.ETag == "" {
		return Info{}, fmt.Errorf("copy %s: %w: no ETag to match", src.Key, ErrInvalidKey)
	}
	return d.copy(ctx, src.Key, dst, src.ETag)
}

// copy is Copy, or CopyMatching when etag is not empty.
func (d *Dir) copy(ctx context.Context, src, dst, etag string) (Info, error) {
	src, err := CleanKey(src)
	if err != nil {
		return Info{}, err
	}
	if dst, err = CleanKey(dst); err != nil {
		return Info{}, err
	}
	if err := ctx.Err(); err != nil {
		return Info{}, fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	fi, err := d.root.Lstat(src)
	if err != nil {
		return Info{}, fmt.Errorf("copy %w", notFound(src, err))
	}
	switch {
	case src == dst:
		info, err := d.Stat(ctx, dst)
		if err == nil && etag != "" && info.ETag != etag {
			return Info{}, fmt.Errorf("copy %s: %w", src, ErrChanged)
		}
		return info, err
	case fi.Mode()&fs.ModeSymlink != 0:
		// A link to a symlink would resolve beside dst, not beside src.
		return d.copyBytes(ctx, src, dst, etag)
	case !fi.Mode().IsRegular():
		return Info{}, fmt.Errorf("copy %s: %w", src, ErrNotFound)
	}
	dir, _ := path.Split(dst)
	tmp := tempKey(dst)
	if err := d.linkIn(dir, src, tmp); err != nil {
		if errors.Is(err, ErrNotFound) {
			return Info{}, fmt.Errorf("copy %w", err)
		}
		// No hard links here (some network file systems): copy the bytes.
		return d.copyBytes(ctx, src, dst, etag)
	}
	if etag != "" {
		// The link shares the file, its mtime and size, so its ETag is
		// that of the file src named when it was linked.
		ti, err := d.root.Stat(tmp)
		if err != nil || info(src, ti).ETag != etag {
			_ = d.root.Remove(tmp)
			if err != nil {
				return Info{}, fmt.Errorf("copy %s to %s: %w", src, dst, err)
			}
			return Info{}, fmt.Errorf("copy %s to %s: %w", src, dst, ErrChanged)
		}
	}
	if err := d.root.Rename(tmp, dst); err != nil {
		_ = d.root.Remove(tmp)
		return Info{}, fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return d.Stat(ctx, dst)
}

// linkIn links src as name in dir, creating dir first, retried like
// createIn when a concurrent Delete prunes dir. A missing src wraps
// ErrNotFound.
func (d *Dir) linkIn(dir, src, name string) error {
	var err error
	for range 100 {
		if dir != "" {
			err = d.root.MkdirAll(strings.TrimSuffix(dir, "/"), 0o755)
			if errors.Is(err, fs.ErrExist) {
				continue
			}
			if err != nil {
				return err
			}
		}
		err = d.root.Link(src, name)
		if err == nil || !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if _, serr := d.root.Lstat(src); errors.Is(serr, fs.ErrNotExist) {
			return notFound(src, serr)
		}
	}
	return err
}

// copyBytes copies src's content to dst with Put; when etag is not empty,
// only if the file opened has it.
func (d *Dir) copyBytes(ctx context.Context, src, dst, etag string) (Info, error) {
	obj, err := d.Open(ctx, src)
	if err != nil {
		return Info{}, fmt.Errorf("copy %w", err)
	}
	defer obj.Close()
	if etag != "" && obj.Info().ETag != etag {
		return Info{}, fmt.Errorf("copy %s to %s: %w", src, dst, ErrChanged)
	}
	info, err := d.Put(ctx, dst, obj)
	if err != nil {
		return Info{}, fmt.Errorf("copy %s: %w", src, err)
	}
	return info, nil
}

type dirObject struct {
	*os.File
	info Info
}

func (o *dirObject) Info() Info { return o.info }

// info describes a file; the ETag follows nginx's mtime-size form, which
// changes with every atomic replacement.
func info(key string, fi fs.FileInfo) Info {
	return Info{
		Key:     key,
		Size:    fi.Size(),
		ModTime: fi.ModTime(),
		ETag:    fmt.Sprintf(`"%x-%x"`, fi.ModTime().UnixNano(), fi.Size()),
	}
}

func notFound(key string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	return fmt.Errorf("%s: %w", key, err)
}

// tempName is the name of a temporary file beside base, made by
// tempKey: "." + base + ".tmp-" + 16 hex digits.
var tempName = regexp.MustCompile(`^\..+\.tmp-[0-9a-f]{16}$`)

// tempKey is the key of a new temporary file beside key, in the same
// directory (so it is renamed over key atomically, and a concurrent Delete
// does not prune the directory under it). Its name starts with a dot, so
// List never shows it.
func tempKey(key string) string {
	dir, base := path.Split(key)
	return dir + "." + base + ".tmp-" + randomSuffix()
}

// SweepTemporary removes the temporary files of writes (Put, Copy,
// SetLatest) that were last written to before cutoff: those a process
// killed mid-write left behind. It walks the whole storage.
func (d *Dir) SweepTemporary(ctx context.Context, cutoff time.Time) ([]string, error) {
	var removed []string
	var errs []error
	err := fs.WalkDir(d.root.FS(), ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // pruned meanwhile
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if e.IsDir() || !tempName.MatchString(e.Name()) {
			return nil
		}
		fi, err := e.Info()
		if err != nil || !fi.ModTime().Before(cutoff) {
			return nil // renamed into place meanwhile, or still being written
		}
		if err := d.root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
			return nil
		}
		removed = append(removed, p)
		return nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("sweep temporary files: %w", err))
	}
	return removed, errors.Join(errs...)
}

func randomSuffix() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// contextReader stops a copy when its context ends.
type contextReader struct {
	ctx context.Context
	r   io.Reader
}

func (c contextReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
