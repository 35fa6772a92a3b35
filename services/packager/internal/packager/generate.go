package packager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fluxcd/pkg/apis/meta"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/compose"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// Failure reasons of an ArtifactGenerator's job, in source-watcher's
// words: its Ready condition takes them.
const (
	// sourceFetchFailedReason: a source's artifact could not be read.
	sourceFetchFailedReason = swv1beta1.SourceFetchFailedReason
	// validationFailedReason: the spec can never be built.
	validationFailedReason = swv1beta1.ValidationFailedReason
)

// generateFailure is a failed ArtifactGenerator job. Its condition is
// Ready itself: a generator has no other negative-polarity condition.
func generateFailure(h failure.Handling, reason, format string, args ...any) *failure.Error {
	return failure.New(h, meta.ReadyCondition, reason, format, args...)
}

// generate composes the outputs of an ArtifactGenerator job, in this
// order: unpack the sources it uses into a work directory, build each
// output there, hash its tree, store the canonical tar.gz of each output
// whose content is new under externalartifact/<namespace>/<name>/<hash>.tar.gz
// and point its latest pointer at it, remove the stored outputs the spec
// no longer has, announce Packaged with every output, then apply
// retention. An output whose content is that of its previous artifact
// keeps it: only outputs whose content changed get a new revision. A
// redelivered job builds the same trees and writes the same bytes.
func (p *Packager) generate(ctx context.Context, r *events.GenerateRequested) error {
	log := logr.FromContextOrDiscard(ctx)
	if err := checkSegment(r.Job.Object.Namespace); err != nil {
		return fmt.Errorf("%w: %w", events.ErrMalformed, err)
	}
	if p.opts.NoCrossNamespaceRefs {
		// The watcher refuses such a generator; a job that names one
		// anyway copies nothing.
		for _, s := range r.Sources {
			if s.Namespace != r.Job.Object.Namespace {
				return generateFailure(failure.Stalling, swv1beta1.AccessDeniedReason,
					"cross-namespace reference to source %s/%s/%s is not allowed", s.Kind, s.Namespace, s.Name)
			}
		}
	}
	spec := &swv1beta1.ArtifactGeneratorSpec{OutputArtifacts: r.Artifacts, PathPattern: r.PathPattern}
	for _, s := range r.Sources {
		spec.Sources = append(spec.Sources, swv1beta1.SourceReference{Alias: s.Alias, Kind: s.Kind, Name: s.Name, Namespace: s.Namespace})
	}
	if err := compose.Validate(spec); err != nil {
		return generateFailure(failure.Stalling, validationFailedReason, "%v", err)
	}
	var pattern *compose.Pattern
	if r.PathPattern != "" {
		pattern, _ = compose.ParsePattern(r.PathPattern) // Validate parsed it
	} else {
		for _, a := range r.Artifacts {
			if err := checkSegment(a.Name); err != nil {
				return generateFailure(failure.Stalling, validationFailedReason, "artifact name: %v", err)
			}
		}
	}

	work, err := os.MkdirTemp("", "headwater-generate-")
	if err != nil {
		return generateFailure(failure.Transient, meta.BuildFailedReason, "work directory: %v", err)
	}
	defer os.RemoveAll(work)
	// One budget for what the copy operations of every output write.
	copts := p.opts.compose()
	srcs, dirs, err := p.unpackSources(ctx, r, pattern, filepath.Join(work, "src"), copts)
	if err != nil {
		return err
	}
	arts, err := expand(r, pattern, dirs)
	if err != nil {
		return err
	}

	previous := map[string]events.GeneratedOutput{}
	for _, o := range r.Previous {
		previous[o.Name] = o
	}
	outputs := make([]events.GeneratedOutput, 0, len(arts))
	for i, a := range arts {
		dir := filepath.Join(work, "out", fmt.Sprint(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return generateFailure(failure.Transient, meta.BuildFailedReason, "work directory: %v", err)
		}
		out, err := p.buildOutput(ctx, r, a.OutputArtifact, dir, srcs, previous, copts)
		if err != nil {
			return err
		}
		out.Labels = a.Labels
		outputs = append(outputs, out)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	if err := p.removeOutputs(ctx, r, outputs, previous); err != nil {
		return err
	}

	changed := 0
	for _, o := range outputs {
		if o.Changed {
			changed++
		}
	}
	out := events.Outcome{Job: r.Job, Revision: r.Revision, Outputs: outputs,
		EventMessage: fmt.Sprintf("stored %d of %d artifacts with new content", changed, len(outputs))}
	if err := p.pub.Publish(ctx, events.PublishSubject(r.Job.Object.Kind), events.TypePackaged, r.Job, out); err != nil {
		return err
	}
	log.Info("artifacts generated", "outputs", len(outputs), "changed", changed)
	if p.metrics != nil {
		p.metrics.Generated.WithLabelValues("changed").Add(float64(changed))
		p.metrics.Generated.WithLabelValues("unchanged").Add(float64(len(outputs) - changed))
	}
	for _, o := range outputs {
		if o.Changed {
			p.collect(ctx, path.Dir(o.Artifact.Path), o.Artifact.Path)
		}
	}
	return nil
}

// unpackSources unpacks the parts of the source artifacts the copy
// operations read into dir/<alias>, and returns the directories by alias.
// With a pattern, it also returns the directories of the pattern's
// source's tree (all of them, unpacked or not).
func (p *Packager) unpackSources(ctx context.Context, r *events.GenerateRequested, pattern *compose.Pattern,
	dir string, copts compose.Options) (map[string]string, compose.Dirs, error) {
	// Only what the copy operations read is written to disk: a
	// generator of one app of a monorepo unpacks that app.
	needed := compose.Needed(r.Artifacts, pattern)
	srcs := map[string]string{}
	dirs := compose.Dirs{}
	for _, s := range r.Sources {
		d := filepath.Join(dir, s.Alias)
		srcs[s.Alias] = d
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, nil, generateFailure(failure.Transient, meta.BuildFailedReason, "work directory: %v", err)
		}
		paths, used := needed[s.Alias]
		keep := paths.Keep
		if pattern != nil && pattern.Alias == s.Alias {
			// Every entry is looked at for the directories it is in.
			keep, used = dirs.Record(keep), true
		}
		if !used {
			continue
		}
		key, err := storage.CleanKey(s.Artifact.Path)
		if err != nil || storage.IsInternal(key) {
			return nil, nil, generateFailure(failure.Final, sourceFetchFailedReason, "source %q: invalid artifact path %q", s.Alias, s.Artifact.Path)
		}
		obj, err := p.store.Open(ctx, key)
		if errors.Is(err, storage.ErrNotFound) {
			// A newer artifact replaced it: the watcher makes a new job
			// when the source's status says so.
			return nil, nil, generateFailure(failure.Final, sourceFetchFailedReason,
				"source %q: artifact %s is no longer stored", s.Alias, key)
		}
		if err != nil {
			return nil, nil, generateFailure(failure.Transient, sourceFetchFailedReason, "source %q: open artifact: %v", s.Alias, err)
		}
		var readErr error
		in := archive.OnReadError(obj, func(err error) { readErr = err })
		err = compose.UnpackWith(ctx, in, d, copts, keep)
		_ = obj.Close()
		switch {
		case readErr != nil:
			return nil, nil, generateFailure(failure.Transient, sourceFetchFailedReason, "source %q: read artifact: %v", s.Alias, readErr)
		case err != nil:
			return nil, nil, generateFailure(failure.Final, sourceFetchFailedReason, "source %q: unpack artifact: %v", s.Alias, err)
		}
	}
	return srcs, dirs, nil
}

// expand returns the outputs of a job: its artifacts, or, with a
// pattern, the templates rendered for every directory it matches. A
// pattern's failure on the source's content (no directory matches, a
// directory name that makes no label or object name) is final for this
// revision of the source: nothing is stored and the outputs published
// before stay. An output named as an ExternalArtifact of another producer
// is refused, as the watcher refuses a literal name.
func expand(r *events.GenerateRequested, pattern *compose.Pattern, dirs compose.Dirs) ([]compose.Output, error) {
	if pattern == nil {
		outs := make([]compose.Output, len(r.Artifacts))
		for i, a := range r.Artifacts {
			outs[i] = compose.Output{OutputArtifact: a}
		}
		return outs, nil
	}
	outs, err := pattern.Expand(dirs.Sorted(), r.Artifacts)
	var none *compose.NoMatchError
	switch {
	case errors.As(err, &none):
		return nil, generateFailure(failure.Final, meta.BuildFailedReason, "%v", none)
	case errors.Is(err, compose.ErrInvalid):
		return nil, generateFailure(failure.Stalling, validationFailedReason, "%v", err)
	case err != nil:
		return nil, generateFailure(failure.Final, meta.BuildFailedReason, "%v", err)
	}
	for _, o := range outs {
		if err := checkSegment(o.Name); err != nil {
			return nil, generateFailure(failure.Final, meta.BuildFailedReason, "artifact name: %v", err)
		}
		if slices.Contains(r.Foreign, o.Name) {
			return nil, generateFailure(failure.Stalling, validationFailedReason,
				"pathPattern %q: artifact %q: ExternalArtifact %s/%s belongs to another producer", pattern, o.Name, r.Job.Object.Namespace, o.Name)
		}
	}
	return outs, nil
}

// buildOutput builds one output into dir with copts (whose copy budget
// the job's outputs share), and stores it unless its content is its
// previous artifact's.
func (p *Packager) buildOutput(ctx context.Context, r *events.GenerateRequested, a swv1beta1.OutputArtifact, dir string,
	srcs map[string]string, previous map[string]events.GeneratedOutput, copts compose.Options) (events.GeneratedOutput, error) {
	if err := compose.Build(ctx, dir, srcs, a, copts); err != nil {
		if errors.Is(err, compose.ErrInvalid) {
			return events.GeneratedOutput{}, generateFailure(failure.Stalling, validationFailedReason, "%v", err)
		}
		if errors.Is(err, compose.ErrBuild) {
			return events.GeneratedOutput{}, generateFailure(failure.Final, meta.BuildFailedReason, "%v", err)
		}
		return events.GeneratedOutput{}, generateFailure(failure.Transient, meta.BuildFailedReason, "%v", err)
	}
	hash, err := compose.TreeDigest(ctx, dir)
	if err != nil {
		return events.GeneratedOutput{}, generateFailure(failure.Transient, meta.BuildFailedReason, "hash artifact %q: %v", a.Name, err)
	}
	sourceDir := storage.SourceDir(events.GeneratedKind, r.Job.Object.Namespace, a.Name)
	key := path.Join(sourceDir, hash+".tar.gz")
	revision := "latest@sha256:" + hash
	if alias, ok := strings.CutPrefix(a.Revision, "@"); ok {
		revision = sourceOf(r, alias).Artifact.Revision
	}
	if prev, ok := previous[a.Name]; ok && prev.Artifact.Path == key && prev.Artifact.Revision == revision {
		if _, err := p.store.Stat(ctx, key); err == nil {
			art := prev.Artifact
			art.URL = ""
			return events.GeneratedOutput{Name: a.Name, Artifact: art}, nil
		}
	}

	var g streamGroup
	tarred := g.pipe(func(w io.Writer) error {
		if _, err := archive.WriteTar(ctx, w, dir, archive.TarOptions{}); err != nil {
			return generateFailure(failure.Transient, meta.BuildFailedReason, "archive artifact %q: %v", a.Name, err)
		}
		return nil
	})
	var res archive.Result
	canonical := g.pipe(func(w io.Writer) error {
		var err error
		res, err = archive.Canonicalize(w, tarred, archive.CanonicalOptions{Algorithm: p.opts.Algorithm(), MaxFileSize: p.opts.MaxFileSize,
			Level: p.opts.CompressionLevel})
		if err != nil {
			return generateFailure(failure.Final, meta.BuildFailedReason, "archive artifact %q: %v", a.Name, err)
		}
		return nil
	})
	info, err := p.store.Put(ctx, key, canonical)
	if err != nil {
		g.fail(generateFailure(failure.Transient, meta.BuildFailedReason, "store artifact %q: %v", a.Name, err))
	}
	if err := g.wait(); err != nil {
		return events.GeneratedOutput{}, err
	}
	if info.Size != res.Size {
		return events.GeneratedOutput{}, generateFailure(failure.Transient, meta.BuildFailedReason,
			"store artifact %s: wrote %d bytes, stored %d", key, res.Size, info.Size)
	}
	if err := p.setLatest(ctx, path.Join(sourceDir, storage.LatestName), key, r.Job); err != nil {
		return events.GeneratedOutput{}, generateFailure(failure.Transient, meta.BuildFailedReason, "update latest pointer: %v", err)
	}
	art := p.newArtifact(key, res.Digest.String(), res.Size)
	art.Revision = revision
	if alias, ok := strings.CutPrefix(a.OriginRevision, "@"); ok {
		if origin := originRevision(sourceOf(r, alias).Artifact); origin != "" {
			art.Metadata = map[string]string{swv1beta1.ArtifactOriginRevisionAnnotation: origin}
		}
	}
	if p.metrics != nil {
		p.metrics.ArtifactBytes.Observe(float64(res.Size))
	}
	logr.FromContextOrDiscard(ctx).V(1).Info("artifact stored", "artifact", key, "digest", art.Digest, "revision", revision)
	return events.GeneratedOutput{Name: a.Name, Artifact: *art, Changed: true}, nil
}

// sourceOf returns the job's source of the given alias (Validate checked
// that there is one).
func sourceOf(r *events.GenerateRequested, alias string) events.GeneratorSource {
	for _, s := range r.Sources {
		if s.Alias == alias {
			return s
		}
	}
	return events.GeneratorSource{}
}

// originRevision is the revision a source's artifact comes from: its
// org.opencontainers.image.revision annotation (an OCI artifact's), else
// its revision (a Git commit's).
func originRevision(a meta.Artifact) string {
	if rev := a.Metadata[swv1beta1.ArtifactOriginRevisionAnnotation]; rev != "" {
		return rev
	}
	return a.Revision
}

// removeOutputs removes the stored files of the previous outputs the job
// no longer has: their latest pointer first, then every artifact; an
// output whose pointer a newer job set is left as it is.
func (p *Packager) removeOutputs(ctx context.Context, r *events.GenerateRequested, outputs []events.GeneratedOutput,
	previous map[string]events.GeneratedOutput) error {
	keep := map[string]bool{}
	for _, o := range outputs {
		keep[o.Name] = true
	}
	for name := range previous {
		if keep[name] || checkSegment(name) != nil {
			continue
		}
		dir := storage.SourceDir(events.GeneratedKind, r.Job.Object.Namespace, name)
		// In job order: a late job that no longer had this output
		// leaves the pointer and the artifacts of a newer job that has.
		err := p.store.DeleteLatest(ctx, path.Join(dir, storage.LatestName), r.Job.RequestedAt)
		if errors.Is(err, storage.ErrSuperseded) {
			p.superseded(ctx, path.Join(dir, storage.LatestName), r.Job, err)
			continue
		}
		if err != nil {
			return generateFailure(failure.Transient, meta.BuildFailedReason, "remove artifact %q: %v", name, err)
		}
		objs, err := p.store.List(ctx, dir)
		if err != nil {
			return generateFailure(failure.Transient, meta.BuildFailedReason, "remove artifact %q: %v", name, err)
		}
		for _, o := range objs {
			if err := p.store.Delete(ctx, o.Key); err != nil {
				return generateFailure(failure.Transient, meta.BuildFailedReason, "remove artifact %q: %v", name, err)
			}
		}
		logr.FromContextOrDiscard(ctx).Info("removed artifact no longer generated", "name", name, "deleted", len(objs))
	}
	return nil
}
