package gitfetch

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/Masterminds/semver/v3"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-git/go-git/v5/plumbing"

	"github.com/headwater-gitops/headwater/pkg/failure"
)

// FuzzRevision drives what turns a spec's ref and a remote's listing into
// a revision: newRef (Flux's precedence, semver parsing), highestTag over
// arbitrary tag names, Revision and ShortMessage. None may panic; an
// invalid ref stalls; a chosen tag matches the range; a revision names its
// hash; a short message is one line of at most 50 characters and "...".
func FuzzRevision(f *testing.F) {
	f.Add(">=1.0.0 <2.0.0", "v1.2.3", "refs/heads/main", "Add README\n\nbody")
	f.Add("*", "1.0.0+build.1", "refs/tags/v1.0.0", strings.Repeat("é", 60))
	f.Add("~1.2", "v1.2", "/broken/", "")
	f.Add("not a range", "latest", "", "x\ny")
	f.Fuzz(func(t *testing.T, expr, tag, name, message string) {
		r, err := newRef(&sourcev1.GitRepositoryRef{SemVer: expr})
		if err != nil {
			if fe := failure.As(err); fe == nil || fe.Handling != failure.Stalling {
				t.Fatalf("an invalid range %q: %v, want a stalling failure", expr, err)
			}
		} else if r.semver != nil {
			hash := plumbing.NewHash("0123456789abcdef0123456789abcdef01234567")
			l := newListed([]*plumbing.Reference{
				plumbing.NewHashReference(plumbing.ReferenceName("refs/tags/"+tag), hash),
				plumbing.NewHashReference("refs/tags/v0.0.1", hash),
			})
			if got, ok := l.highestTag(r.semver); ok {
				v, err := semver.NewVersion(strings.TrimPrefix(got, "v"))
				if err == nil && !r.semver.Check(v) {
					t.Fatalf("tag %q chosen for %q does not match it", got, expr)
				}
			}
		}
		if _, err := newRef(&sourcev1.GitRepositoryRef{Name: name}); err == nil && name != "" &&
			(strings.HasPrefix(name, "/") || strings.HasSuffix(name, "/")) {
			t.Fatalf("ref name %q with a leading or trailing slash accepted", name)
		}
		const hash = "0123456789abcdef0123456789abcdef01234567"
		for _, abs := range []bool{false, true} {
			if rev := Revision(name, hash, abs); !strings.HasSuffix(rev, "sha1:"+hash) {
				t.Fatalf("Revision(%q) = %q does not name the commit", name, rev)
			}
		}
		short := ShortMessage(message)
		if strings.Contains(short, "\n") || utf8.RuneCountInString(strings.TrimSuffix(short, "...")) > 50 {
			t.Fatalf("ShortMessage(%q) = %q", message, short)
		}
	})
}
