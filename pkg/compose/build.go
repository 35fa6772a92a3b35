package compose

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/klauspost/compress/gzip"
	"sigs.k8s.io/yaml"

	"github.com/headwater-gitops/headwater/pkg/archive"
)

// Options bound what a build or an unpack may write.
type Options struct {
	// MaxFileSize, when positive, fails a build that would write a
	// larger file (a tarball's entry, a source file).
	MaxFileSize int64
	// Limits bound each unpack: one source's Unpack, and the tarballs one
	// Build extracts (all of them together).
	Limits Limits
	// Copied, when set, counts every file the copy operations of a Build
	// write (copied, extracted or merged) against its limits, and is
	// shared by every Build given it: one ArtifactGenerator job's outputs
	// together. Each file is charged before a byte of it is written, so
	// a build over it stops there.
	Copied *Budget
}

// Limits bound what one unpack writes to disk, so that a small gzip bomb
// cannot fill the packager's disk: the check is made on each entry's
// header, before any of its bytes are written.
type Limits struct {
	// MaxSize, when positive, bounds the bytes of the files written.
	MaxSize int64
	// MaxEntries, when positive, bounds the files and directories
	// written.
	MaxEntries int
	// SizeFlag and EntriesFlag, when set, name the flags that set
	// MaxSize and MaxEntries in the error of an operation over them, so
	// the user reading a condition knows what to raise.
	SizeFlag, EntriesFlag string
}

// Default limits of an unpack: Flux's 100 MiB (fluxcd/pkg/tar's
// DefaultMaxUntarSize), and a number of entries no source tree of that
// size needs.
const (
	DefaultMaxUnpackSize    = 100 << 20
	DefaultMaxUnpackEntries = 100_000
)

// DefaultLimits are the limits of an unpack when none are configured.
var DefaultLimits = Limits{MaxSize: DefaultMaxUnpackSize, MaxEntries: DefaultMaxUnpackEntries}

// ErrLimit is wrapped (with ErrBuild) by the error of an unpack, or of
// a job's copy operations, that hit one of its Limits; the message names
// the limit.
var ErrLimit = errors.New("limit exceeded")

// Budget counts what one unpack, or the copy operations of one job,
// have written against their Limits. It is not safe for concurrent use.
type Budget struct {
	limits Limits
	// what names the writes in errors: "extracted", "copied".
	what    string
	size    int64
	entries int
}

// NewBudget is a budget of limits for the copy operations of one job:
// its errors say "copied size exceeds the limit of ...".
func NewBudget(limits Limits) *Budget {
	return &Budget{limits: limits, what: "copied"}
}

// newUnpackBudget is the budget of one unpack.
func newUnpackBudget(limits Limits) *Budget {
	return &Budget{limits: limits, what: "extracted"}
}

// take accounts for one more entry of size bytes (0 for a directory)
// before it is written, and fails when it would go over a limit.
func (b *Budget) take(size int64) error {
	if b == nil {
		return nil
	}
	if max := b.limits.MaxEntries; max > 0 && b.entries+1 > max {
		return fmt.Errorf("%w: %w: %s entries exceed the limit of %d%s", ErrBuild, ErrLimit, b.what, max, flagNote(b.limits.EntriesFlag))
	}
	if err := b.grow(size); err != nil {
		return err
	}
	b.entries++
	return nil
}

// grow accounts for n more bytes before they are written, and fails
// when they would go over the size limit.
func (b *Budget) grow(n int64) error {
	if b == nil {
		return nil
	}
	if max := b.limits.MaxSize; max > 0 && b.size+n > max {
		return fmt.Errorf("%w: %w: %s size exceeds the limit of %s%s", ErrBuild, ErrLimit, b.what, FormatSize(max), flagNote(b.limits.SizeFlag))
	}
	b.size += n
	return nil
}

// flagNote names the flag of a limit in an error, when it has one.
func flagNote(flag string) string {
	if flag == "" {
		return ""
	}
	return " (" + flag + ")"
}

// FormatSize writes a size in bytes as a limit is usually given: in MiB
// or KiB when it is a whole number of them.
func FormatSize(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// Build writes the output art into dir, an empty directory, from the
// source trees srcs (by alias: a directory each, holding regular files and
// directories only, as Extract leaves them). Its error wraps ErrInvalid
// for an operation that can never succeed, ErrBuild for one that fails on
// the sources' content.
func Build(ctx context.Context, dir string, srcs map[string]string, art swv1beta1.OutputArtifact, o Options) error {
	aliases := map[string]bool{}
	for a := range srcs {
		aliases[a] = true
	}
	extracted := newUnpackBudget(o.Limits)
	for i, c := range art.Copy {
		if err := ctx.Err(); err != nil {
			return err
		}
		op, err := parseOp(c, aliases)
		if err != nil {
			return fmt.Errorf("%w: artifact %q copy[%d]: %w", ErrInvalid, art.Name, i, err)
		}
		b := &builder{ctx: ctx, out: dir, src: srcs[op.alias], op: op, opts: o, extracted: extracted}
		if err := b.run(); err != nil {
			return fmt.Errorf("artifact %q copy[%d] from %q: %w", art.Name, i, c.From, err)
		}
	}
	return nil
}

// builder runs one copy operation.
type builder struct {
	// ctx ends a walk that outlives the job's deadline.
	ctx      context.Context
	out, src string
	op       *op
	opts     Options
	// extracted counts what the build's Extract operations wrote.
	extracted *Budget
}

func buildErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBuild, fmt.Sprintf(format, args...))
}

func (b *builder) run() error {
	o := b.op
	if o.glob {
		return b.glob()
	}
	src := filepath.Join(b.src, filepath.FromSlash(o.from))
	fi, err := os.Stat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return buildErr("%q not found in source %q", o.from, o.alias)
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		if o.fromDir {
			return buildErr("%q is not a directory in source %q", o.from, o.alias)
		}
		dest := o.to
		if o.toDir {
			dest = path.Join(o.to, path.Base(o.from))
		}
		if o.strategy == swv1beta1.ExtractStrategy {
			if !isTarball(o.from) {
				return buildErr("%q is not a tarball (.tar.gz, .tgz)", o.from)
			}
			return b.extract(src, o.to)
		}
		return b.file(src, dest, fi.Mode())
	}
	base := o.to
	if !o.fromDir && o.from != "" && o.toDir {
		base = path.Join(o.to, path.Base(o.from))
	}
	return b.walk(src, func(rel, file string, mode fs.FileMode) error {
		return b.file(file, path.Join(base, rel), mode)
	})
}

// glob copies every file matching the operation's glob.
func (b *builder) glob() error {
	o := b.op
	root := filepath.Join(b.src, filepath.FromSlash(o.prefix))
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return nil // nothing below the prefix: nothing matches
	}
	return b.walk(root, func(rel, file string, mode fs.FileMode) error {
		if !match(o.from, path.Join(o.prefix, rel)) {
			return nil
		}
		if o.strategy == swv1beta1.ExtractStrategy {
			if !isTarball(rel) {
				return nil
			}
			return b.extract(file, o.to)
		}
		return b.file(file, path.Join(o.to, rel), mode)
	})
}

// walk calls fn for every regular file below root that is not excluded,
// in lexical order, with its slash path relative to root.
func (b *builder) walk(root string, fn func(rel, file string, mode fs.FileMode) error) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := b.ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		if b.op.excluded(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return fn(rel, p, fi.Mode())
	})
}

// file copies the file src to dest (a path below the output's root)
// with the operation's strategy.
func (b *builder) file(src, dest string, mode fs.FileMode) error {
	if dest == "" {
		return buildErr("a file cannot replace the artifact's root")
	}
	target := filepath.Join(b.out, filepath.FromSlash(dest))
	if b.op.strategy == swv1beta1.MergeStrategy {
		if fi, err := os.Stat(target); err == nil && fi.Mode().IsRegular() {
			return merge(target, src, dest, b.opts.Copied)
		}
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	return b.write(target, dest, in, mode, fi.Size())
}

// write writes r, size bytes, to target (dest, below the output's root,
// for errors). The job's copy budget is charged before a byte is
// written, and no more than size bytes are.
func (b *builder) write(target, dest string, r io.Reader, mode fs.FileMode, size int64) error {
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return buildErr("cannot create the directory of %q: a file is in the way", dest)
	}
	fi, err := os.Lstat(target)
	if err == nil && fi.IsDir() {
		return buildErr("cannot write the file %q: a directory is in the way", dest)
	}
	if err != nil {
		// A new file: one more entry of the job's.
		err = b.opts.Copied.take(size)
	} else {
		err = b.opts.Copied.grow(size)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", dest, err)
	}
	perm := fs.FileMode(0o644)
	if mode.Perm()&0o111 != 0 {
		perm = 0o755
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	limit := size
	if max := b.opts.MaxFileSize; max > 0 && max+1 < limit {
		limit = max + 1
	}
	// Copied from file to file, the kernel copies (copy_file_range).
	n, err := io.Copy(f, io.LimitReader(r, limit))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", dest, err)
	}
	if max := b.opts.MaxFileSize; max > 0 && n > max {
		return buildErr("%q is over the file size limit of %d bytes", dest, max)
	}
	return os.Chmod(target, perm)
}

// isTarball tells whether name is a gzip-compressed tarball by its name.
func isTarball(name string) bool {
	return strings.HasSuffix(name, ".tar.gz") || strings.HasSuffix(name, ".tgz")
}

// extract unpacks the tarball src into the directory dest: regular files
// and directories only, every name checked by archive.SafeName.
func (b *builder) extract(src, dest string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return buildErr("%s is not a gzip-compressed tarball: %v", path.Base(src), err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return buildErr("read tarball %s: %v", path.Base(src), err)
		}
		if h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeDir {
			continue
		}
		name, err := archive.SafeName(h.Name)
		if err != nil {
			return buildErr("tarball %s: %v", path.Base(src), err)
		}
		rel := path.Join(dest, name)
		target := filepath.Join(b.out, filepath.FromSlash(rel))
		size := h.Size
		if h.Typeflag == tar.TypeDir {
			size = 0
		}
		if err := b.extracted.take(size); err != nil {
			return fmt.Errorf("tarball %s: %w", path.Base(src), err)
		}
		if h.Typeflag == tar.TypeDir {
			if err := b.opts.Copied.take(0); err != nil {
				return fmt.Errorf("tarball %s: %w", path.Base(src), err)
			}
			if err := os.MkdirAll(target, 0o755); err != nil {
				return buildErr("cannot create the directory %q: a file is in the way", rel)
			}
			continue
		}
		if err := b.write(target, rel, tr, fs.FileMode(h.Mode), h.Size); err != nil {
			return err
		}
	}
}

// merge merges the YAML file src into the YAML file target (dest below
// the output's root), as Helm merges values files; copied (nil: none)
// is charged for the merged file before it is written.
func merge(target, src, dest string, copied *Budget) error {
	if !isYAML(dest) || !isYAML(src) {
		return buildErr("strategy Merge takes YAML files (.yaml, .yml), not %q", dest)
	}
	base, err := readValues(target)
	if err != nil {
		return buildErr("merge into %q: %v", dest, err)
	}
	over, err := readValues(src)
	if err != nil {
		return buildErr("merge %s into %q: %v", path.Base(src), dest, err)
	}
	out, err := yaml.Marshal(MergeValues(base, over))
	if err != nil {
		return fmt.Errorf("merge into %q: %w", dest, err)
	}
	if err := copied.grow(int64(len(out))); err != nil {
		return fmt.Errorf("merge into %q: %w", dest, err)
	}
	return os.WriteFile(target, out, 0o644)
}

func isYAML(name string) bool {
	return strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")
}

// readValues reads a YAML file holding a map (an empty file is an empty
// map).
func readValues(name string) (map[string]any, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := yaml.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("not a YAML map: %w", err)
	}
	return m, nil
}

// MergeValues merges b into a as Helm merges values files: a map merges
// into a map key by key, any other value of b replaces a's. Neither is
// changed; the result shares their unchanged values.
func MergeValues(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if bm, ok := v.(map[string]any); ok {
			if am, ok := out[k].(map[string]any); ok {
				out[k] = MergeValues(am, bm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// TreeDigest is the content hash of the tree at dir: the hex SHA-256 of
// its canonical tar (archive.WriteTar: entries in canonical order,
// normalised headers), so the same files with the same content and
// executable bits hash the same wherever and whenever they are built.
func TreeDigest(ctx context.Context, dir string) (string, error) {
	h := sha256.New()
	if _, err := archive.WriteTar(ctx, h, dir, archive.TarOptions{}); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Needed returns, by source alias, the paths of the source's tree the copy
// operations of artifacts read: a literal path, or a glob's literal
// prefix ("" for the whole tree). Operations that do not parse are left
// out (Build refuses them). Unpack's keep is Needed's Keep. With a
// pattern (nil: none), artifacts are its templates, read as if every
// capture were "*".
func Needed(artifacts []swv1beta1.OutputArtifact, pattern *Pattern) map[string]Paths {
	out := map[string]Paths{}
	for _, a := range artifacts {
		if pattern != nil {
			var err error
			if a, err = pattern.renderArtifact(a, pattern.sample("*"), pattern.sample("*")); err != nil {
				continue
			}
		}
		for _, c := range a.Copy {
			o, err := parseOp(c, nil)
			if err != nil {
				continue
			}
			p := o.from
			if o.glob {
				p = o.prefix
			}
			out[o.alias] = append(out[o.alias], p)
		}
	}
	return out
}

// Paths are slash paths below a tree's root; "" is the whole tree.
type Paths []string

// Keep tells whether the entry name of a source's tree is needed: it is
// one of the paths or below one, or (a directory) above one.
func (ps Paths) Keep(name string, isDir bool) bool {
	for _, p := range ps {
		if p == "" || name == p || strings.HasPrefix(name, p+"/") || (isDir && strings.HasPrefix(p, name+"/")) {
			return true
		}
	}
	return false
}

// Unpack is UnpackWith without a context, with files over maxFileSize
// (when positive) refused and DefaultLimits.
func Unpack(r io.Reader, dir string, maxFileSize int64, keep func(name string, isDir bool) bool) error {
	return UnpackWith(context.Background(), r, dir, Options{MaxFileSize: maxFileSize, Limits: DefaultLimits}, keep)
}

// UnpackWith extracts the gzip-compressed tarball r (a source's artifact)
// into dir: regular files and directories only, every name checked by
// archive.SafeName, files over o.MaxFileSize (when positive) refused, and
// no more than o.Limits written (checked on each entry's header, before
// its bytes are written). When keep is set, only the entries it keeps are
// written and count (the rest is read past). Its error wraps ErrBuild when
// the content is not a valid artifact, and ErrLimit too when it is over a
// limit; what it wrote is the caller's to remove.
func UnpackWith(ctx context.Context, r io.Reader, dir string, o Options, keep func(name string, isDir bool) bool) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return buildErr("not a gzip-compressed tarball: %v", err)
	}
	written := newUnpackBudget(o.Limits)
	tr := tar.NewReader(zr)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return buildErr("read tarball: %v", err)
		}
		if h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeDir {
			continue
		}
		name, err := archive.SafeName(h.Name)
		if err != nil {
			return buildErr("%v", err)
		}
		if keep != nil && !keep(name, h.Typeflag == tar.TypeDir) {
			continue
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		if h.Typeflag == tar.TypeDir {
			if err := written.take(0); err != nil {
				return err
			}
			if err := os.MkdirAll(target, 0o755); err != nil {
				return buildErr("directory %q: %v", name, err)
			}
			continue
		}
		if o.MaxFileSize > 0 && h.Size > o.MaxFileSize {
			return buildErr("%q is %d bytes, over the limit of %d", name, h.Size, o.MaxFileSize)
		}
		if err := written.take(h.Size); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return buildErr("directory of %q: %v", name, err)
		}
		perm := fs.FileMode(0o644)
		if h.Mode&0o111 != 0 {
			perm = 0o755
		}
		f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
		if err != nil {
			return err
		}
		// The tar reader yields exactly h.Size bytes: the budget above
		// bounds what is written.
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("unpack %s: %w", name, err)
		}
	}
}
