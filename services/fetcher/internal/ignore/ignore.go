// Package ignore decides which files of a fetched tree go into an artifact,
// with Flux's rules and Flux's own matcher (github.com/fluxcd/pkg/sourceignore):
//
//   - with no .sourceignore file in the tree and no spec.ignore, the VCS
//     patterns (.git/, .gitignore, ...) and Flux's default exclusions (CI
//     configuration, images, archives) apply;
//   - otherwise the VCS patterns, then the patterns of every .sourceignore
//     file (scoped to its directory), then spec.ignore, apply; the defaults
//     do not.
//
// Like Flux, every file is matched on its own, so a negated pattern can
// bring back a file inside an ignored directory.
package ignore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/fluxcd/pkg/sourceignore"
	"github.com/fluxcd/pkg/sourceignore/gitignore"
)

// Filter tells which paths of one tree to leave out.
type Filter struct {
	matcher gitignore.Matcher
	// kept holds every directory with a file that is not ignored below it.
	kept map[string]bool
}

// Load reads the ignore rules of the tree at root: its .sourceignore files
// and spec, the source's spec.ignore (nil when unset).
func Load(root string, spec *string) (*Filter, error) {
	return LoadFS(os.DirFS(root), spec)
}

// LoadFS is Load for the tree of fsys (a directory, or a git commit's tree
// read from its packfile).
func LoadFS(fsys fs.FS, spec *string) (*Filter, error) {
	// Patterns are matched on paths relative to the root, so the domain of
	// the root is empty; .sourceignore files in subdirectories are scoped
	// to them.
	var domain []string
	ps, err := loadPatterns(fsys, ".", domain)
	if err != nil {
		return nil, fmt.Errorf("failed to load source ignore patterns from repository: %w", err)
	}
	if spec != nil {
		ps = append(ps, sourceignore.ReadPatterns(strings.NewReader(*spec), domain)...)
	}
	f := &Filter{kept: map[string]bool{}}
	if len(ps) == 0 {
		f.matcher = sourceignore.NewDefaultMatcher(ps, domain)
	} else {
		f.matcher = sourceignore.NewMatcher(append(sourceignore.VCSPatterns(domain), ps...))
	}
	if err := f.scan(fsys); err != nil {
		return nil, fmt.Errorf("failed to load source ignore patterns from repository: %w", err)
	}
	return f, nil
}

// loadPatterns reads the .sourceignore file of dir and of every directory
// below it but .git, each scoped to its directory, as Flux's
// sourceignore.LoadIgnorePatterns reads them from a disk.
func loadPatterns(fsys fs.FS, dir string, domain []string) ([]gitignore.Pattern, error) {
	dom := slices.Clone(domain)
	var ps []gitignore.Pattern
	if f, err := fsys.Open(path.Join(dir, sourceignore.IgnoreFile)); err == nil {
		ps = sourceignore.ReadPatterns(f, dom)
		_ = f.Close()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != ".git" {
			sub, err := loadPatterns(fsys, path.Join(dir, e.Name()), append(dom, e.Name()))
			if err != nil {
				return nil, err
			}
			ps = append(ps, sub...)
		}
	}
	return ps, nil
}

// scan records the directories that hold a kept file, so that Exclude can
// prune an ignored directory only when nothing below it is brought back.
func (f *Filter) scan(fsys fs.FS) error {
	return fs.WalkDir(fsys, ".", func(rel string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		if f.matcher.Match(strings.Split(rel, "/"), false) {
			return nil
		}
		for dir := pathDir(rel); dir != ""; dir = pathDir(dir) {
			if f.kept[dir] {
				break
			}
			f.kept[dir] = true
		}
		return nil
	})
}

// Exclude reports whether the path rel (slash-separated, relative to the
// root) stays out of the artifact; for a directory, true means nothing below
// it is kept either. It fits archive.TarOptions.Exclude.
func (f *Filter) Exclude(rel string, isDir bool) bool {
	if isDir {
		return !f.kept[rel] && f.matcher.Match(strings.Split(rel, "/"), true)
	}
	return f.matcher.Match(strings.Split(rel, "/"), false)
}

// pathDir is path.Dir for relative paths, with "" for the root.
func pathDir(rel string) string {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return ""
	}
	return rel[:i]
}
