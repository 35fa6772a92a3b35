// Package archive writes the two archive forms Headwater uses, streaming
// both ways so that no file is ever held in memory:
//
//   - the staging tar (WriteTar): an uncompressed tar of a source tree in
//     canonical order, written by the fetcher into the staging area;
//   - the artifact (Canonicalize): a gzip-compressed tar with normalised
//     headers and its digest, written by the packager from a staging tar.
//
// Canonical order is filepath.WalkDir's: depth first, names sorted byte-wise
// within each directory. Headers are normalised (uid/gid 0, no owner names,
// modification time at the Unix epoch, mode 0644 or 0755) so the same tree
// always gives the same bytes and the same digest.
package archive

import (
	"archive/tar"
	"context"
	// go-digest only knows the hash functions linked into the binary.
	_ "crypto/sha256"
	_ "crypto/sha512"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/opencontainers/go-digest"
)

// ErrUnsafePath is wrapped by errors about entries that would escape the
// archive root (absolute paths, "..").
var ErrUnsafePath = errors.New("unsafe path in archive")

// ErrTooLarge is wrapped by errors about files over the size limit.
var ErrTooLarge = errors.New("file too large")

// epoch is the modification time of every entry.
var epoch = time.Unix(0, 0).UTC()

// TarOptions control WriteTar.
type TarOptions struct {
	// Exclude, when set, is asked about every path (slash-separated,
	// relative to the root); true leaves it out, with everything below it
	// for a directory.
	Exclude func(rel string, isDir bool) bool
	// MaxFileSize, when positive, fails the walk on a larger file.
	MaxFileSize int64
}

// Stats describe what was archived.
type Stats struct {
	// Files is the number of regular files.
	Files int
	// Bytes is the total size of their content.
	Bytes int64
}

// WriteTar writes the tree at root to w as an uncompressed tar in canonical
// order. Only regular files and directories are archived: symbolic links,
// devices and the like are skipped, so nothing can point outside the tree.
func WriteTar(ctx context.Context, w io.Writer, root string, o TarOptions) (Stats, error) {
	st, err := WriteTarFS(ctx, w, os.DirFS(root), o)
	if err != nil {
		return st, fmt.Errorf("archive %s: %w", root, err)
	}
	return st, nil
}

// WriteTarFS is WriteTar for the tree of fsys: a directory (os.DirFS), or
// content that is on no disk at all (a git commit's tree read from its
// packfile), archived the same way into the same bytes. Its order is
// fs.WalkDir's: depth first, names byte-sorted in each directory.
func WriteTarFS(ctx context.Context, w io.Writer, fsys fs.FS, o TarOptions) (Stats, error) {
	var st Stats
	tw := tar.NewWriter(w)
	err := fs.WalkDir(fsys, ".", func(rel string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		isDir := d.IsDir()
		if o.Exclude != nil && o.Exclude(rel, isDir) {
			if isDir {
				return fs.SkipDir
			}
			return nil
		}
		switch {
		case isDir:
			return tw.WriteHeader(header(rel+"/", tar.TypeDir, 0o755, 0))
		case d.Type().IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if o.MaxFileSize > 0 && fi.Size() > o.MaxFileSize {
				return fmt.Errorf("%w: %s is %d bytes, over the limit of %d", ErrTooLarge, rel, fi.Size(), o.MaxFileSize)
			}
			if err := tw.WriteHeader(header(rel, tar.TypeReg, fileMode(fi.Mode()), fi.Size())); err != nil {
				return err
			}
			if err := copyFile(tw, fsys, rel); err != nil {
				return err
			}
			st.Files++
			st.Bytes += fi.Size()
		}
		return nil
	})
	if err != nil {
		return st, err
	}
	if err := tw.Close(); err != nil {
		return st, err
	}
	return st, nil
}

// copyFile copies the file name of fsys (one that changed size under the
// walk fails the tar writer).
func copyFile(w io.Writer, fsys fs.FS, name string) error {
	f, err := fsys.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// CanonicalOptions control Canonicalize.
type CanonicalOptions struct {
	// Algorithm of the digest; sha256 when empty. sha384 and sha512 are
	// also available.
	Algorithm digest.Algorithm
	// MaxFileSize, when positive, rejects a larger file.
	MaxFileSize int64
	// Level is the gzip compression level; DefaultLevel when 0.
	Level int
}

// DefaultLevel is the gzip level artifacts are compressed with: the
// fastest. On a typical mix of manifests and binary files it compresses
// about twice as fast as gzip's default level (6) to within 1% of its size
// (BenchmarkCanonicalize), and compressing is most of the cost of
// packaging, which every new revision pays.
const DefaultLevel = gzip.BestSpeed

// Result describes a written artifact.
type Result struct {
	// Digest of the compressed bytes, "<algorithm>:<hex>".
	Digest digest.Digest
	// Size of the compressed bytes.
	Size int64
	// Files is the number of regular files in the archive.
	Files int
}

// Canonicalize reads a tar stream from src and writes to dst the canonical
// gzip-compressed tar of its regular files and directories, in the order
// they come, with normalised headers. It rejects absolute paths, ".."
// segments and repeated names, and skips every other entry type (links,
// devices), so the artifact can be unpacked safely anywhere.
func Canonicalize(dst io.Writer, src io.Reader, o CanonicalOptions) (Result, error) {
	alg := o.Algorithm
	if alg == "" {
		alg = digest.SHA256
	}
	if !alg.Available() {
		return Result{}, fmt.Errorf("digest algorithm %q is not available", alg)
	}
	level := o.Level
	if level == 0 {
		level = DefaultLevel
	}
	digester := alg.Digester()
	counter := &countingWriter{}
	zw, err := gzip.NewWriterLevel(io.MultiWriter(dst, digester.Hash(), counter), level)
	if err != nil {
		return Result{}, err
	}
	tw := tar.NewWriter(zw)
	tr := tar.NewReader(src)
	seen := map[string]struct{}{}
	var res Result
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Result{}, fmt.Errorf("read staged content: %w", err)
		}
		var typ byte
		switch h.Typeflag {
		case tar.TypeDir:
			typ = tar.TypeDir
		case tar.TypeReg:
			typ = tar.TypeReg
		default:
			continue
		}
		name, err := SafeName(h.Name)
		if err != nil {
			return Result{}, err
		}
		if _, dup := seen[name]; dup {
			return Result{}, fmt.Errorf("%w: %q appears twice", ErrUnsafePath, name)
		}
		seen[name] = struct{}{}
		if typ == tar.TypeDir {
			if err := tw.WriteHeader(header(name+"/", tar.TypeDir, 0o755, 0)); err != nil {
				return Result{}, err
			}
			continue
		}
		if o.MaxFileSize > 0 && h.Size > o.MaxFileSize {
			return Result{}, fmt.Errorf("%w: %s is %d bytes, over the limit of %d", ErrTooLarge, name, h.Size, o.MaxFileSize)
		}
		if err := tw.WriteHeader(header(name, tar.TypeReg, fileMode(fs.FileMode(h.Mode)), h.Size)); err != nil {
			return Result{}, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return Result{}, fmt.Errorf("copy %s: %w", name, err)
		}
		res.Files++
	}
	if err := tw.Close(); err != nil {
		return Result{}, err
	}
	if err := zw.Close(); err != nil {
		return Result{}, err
	}
	res.Digest = digester.Digest()
	res.Size = counter.n
	return res, nil
}

// SafeName returns the cleaned relative name of a tar entry, or an error
// wrapping ErrUnsafePath for a name that is absolute, climbs out of the
// root (any ".." segment), holds a backslash or a NUL, or names the root.
func SafeName(name string) (string, error) {
	n := strings.TrimSuffix(name, "/")
	if n == "" || strings.HasPrefix(n, "/") || strings.Contains(n, "\\") || strings.ContainsRune(n, 0) {
		return "", fmt.Errorf("%w: %q", ErrUnsafePath, name)
	}
	for _, seg := range strings.Split(n, "/") {
		if seg == ".." {
			return "", fmt.Errorf("%w: %q", ErrUnsafePath, name)
		}
	}
	c := path.Clean(n)
	if c == "." {
		return "", fmt.Errorf("%w: %q", ErrUnsafePath, name)
	}
	return c, nil
}

func header(name string, typ byte, mode int64, size int64) *tar.Header {
	return &tar.Header{
		Typeflag: typ,
		Name:     name,
		Mode:     mode,
		Size:     size,
		ModTime:  epoch,
		Format:   tar.FormatPAX,
	}
}

// fileMode keeps only whether a file is executable, as git does.
func fileMode(m fs.FileMode) int64 {
	if m.Perm()&0o111 != 0 {
		return 0o755
	}
	return 0o644
}

type countingWriter struct{ n int64 }

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}
