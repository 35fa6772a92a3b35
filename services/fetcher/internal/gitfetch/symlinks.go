package gitfetch

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// resolveSymlinks replaces every symbolic link in the tree at root whose
// target lies inside root by a copy of the target, as Flux does before
// archiving (archives hold no links). Links that point outside root, dangle
// or would copy a directory into itself are removed, so that nothing read
// from the tree afterwards (.sourceignore files, the archive) can lead
// outside it.
func resolveSymlinks(root string) error {
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
			err = copyDir(target, link)
		} else {
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

// copyDir copies the regular files and directories below src to dst; links
// inside it are left out.
func copyDir(src, dst string) error {
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
			return os.MkdirAll(out, 0o755)
		case d.Type().IsRegular():
			fi, err := d.Info()
			if err != nil {
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
