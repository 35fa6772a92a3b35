package gitfetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Bounds of what resolving links may copy: a repository whose links copy
// more is refused, so a link farm whose size doubles with every level
// cannot fill the disk (Flux has no bound).
const (
	// MaxLinkCopyBytes bounds the bytes copied to replace links.
	MaxLinkCopyBytes = 256 << 20
	// MaxLinkCopyFiles bounds the files and directories copied.
	MaxLinkCopyFiles = 100_000
)

// ErrLinksTooLarge is wrapped by the error of resolveSymlinks when the
// links of a tree would copy more than the bounds allow.
var ErrLinksTooLarge = errors.New("symbolic links copy too much")

// linkBudget is what resolving links may still copy.
type linkBudget struct {
	ctx          context.Context
	bytes, files int64
}

// take charges one file or directory of size bytes to the budget.
func (b *linkBudget) take(size int64) error {
	if err := b.ctx.Err(); err != nil {
		return err
	}
	b.files--
	b.bytes -= size
	if b.files < 0 || b.bytes < 0 {
		return fmt.Errorf("%w: over the bound of files or bytes copied for symbolic links", ErrLinksTooLarge)
	}
	return nil
}

// resolveSymlinks replaces every symbolic link in the tree at root whose
// target lies inside root by a copy of the target, as Flux does before
// archiving (archives hold no links). Links that point outside root, dangle
// or would copy a directory into itself are removed, so that nothing read
// from the tree afterwards (.sourceignore files, the archive) can lead
// outside it. The copies are bounded (MaxLinkCopyBytes, MaxLinkCopyFiles)
// and stop when ctx ends.
func resolveSymlinks(ctx context.Context, root string) error {
	return resolveSymlinksWithin(ctx, root, MaxLinkCopyBytes, MaxLinkCopyFiles)
}

// resolveSymlinksWithin is resolveSymlinks with the given bounds.
func resolveSymlinksWithin(ctx context.Context, root string, maxBytes, maxFiles int64) error {
	budget := &linkBudget{ctx: ctx, bytes: maxBytes, files: maxFiles}
	root, err := filepath.EvalSymlinks(root)
	if err != nil {
		return err
	}
	var links []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			links = append(links, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Deepest first, so a link inside a linked directory is resolved
	// before the directory is copied.
	for i := len(links) - 1; i >= 0; i-- {
		link := links[i]
		target, err := filepath.EvalSymlinks(link)
		var fi fs.FileInfo
		if err == nil && within(root, target) && !within(target, link) {
			fi, err = os.Stat(target)
		}
		if err := os.Remove(link); err != nil {
			return fmt.Errorf("failed to remove symlink %s: %w", link, err)
		}
		if fi == nil {
			continue
		}
		if fi.IsDir() {
			err = copyDir(target, link, budget)
		} else if err = budget.take(fi.Size()); err == nil {
			err = copyFile(target, link, fi.Mode())
		}
		if err != nil {
			return fmt.Errorf("failed to copy %s: %w", target, err)
		}
	}
	return nil
}

// within reports whether p is dir or lies below it.
func within(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// copyDir copies the regular files and directories below src to dst,
// charging them to budget; links inside it are left out.
func copyDir(src, dst string, budget *linkBudget) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			if err := budget.take(0); err != nil {
				return err
			}
			return os.MkdirAll(out, 0o755)
		case d.Type().IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if err := budget.take(fi.Size()); err != nil {
				return err
			}
			return copyFile(p, out, fi.Mode())
		}
		return nil
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode.Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}
