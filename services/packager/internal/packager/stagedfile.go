package packager

import (
	"context"
	"errors"
	"io"

	"github.com/fluxcd/pkg/apis/meta"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// stagedFile is the input of content the fetcher staged as the artifact
// itself (events.FormatFile: a Helm chart, a Helm repository index, an
// OCI layer copied as is): it is streamed from the staging area into the
// artifact unchanged, hashed on the way, and never held whole.
type stagedFile struct {
	p   *Packager
	job *events.Fetched
}

func (s *stagedFile) write(ctx context.Context, key string) (*meta.Artifact, storage.Info, error) {
	p, f := s.p, s.job
	if len(f.Includes) > 0 {
		return nil, storage.Info{}, archiveFailure(failure.Final, "content staged as a file takes no includes")
	}
	obj, err := p.openStaged(ctx, f)
	if err != nil {
		return nil, storage.Info{}, err
	}
	defer obj.Close()

	var readErr error
	staged := archive.OnReadError(obj, func(err error) { readErr = err })
	digester := p.opts.Algorithm().Digester()
	var in io.Reader = io.TeeReader(staged, digester.Hash())
	var tooLarge bool
	if limit := p.opts.MaxFileSize; limit > 0 {
		in = &limitedReader{r: in, n: limit + 1, over: &tooLarge}
	}
	info, err := p.store.Put(ctx, key, in)
	switch {
	case tooLarge:
		// Put failed on the limit, which the same content reaches again.
		return nil, storage.Info{}, archiveFailure(failure.Final, "file too large: over the limit of %d bytes", p.opts.MaxFileSize)
	case readErr != nil:
		return nil, storage.Info{}, archiveFailure(failure.Transient, "read staged content: %w", readErr)
	case err != nil:
		return nil, storage.Info{}, archiveFailure(failure.Transient, "store artifact: %w", err)
	}
	return p.newArtifact(key, digester.Digest().String(), info.Size), info, nil
}

// errTooLarge ends a read past the size limit.
var errTooLarge = errors.New("over the size limit")

// limitedReader fails with errTooLarge, and sets over, once more than n-1
// bytes were read, so a storage write of it fails rather than stores a
// truncated artifact.
type limitedReader struct {
	r    io.Reader
	n    int64
	over *bool
}

func (l *limitedReader) Read(b []byte) (int, error) {
	if int64(len(b)) > l.n {
		b = b[:l.n]
	}
	n, err := l.r.Read(b)
	l.n -= int64(n)
	if l.n <= 0 {
		*l.over = true
		return n, errTooLarge
	}
	return n, err
}
