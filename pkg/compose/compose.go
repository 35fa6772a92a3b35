// Package compose builds the outputs of an ArtifactGenerator
// (source.extensions.fluxcd.io/v1beta1, as Flux's source-watcher): each
// output is a tree assembled from the trees of the generator's sources by
// its copy operations, in order.
//
// A copy operation reads "@<alias>/<path or glob>" and writes
// "@artifact/<path>", as cp does:
//
//   - a file to a path ending in "/" (or to "@artifact/") goes into that
//     directory under its own name, to any other path as that path;
//   - a directory "dir" goes, with everything below it, into "<to>/dir" when
//     to ends in "/", and becomes "<to>" otherwise; "dir/" copies what is in
//     it into "<to>";
//   - a glob ("*", "?", "[...]" within a segment, "**" for any number of
//     segments) copies every file it matches into the directory "<to>",
//     keeping its path below the glob's literal prefix ("apps/a/**" copies
//     "apps/a/x/y.yaml" to "<to>/x/y.yaml"); a glob matching nothing copies
//     nothing.
//
// Exclude patterns are matched against the path below the literal prefix
// of from; a pattern without "/" matches a file or directory name at any
// depth. Strategies: Overwrite (the default) replaces a file already
// written; Merge merges a YAML file into the one already written as Helm
// merges values files (maps key by key, recursively; any other value
// replaced), or copies it when there is none; Extract unpacks tarballs
// (.tar.gz, .tgz) into "<to>" (a glob skips other files, a literal path
// that is not a tarball fails).
//
// No path may leave its tree: ".." segments, absolute paths and
// backslashes are refused (ErrInvalid) before anything is read, so Validate
// serves the watcher, which checks a spec before it makes a job.
package compose

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
)

// ErrInvalid is wrapped by the errors of a spec that can never be built:
// a path escaping its tree, an unknown alias or strategy, two outputs of
// one name.
var ErrInvalid = errors.New("invalid artifact generator spec")

// ErrBuild is wrapped by the errors of a copy operation that fails on the
// sources' content: a literal path that is not there, a YAML file that
// does not merge, a file that is not a tarball.
var ErrBuild = errors.New("artifact build failed")

// ArtifactAlias is the alias of the output in a copy operation's to.
const ArtifactAlias = "artifact"

// Validate checks a generator's spec without reading any content: unique
// source aliases, unique output names that are valid object names, copy
// operations that name a known alias and stay inside their trees, known
// strategies, and revision and originRevision naming known aliases. With
// a pathPattern, the pattern is parsed and the artifacts are checked as
// its templates (see Pattern). Its error wraps ErrInvalid.
func Validate(spec *swv1beta1.ArtifactGeneratorSpec) error {
	aliases := map[string]bool{}
	for _, s := range spec.Sources {
		if aliases[s.Alias] {
			return fmt.Errorf("%w: source alias %q is used twice", ErrInvalid, s.Alias)
		}
		if s.Alias == ArtifactAlias {
			return fmt.Errorf("%w: source alias %q is reserved for the output", ErrInvalid, s.Alias)
		}
		aliases[s.Alias] = true
	}
	if spec.PathPattern != "" {
		p, err := ParsePattern(spec.PathPattern)
		if err != nil {
			return err
		}
		if !aliases[p.Alias] {
			return fmt.Errorf("%w: pathPattern %q: source alias %s not found in spec.sources", ErrInvalid, spec.PathPattern, p.Alias)
		}
		return p.validateTemplates(spec.OutputArtifacts, aliases)
	}
	names := map[string]bool{}
	for _, a := range spec.OutputArtifacts {
		if names[a.Name] {
			return fmt.Errorf("%w: two artifacts are named %q", ErrInvalid, a.Name)
		}
		names[a.Name] = true
		if err := checkName(a.Name); err != nil {
			return fmt.Errorf("%w: artifact %q: %w", ErrInvalid, a.Name, err)
		}
		if err := validateArtifact(a, aliases); err != nil {
			return err
		}
	}
	return nil
}

// validateArtifact checks an output's revision, originRevision and copy
// operations; its error wraps ErrInvalid.
func validateArtifact(a swv1beta1.OutputArtifact, aliases map[string]bool) error {
	for field, ref := range map[string]string{"revision": a.Revision, "originRevision": a.OriginRevision} {
		if ref == "" {
			continue
		}
		if alias, ok := strings.CutPrefix(ref, "@"); !ok || !aliases[alias] {
			return fmt.Errorf("%w: artifact %q: %s %q names no source alias", ErrInvalid, a.Name, field, ref)
		}
	}
	if len(a.Copy) == 0 {
		return fmt.Errorf("%w: artifact %q has no copy operations", ErrInvalid, a.Name)
	}
	for i, op := range a.Copy {
		if _, err := parseOp(op, aliases); err != nil {
			return fmt.Errorf("%w: artifact %q copy[%d]: %w", ErrInvalid, a.Name, i, err)
		}
	}
	return nil
}

// checkName accepts a DNS subdomain name (an object's name).
func checkName(name string) error {
	if name == "" || len(name) > 253 {
		return errors.New("not a valid object name")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return errors.New("not a valid object name")
		}
		for _, r := range label {
			if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
				return errors.New("not a valid object name")
			}
		}
	}
	return nil
}

// op is a parsed copy operation.
type op struct {
	alias string
	// from is the path or glob below the source's root, cleaned; "" is
	// the root. fromDir is true when from ended in "/".
	from    string
	fromDir bool
	// glob is true when from has glob characters; prefix is its literal
	// leading directory.
	glob   bool
	prefix string
	// to is the destination below the output's root, cleaned ("" for
	// the root); toDir is true when it ended in "/" or is the root.
	to       string
	toDir    bool
	exclude  []string
	strategy string
}

// parseOp checks one copy operation against the known aliases (nil: any).
func parseOp(c swv1beta1.CopyOperation, aliases map[string]bool) (*op, error) {
	alias, from, ok := splitRef(c.From)
	if !ok {
		return nil, fmt.Errorf("from %q is not @<alias>/<path>", c.From)
	}
	if aliases != nil && !aliases[alias] {
		return nil, fmt.Errorf("from %q names no source alias", c.From)
	}
	toAlias, to, ok := splitRef(c.To)
	if !ok || toAlias != ArtifactAlias {
		return nil, fmt.Errorf("to %q is not @artifact/<path>", c.To)
	}
	o := &op{alias: alias, exclude: c.Exclude, strategy: c.Strategy}
	var err error
	if o.from, o.fromDir, err = cleanRel(from); err != nil {
		return nil, fmt.Errorf("from %q: %w", c.From, err)
	}
	if o.to, o.toDir, err = cleanRel(to); err != nil {
		return nil, fmt.Errorf("to %q: %w", c.To, err)
	}
	o.toDir = o.toDir || o.to == ""
	for _, e := range c.Exclude {
		if _, _, err := cleanRel(e); err != nil || path.IsAbs(e) {
			return nil, fmt.Errorf("exclude %q: %w", e, errEscape)
		}
		if _, err := path.Match(strings.ReplaceAll(e, "**", "*"), ""); err != nil {
			return nil, fmt.Errorf("exclude %q: %w", e, err)
		}
	}
	o.glob = hasMeta(o.from)
	if o.glob {
		segs := strings.Split(o.from, "/")
		i := slices.IndexFunc(segs, hasMeta)
		o.prefix = strings.Join(segs[:i], "/")
		for _, s := range segs[i:] {
			if _, err := path.Match(s, ""); err != nil && s != "**" {
				return nil, fmt.Errorf("from %q: %w", c.From, err)
			}
		}
	}
	switch o.strategy {
	case "", swv1beta1.OverwriteStrategy, swv1beta1.MergeStrategy, swv1beta1.ExtractStrategy:
	default:
		return nil, fmt.Errorf("unknown strategy %q", o.strategy)
	}
	if o.strategy == swv1beta1.ExtractStrategy && !o.glob && (o.fromDir || o.from == "") {
		return nil, fmt.Errorf("from %q: strategy Extract takes tarballs, not a directory", c.From)
	}
	return o, nil
}

// splitRef splits "@alias/rest" into alias and rest.
func splitRef(s string) (alias, rest string, ok bool) {
	s, ok = strings.CutPrefix(s, "@")
	if !ok {
		return "", "", false
	}
	alias, rest, ok = strings.Cut(s, "/")
	return alias, rest, ok && alias != ""
}

// errEscape is the error of a path that would leave its tree.
var errEscape = errors.New("path escapes its root (absolute, \"..\" or a backslash)")

// cleanRel cleans a relative slash path; dir says it ended in "/". A path
// that is absolute, has a ".." segment, a backslash or a NUL is refused.
func cleanRel(p string) (clean string, dir bool, err error) {
	if strings.HasPrefix(p, "/") || strings.ContainsAny(p, "\\\x00") {
		return "", false, errEscape
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return "", false, errEscape
		}
	}
	dir = p == "" || strings.HasSuffix(p, "/")
	clean = path.Clean("/" + p)[1:]
	return clean, dir, nil
}

// hasMeta tells whether s has glob characters.
func hasMeta(s string) bool { return strings.ContainsAny(s, "*?[") }

// match tells whether the slash path name matches the glob pattern, in
// which "**" is any number of whole segments (none included).
func match(pattern, name string) bool {
	ok, _ := matchSegs(strings.Split(pattern, "/"), strings.Split(name, "/"))
	return ok
}

// matchSegs matches the segments of a name against those of a pattern
// without backtracking: it keeps the set of pattern positions the name's
// segments read so far can have reached (at most len(pat)+1 of them) and
// advances it one name segment at a time, so a pattern of many "**"
// against a deep path costs len(pat)*len(name) segment matches, not a
// number exponential in the "**" (a tenant's glob must not stall the
// packager). steps counts the segment comparisons, for the tests.
func matchSegs(pat, name []string) (ok bool, steps int) {
	// cur[i]: the pattern's first i segments match the name's segments
	// read so far. A "**" at i matches none, so i reaching it reaches i+1.
	cur := make([]bool, len(pat)+1)
	next := make([]bool, len(pat)+1)
	closeStars := func(set []bool) {
		for i := 0; i < len(pat); i++ {
			if set[i] && pat[i] == "**" {
				set[i+1] = true
			}
		}
	}
	cur[0] = true
	closeStars(cur)
	for _, seg := range name {
		clear(next)
		alive := false
		for i, in := range cur[:len(pat)] {
			if !in {
				continue
			}
			steps++
			switch {
			case pat[i] == "**":
				// "**" takes this segment and may take more.
				next[i] = true
				alive = true
			default:
				if m, _ := path.Match(pat[i], seg); m {
					next[i+1] = true
					alive = true
				}
			}
		}
		if !alive {
			return false, steps
		}
		closeStars(next)
		cur, next = next, cur
	}
	return cur[len(pat)], steps
}

// excluded tells whether rel (a path below the operation's literal
// prefix) is excluded: a pattern with "/" matches the whole path, one
// without matches any single segment.
func (o *op) excluded(rel string) bool {
	for _, e := range o.exclude {
		e = strings.TrimSuffix(strings.TrimPrefix(e, "./"), "/")
		if strings.Contains(e, "/") {
			if match(e, rel) {
				return true
			}
			continue
		}
		for _, seg := range strings.Split(rel, "/") {
			if ok, _ := path.Match(e, seg); ok {
				return true
			}
		}
	}
	return false
}
