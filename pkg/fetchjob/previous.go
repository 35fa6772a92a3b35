package fetchjob

import (
	"context"
	"errors"
	"fmt"

	"github.com/fluxcd/pkg/apis/meta"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// CheckPrevious checks that prev, the artifact a job names as stored, is
// stored intact, through verified's cache of artifacts found intact (nil
// reads it every time). It returns nil when it is, and otherwise the
// Warning notice of an artifact that is rebuilt: ArtifactMissing for one
// that is gone, ArtifactVerificationFailed, in Flux's words, for one that
// does not match its digest or cannot be read. The error is ctx's, when it
// ended before storage could tell.
func CheckPrevious(ctx context.Context, store storage.Storage, verified *storage.Verified, prev *meta.Artifact) (*events.Notice, error) {
	err := verified.Verify(ctx, store, prev.Path, prev.Digest)
	var mismatch *storage.DigestMismatchError
	switch {
	case err == nil:
		return nil, nil
	case errors.Is(err, storage.ErrNotFound), errors.Is(err, storage.ErrInvalidKey):
		return &events.Notice{Warning: true, Reason: events.ArtifactMissingReason,
			Message: fmt.Sprintf("artifact '%s' is missing from storage: rebuilding", prev.Path)}, nil
	case errors.As(err, &mismatch):
		return &events.Notice{Warning: true, Reason: events.ArtifactVerificationFailedReason, Message: mismatch.Error()}, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	default:
		// An unreadable artifact is rebuilt like a corrupt one.
		return &events.Notice{Warning: true, Reason: events.ArtifactVerificationFailedReason,
			Message: fmt.Sprintf("failed to verify integrity of artifact: %s", err.Error())}, nil
	}
}

// HasNotice reports whether notices hold one with the given reason.
func HasNotice(notices []events.Notice, reason string) bool {
	for _, n := range notices {
		if n.Reason == reason {
			return true
		}
	}
	return false
}
