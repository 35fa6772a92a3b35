package packager

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/opencontainers/go-digest"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// Reasons of include failures. IllegalPath and NoArtifact are the
// watcher's too (and Flux's); CopyFailure is Flux's reason for an include
// that cannot be copied where the spec asks.
const (
	illegalPathReason = "IllegalPath"
	noArtifactReason  = "NoArtifact"
	copyFailureReason = "CopyFailure"
)

// Including another source's artifact (a GitRepository's spec.include) is
// a merge of tar streams: the staged content is the first layer and each
// included artifact, unpacked on the fly and cut down to its fromPath, is
// laid over it at its toPath, replacing what was there (archive.Merge).
// Nothing is unpacked to disk and no file is held in memory: the staged
// tar and every included artifact are read side by side, each once, in
// canonical order, so the result is the same canonical artifact a tree
// with the included files copied in would give.
//
// Every included artifact's digest is checked as it is read; Merge reads
// each to its end before it completes its output, so a corrupt artifact
// fails the job before the new artifact is complete, and storage.Put,
// which is atomic, never stores it.

// checkIncludes validates the includes of a job: plain names, toPaths and
// fromPaths that stay inside the artifact, and artifacts that belong to
// the named source. A bad one is an *failure.Error.
func checkIncludes(obj events.ObjectRef, incs []events.Include) error {
	for _, in := range incs {
		if err := checkSegment(in.Name); err != nil {
			return stalledInclude(in, "invalid name: %s", err.Error())
		}
		if in.ToPath == "" {
			return stalledInclude(in, "toPath %q would replace the whole artifact", in.ToPath)
		}
		for _, p := range []string{in.ToPath, in.FromPath} {
			if p != "" && !cleanRelative(p) {
				return stalledInclude(in, "paths must be relative and stay inside the artifact (fromPath %q, toPath %q)", in.FromPath, in.ToPath)
			}
		}
		dir, file := path.Split(in.Artifact.Path)
		if dir != storage.SourceDir(sourcev1.GitRepositoryKind, obj.Namespace, in.Name)+"/" || checkSegment(file) != nil ||
			file == storage.LatestName {
			return stalledInclude(in, "artifact path %q is not an artifact of GitRepository '%s/%s'", in.Artifact.Path, obj.Namespace, in.Name)
		}
		if _, err := digest.Parse(in.Artifact.Digest); err != nil {
			return stalledInclude(in, "artifact digest %q is invalid", in.Artifact.Digest)
		}
	}
	return nil
}

// stalledInclude is the failure of an include the spec (or the job) gets
// wrong: retrying cannot help until it changes.
func stalledInclude(in events.Include, format string, args ...any) *failure.Error {
	// Flux's words (GitRepositoryReconciler.reconcileInclude).
	return failure.New(failure.Stalling, sourcev1.IncludeUnavailableCondition, illegalPathReason,
		"path calculation for include '%s' failed: %s", in.Name, fmt.Sprintf(format, args...))
}

// unavailableInclude is the failure of an include whose artifact is missing
// or unusable: the included source rebuilds it, and the watcher requeues
// this one when it does.
func unavailableInclude(in events.Include, format string, args ...any) *failure.Error {
	// Flux's words for an include without an artifact, with why.
	return failure.New(failure.Final, sourcev1.IncludeUnavailableCondition, noArtifactReason,
		"no artifact available for include '%s': %s", in.Name, fmt.Sprintf(format, args...))
}

// copyFailure is the failure of an include whose content cannot go where
// the spec says (no fromPath in the artifact, a file where a directory is
// needed): a new commit of either source may fix it.
func copyFailure(in events.Include, err error) *failure.Error {
	// Flux's words (GitRepositoryReconciler.reconcileInclude).
	return failure.New(failure.Final, sourcev1.StorageOperationFailedCondition, copyFailureReason,
		"failed to copy '%s' include from %s to %s: %s", in.Name, in.FromPath, in.ToPath, err.Error())
}

// cleanRelative accepts a clean relative slash-separated path that stays
// inside the root.
func cleanRelative(p string) bool {
	if _, err := storage.CleanKey(p); err != nil {
		return false
	}
	return true
}

// includedArtifacts lists the artifacts of incs, for the outcome.
func includedArtifacts(incs []events.Include) []*meta.Artifact {
	if len(incs) == 0 {
		return nil
	}
	out := make([]*meta.Artifact, len(incs))
	for i := range incs {
		out[i] = incs[i].Artifact.DeepCopy()
	}
	return out
}

// openIncludes opens the artifact of every include. A missing artifact is
// the include's failure; another error is a transient storage failure.
func (p *Packager) openIncludes(ctx context.Context, incs []events.Include) ([]storage.Object, error) {
	var objs []storage.Object
	for _, in := range incs {
		obj, err := p.store.Open(ctx, in.Artifact.Path)
		if errors.Is(err, storage.ErrNotFound) {
			closeAll(objs)
			return nil, unavailableInclude(in, "artifact '%s' is missing from storage", in.Artifact.Path)
		}
		if err != nil {
			closeAll(objs)
			return nil, archiveFailure(failure.Transient, "open artifact of include '%s': %w", in.Name, err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// mergeIncludes writes to w the staged tar merged with the included
// artifacts objs, as a side of g: a storage error reading an included
// artifact is reported to g as it happens; what the merge finds wrong is
// an include's failure, or the content's about the staged tar.
func mergeIncludes(w io.Writer, staged io.Reader, incs []events.Include, objs []storage.Object, g *streamGroup) error {
	layers := []archive.Layer{{Tar: staged}}
	for i, in := range incs {
		r := archive.OnReadError(objs[i], g.storageFailure(fmt.Sprintf("read artifact of include '%s'", in.Name)))
		// Checked by checkIncludes.
		want, _ := digest.Parse(in.Artifact.Digest)
		zr, err := gzip.NewReader(&verifyingReader{r: r, verifier: want.Verifier(), key: in.Artifact.Path, want: want.String()})
		if err != nil {
			return mergeFailure(incs, &archive.LayerError{Layer: i + 1, Err: fmt.Errorf("gzip: %w", err)})
		}
		layers = append(layers, archive.Layer{Tar: zr, From: in.FromPath, To: in.ToPath})
	}
	_, err := archive.Merge(w, layers)
	return mergeFailure(incs, err)
}

// mergeFailure turns a merge error into the job's failure: one about the
// staged content (layer 0) is the content's, one about an include the
// include's. Other errors are writing the output, stopped by another side.
func mergeFailure(incs []events.Include, err error) error {
	var le *archive.LayerError
	if !errors.As(err, &le) {
		return err
	}
	if le.Layer == 0 || le.Layer > len(incs) {
		return archiveFailure(failure.Final, "%w", le.Err)
	}
	in := incs[le.Layer-1]
	var mismatch *storage.DigestMismatchError
	switch {
	case errors.As(le.Err, &mismatch):
		return unavailableInclude(in, "%s", mismatch.Error())
	case errors.Is(le.Err, archive.ErrPathNotFound):
		return copyFailure(in, fmt.Errorf("fromPath '%s' does not exist in the artifact", in.FromPath))
	case errors.Is(le.Err, archive.ErrPathConflict):
		return copyFailure(in, le.Err)
	}
	return unavailableInclude(in, "artifact '%s' cannot be read: %s", in.Artifact.Path, le.Err.Error())
}

// verifyingReader checks the digest of what it reads: at the end of its
// reader it returns a *storage.DigestMismatchError instead of io.EOF when
// the digest is not the one expected.
type verifyingReader struct {
	r        io.Reader
	verifier digest.Verifier
	key      string
	want     string
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	_, _ = v.verifier.Write(p[:n])
	if err == io.EOF && !v.verifier.Verified() {
		return n, &storage.DigestMismatchError{Key: v.key, Expected: v.want}
	}
	return n, err
}

// describeIncludes is a short list of includes for logs.
func describeIncludes(incs []events.Include) string {
	parts := make([]string, len(incs))
	for i, in := range incs {
		parts[i] = fmt.Sprintf("%s:%s->%s", in.Name, in.FromPath, in.ToPath)
	}
	return strings.Join(parts, ",")
}
