package packager

import (
	"cmp"
	"context"
	"io"

	"github.com/fluxcd/pkg/apis/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
)

// stagedBlob is the input of content staged as it is (events.StagedBlob:
// an OCIRepository layer with layer operation copy): the staged file is
// stored unchanged as the artifact, hashed on its way from storage to
// storage, so its digest is that of the upstream blob in the packager's
// algorithm.
type stagedBlob struct {
	p   *Packager
	job *events.Fetched
}

func (s *stagedBlob) write(ctx context.Context, key string) (*meta.Artifact, error) {
	p, f := s.p, s.job
	obj, err := p.openStaged(ctx, f.Staging)
	if err != nil {
		return nil, err
	}
	defer obj.Close()
	info := obj.Info()
	if limit := p.opts.MaxFileSize; limit > 0 && info.Size > limit {
		return nil, archiveFailure(failure.Final, "%w: '%s' is %d bytes, over the limit of %d", archive.ErrTooLarge, f.ArtifactName, info.Size, limit)
	}
	digester := p.opts.Algorithm().Digester()
	var readErr error
	in := archive.OnReadError(obj, func(err error) { readErr = cmp.Or(readErr, err) })
	stored, err := p.store.Put(ctx, key, io.TeeReader(in, digester.Hash()))
	switch {
	case readErr != nil:
		return nil, archiveFailure(failure.Transient, "read staged content: %w", readErr)
	case err != nil:
		return nil, archiveFailure(failure.Transient, "store artifact: %w", err)
	case stored.Size != info.Size:
		return nil, archiveFailure(failure.Transient, "store artifact %s: staged %d bytes, stored %d", key, info.Size, stored.Size)
	}
	size := stored.Size
	return &meta.Artifact{
		Path:           key,
		Digest:         digester.Digest().String(),
		Size:           &size,
		LastUpdateTime: metav1.NewTime(p.now()),
	}, nil
}
