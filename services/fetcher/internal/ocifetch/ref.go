package ocifetch

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"

	"github.com/Masterminds/semver/v3"
	"github.com/fluxcd/pkg/version"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// resolve turns ref into a manifest digest with Flux's precedence: digest
// (no request), then semver (a tag listing, then a HEAD), then tag (a
// HEAD), "latest" when ref names nothing.
func (r *resolved) resolve(ctx context.Context, ref *sourcev1.OCIRepositoryRef) error {
	tag := name.DefaultTag
	if ref != nil {
		switch {
		case ref.Digest != "":
			d, err := v1.NewHash(ref.Digest)
			if err != nil {
				return source.StalledError(sourcev1.OCIPullFailedReason, "failed to determine artifact digest: %w", err)
			}
			r.digest = d
			return nil
		case ref.SemVer != "":
			t, err := r.tagBySemver(ctx, ref.SemVer, ref.SemverFilter)
			if err != nil {
				return err
			}
			tag = t
		case ref.Tag != "":
			tag = ref.Tag
		}
	}
	t := r.repo.Tag(tag)
	// Flux asks with HEAD and falls back to GET for registries that do
	// not answer HEAD requests for manifests.
	opts := r.options(ctx)
	desc, err := remote.Head(t, opts...)
	if err != nil {
		d, gerr := remote.Get(t, opts...)
		if gerr != nil {
			return pullError(gerr, "failed to determine artifact digest: %w", gerr)
		}
		desc = &d.Descriptor
	}
	r.tag, r.digest, r.checked = t.TagStr(), desc.Digest, true
	return nil
}

// tagBySemver lists the repository's tags and returns the highest that
// filter (a regular expression, if set) keeps and the range accepts.
func (r *resolved) tagBySemver(ctx context.Context, rng, filter string) (string, error) {
	readError := func(h failure.Handling, err error) error {
		return source.FailedWith(h, sourcev1.ReadOperationFailedReason, "failed to determine the artifact tag for '%s': %w", r.url, err)
	}
	constraint, err := semver.NewConstraint(rng)
	if err != nil {
		return "", readError(failure.Stalling, fmt.Errorf("semver '%s' parse error: %w", rng, err))
	}
	var keep *regexp.Regexp
	if filter != "" {
		if keep, err = regexp.Compile(filter); err != nil {
			return "", readError(failure.Stalling, fmt.Errorf("failed to compile regex pattern '%s': %w", filter, err))
		}
	}
	tags, err := remote.List(r.repo, r.options(ctx)...)
	if err != nil {
		e := pullError(err, "%w", err)
		return "", readError(e.Handling, err)
	}
	var matching []*semver.Version
	for _, t := range tags {
		if keep != nil && !keep.MatchString(t) {
			continue
		}
		v, err := version.ParseVersion(t)
		if err != nil {
			continue
		}
		if constraint.Check(v) {
			matching = append(matching, v)
		}
	}
	if len(matching) == 0 {
		// Final: the next interval lists the tags again.
		return "", readError(failure.Final, errors.New("no match found for semver: "+rng))
	}
	sort.Sort(sort.Reverse(semver.Collection(matching)))
	return matching[0].Original(), nil
}
