package gitfetch

import (
	"fmt"
	"sort"
	"strings"

	"github.com/Masterminds/semver/v3"
	"github.com/fluxcd/pkg/version"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-git/go-git/v5/plumbing"

	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// DefaultBranch is checked out when spec.ref is unset or names nothing,
// as in Flux (github.com/fluxcd/pkg/git.DefaultBranch).
const DefaultBranch = "master"

// tagDereferenceSuffix marks the peeled entry of an annotated tag in a
// remote's reference list.
const tagDereferenceSuffix = "^{}"

// refKind is the kind of reference a spec asks for.
type refKind int

const (
	refBranch refKind = iota
	refTag
	refSemVer
	refName
	refCommit
)

// ref is the reference of a spec.ref after Flux's precedence: commit, then
// name, then tag, then semver, then branch (default "master").
type ref struct {
	kind   refKind
	branch string
	tag    string
	semver *semver.Constraints
	expr   string
	name   string
	commit string
}

// newRef applies Flux's precedence to spec.ref (nil allowed).
func newRef(r *sourcev1.GitRepositoryRef) (*ref, error) {
	if r == nil {
		r = &sourcev1.GitRepositoryRef{}
	}
	out := &ref{branch: r.Branch, tag: r.Tag, name: r.Name, commit: r.Commit, expr: r.SemVer}
	switch {
	case r.Commit != "":
		out.kind = refCommit
	case r.Name != "":
		out.kind = refName
	case r.Tag != "":
		out.kind = refTag
	case r.SemVer != "":
		out.kind = refSemVer
	default:
		out.kind = refBranch
		if out.branch == "" {
			out.branch = DefaultBranch
		}
	}
	if out.name != "" && (out.kind == refName || out.kind == refCommit) &&
		(strings.HasPrefix(out.name, "/") || strings.HasSuffix(out.name, "/")) {
		return nil, source.StalledError(sourcev1.GitOperationFailedReason,
			"failed to checkout and determine revision: ref %s is invalid; Git refs cannot begin or end with a slash '/'", out.name)
	}
	if out.kind == refSemVer {
		c, err := semver.NewConstraint(r.SemVer)
		if err != nil {
			return nil, source.StalledError(sourcev1.GitOperationFailedReason,
				"failed to checkout and determine revision: semver parse error: %w", err)
		}
		out.semver = c
	}
	return out, nil
}

// absolute reports whether revisions use the full reference name, as Flux
// does when spec.ref.name is set.
func (r *ref) absolute() bool { return r.name != "" }

// listed is what the remote advertised: each reference name with its hash,
// and the peeled commit of each annotated tag.
type listed struct {
	refs   map[string]string
	peeled map[string]string
}

func newListed(refs []*plumbing.Reference) *listed {
	l := &listed{refs: map[string]string{}, peeled: map[string]string{}}
	for _, r := range refs {
		if r.Type() != plumbing.HashReference {
			continue
		}
		name := r.Name().String()
		if base, ok := strings.CutSuffix(name, tagDereferenceSuffix); ok {
			l.peeled[base] = r.Hash().String()
			continue
		}
		l.refs[name] = r.Hash().String()
	}
	return l
}

// commit returns the commit a reference points to, peeling annotated tags
// as Flux does: a name ending in "^{}" or a tag's peeled entry wins.
func (l *listed) commit(name string) (string, bool) {
	if base, ok := strings.CutSuffix(name, tagDereferenceSuffix); ok {
		h, found := l.peeled[base]
		return h, found
	}
	if h, ok := l.peeled[name]; ok {
		return h, true
	}
	h, ok := l.refs[name]
	return h, ok
}

// highestTag returns the tag with the highest version matching c, parsed
// as Flux parses tags (three dot-separated parts, an optional "v"). Flux
// breaks ties between versions that differ only in build metadata by the
// commit time, which a reference list does not carry; here the tag name
// breaks them.
func (l *listed) highestTag(c *semver.Constraints) (string, bool) {
	type candidate struct {
		tag string
		v   *semver.Version
	}
	var matched []candidate
	for name := range l.refs {
		tag, ok := strings.CutPrefix(name, "refs/tags/")
		if !ok {
			continue
		}
		v, err := version.ParseVersion(tag)
		if err != nil || !c.Check(v) {
			continue
		}
		matched = append(matched, candidate{tag, v})
	}
	if len(matched) == 0 {
		return "", false
	}
	sort.Slice(matched, func(i, j int) bool {
		if !matched[i].v.Equal(matched[j].v) {
			return matched[i].v.LessThan(matched[j].v)
		}
		return matched[i].tag < matched[j].tag
	})
	return matched[len(matched)-1].tag, true
}

// notFound is go-git's wording for a reference the remote does not have.
func notFound(name string) error {
	return fmt.Errorf("couldn't find remote ref %q", name)
}
