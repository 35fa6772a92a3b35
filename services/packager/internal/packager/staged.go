package packager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// stagedTar is the input of fetched content: the uncompressed tar the
// fetcher staged, merged with the artifacts the job includes and
// canonicalised into the gzip-compressed artifact. It streams from storage
// to storage: the staged tar and the included artifacts are read, merged,
// compressed, hashed and written side by side, through pipes.
type stagedTar struct {
	p   *Packager
	job *events.Fetched
}

func (s *stagedTar) write(ctx context.Context, key string) (*meta.Artifact, storage.Info, error) {
	p, f := s.p, s.job
	if err := checkIncludes(f.Job.Object, f.Includes); err != nil {
		return nil, storage.Info{}, err
	}
	obj, err := p.openStaged(ctx, f)
	if err != nil {
		return nil, storage.Info{}, err
	}
	defer obj.Close()

	var g streamGroup
	staged := archive.OnReadError(obj, g.storageFailure("read staged content"))
	in := staged
	if len(f.Includes) > 0 {
		objs, err := p.openIncludes(ctx, f.Includes)
		if err != nil {
			return nil, storage.Info{}, err
		}
		defer closeAll(objs)
		logr.FromContextOrDiscard(ctx).V(1).Info("merging includes", "includes", describeIncludes(f.Includes))
		in = g.pipe(func(w io.Writer) error { return mergeIncludes(w, staged, f.Includes, objs, &g) })
	}
	var res archive.Result
	canonical := g.pipe(func(w io.Writer) error {
		var err error
		res, err = archive.Canonicalize(w, in, archive.CanonicalOptions{Algorithm: p.opts.Algorithm(), MaxFileSize: p.opts.MaxFileSize,
			Level: p.opts.CompressionLevel})
		if err != nil {
			// The content itself cannot be archived (an unsafe path, a
			// file over the limit, a corrupt tar): it fails again.
			return archiveFailure(failure.Final, "%w", err)
		}
		return nil
	})
	info, err := p.store.Put(ctx, key, canonical)
	if err != nil {
		g.fail(archiveFailure(failure.Transient, "store artifact: %w", err))
	}
	if err := g.wait(); err != nil {
		return nil, storage.Info{}, err
	}
	if info.Size != res.Size {
		return nil, storage.Info{}, archiveFailure(failure.Transient, "store artifact %s: wrote %d bytes, stored %d", key, res.Size, info.Size)
	}
	return p.newArtifact(key, res.Digest.String(), res.Size), info, nil
}

// openStaged opens f's staged content; when it is gone the error wraps
// errStagingGone.
func (p *Packager) openStaged(ctx context.Context, f *events.Fetched) (storage.Object, error) {
	obj, err := p.store.Open(ctx, f.Staging)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, fmt.Errorf("%w: %w", errStagingGone, err)
	}
	if err != nil {
		return nil, archiveFailure(failure.Transient, "open staged content: %w", err)
	}
	return obj, nil
}

// newArtifact describes an artifact just written at key.
func (p *Packager) newArtifact(key, digest string, size int64) *meta.Artifact {
	return &meta.Artifact{Path: key, Digest: digest, Size: &size, LastUpdateTime: metav1.NewTime(p.now())}
}

// errStopped ends a side of a streaming write that another side's failure,
// or the end of the write, left without a reader.
var errStopped = errors.New("stream stopped")

// streamGroup joins the sides of one streaming write (storage reads, a
// merge, canonicalisation, the storage write) and tells which side failed:
// the first failure reported is the write's, and what the other sides run
// into after it (a pipe closed under them, a read that returns the
// failure) is a consequence and dropped. A side reports its failure before
// anything downstream can see it: a storage read as it happens
// (storageFailure), a piped writer before it closes its pipe. The first
// failure stops every pipe, so no side is left blocked.
type streamGroup struct {
	wg    sync.WaitGroup
	mu    sync.Mutex
	err   error
	pipes []*io.PipeReader
}

// fail reports err as a side's failure; it becomes the write's unless one
// was reported before or err only says the side was stopped.
func (g *streamGroup) fail(err error) {
	g.mu.Lock()
	first := g.err == nil && !errors.Is(err, errStopped)
	if first {
		g.err = err
	}
	g.mu.Unlock()
	if first {
		g.stop()
	}
}

// storageFailure returns the function that reports the read errors of a
// storage object (for archive.OnReadError) as transient failures, what
// saying what was read.
func (g *streamGroup) storageFailure(what string) func(error) {
	return func(err error) { g.fail(archiveFailure(failure.Transient, "%s: %w", what, err)) }
}

// pipe runs write in a goroutine and returns what it writes. An error of
// write is reported before the reader sees it.
func (g *streamGroup) pipe(write func(io.Writer) error) io.Reader {
	pr, pw := io.Pipe()
	g.mu.Lock()
	g.pipes = append(g.pipes, pr)
	g.mu.Unlock()
	g.wg.Go(func() {
		err := write(pw)
		if err != nil {
			g.fail(err)
		}
		pw.CloseWithError(err) // nil: the reader sees EOF
	})
	return pr
}

// stop ends every pipe: their writers fail with errStopped.
func (g *streamGroup) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, pr := range g.pipes {
		pr.CloseWithError(errStopped)
	}
}

// wait is called once the last reader is done: it stops the sides still
// writing, waits for them all and returns the write's failure, if any.
func (g *streamGroup) wait() error {
	g.stop()
	g.wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

func closeAll(objs []storage.Object) {
	for _, o := range objs {
		_ = o.Close()
	}
}
