package fetchjob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// errStagingStopped ends the archive writer when storage stops reading.
var errStagingStopped = errors.New("staging stopped")

// WorkDir makes an empty directory in parent (the system's temporary
// directory when empty) for a job's downloads, and returns it with the
// function that removes it. A directory that cannot be made is Flux's
// StorageOperationFailed (DirCreationFailed), retried.
func WorkDir(ctx context.Context, parent string) (string, func(), error) {
	dir, err := os.MkdirTemp(parent, "fetch-")
	if err != nil {
		return "", nil, failure.New(failure.Transient, sourcev1.StorageOperationFailedCondition, sourcev1.DirCreationFailedReason,
			"failed to create temporary working directory: %w", err)
	}
	return dir, func() {
		if err := os.RemoveAll(dir); err != nil {
			logr.FromContextOrDiscard(ctx).Error(err, "removing temporary working directory", "dir", dir)
		}
	}, nil
}

// StageTree streams the tar of fsys into store at key, as the packager
// expects staged content, and returns its size. A failure is Flux's
// StorageOperationFailed (ArchiveOperationFailed): Final for a file over
// o.MaxFileSize (the same content is as large the next time; the message
// names the file by its path in the tree), Transient otherwise (a storage
// that is full or refusing, the job's time running out).
func StageTree(ctx context.Context, store storage.Storage, key string, fsys fs.FS, o archive.TarOptions) (int64, error) {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := archive.WriteTarFS(ctx, pw, fsys, o)
		pw.CloseWithError(err)
		done <- err
	}()
	info, err := store.Put(ctx, key, pr)
	// Unblock the writer if Put stopped reading early.
	pr.CloseWithError(errStagingStopped)
	if werr := <-done; werr != nil && !errors.Is(werr, errStagingStopped) {
		handling := failure.Transient
		if errors.Is(werr, archive.ErrTooLarge) {
			handling = failure.Final
		}
		return 0, stageFailure(handling, "archive", werr)
	}
	if err != nil {
		if ctx.Err() != nil {
			// The job's time ran out while staging.
			return 0, stageFailure(failure.Transient, "archive", ctx.Err())
		}
		return 0, stageFailure(failure.Transient, "archive", err)
	}
	return info.Size, nil
}

// StageFile stores file, which is the artifact itself, at key as it is,
// and returns its size. A file that cannot be read and a storage that
// cannot take it are each Flux's StorageOperationFailed
// (ArchiveOperationFailed), retried.
func StageFile(ctx context.Context, store storage.Storage, key, file string) (int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, failure.New(failure.Transient, sourcev1.StorageOperationFailedCondition, sourcev1.ArchiveOperationFailedReason,
			"unable to stage artifact: %w", err)
	}
	defer f.Close()
	info, err := store.Put(ctx, key, f)
	if err != nil {
		return 0, stageFailure(failure.Transient, "copy", err)
	}
	return info.Size, nil
}

// stageFailure is a failure to stage content, in Flux's words ("unable to
// archive artifact to storage", "unable to copy ...").
func stageFailure(h failure.Handling, verb string, err error) *failure.Error {
	return &failure.Error{Condition: sourcev1.StorageOperationFailedCondition, Reason: sourcev1.ArchiveOperationFailedReason,
		Handling: h, Err: fmt.Errorf("unable to %s artifact to storage: %w", verb, err)}
}
