// Package fetch is the fetcher's job handler: it takes a FetchRequested off
// the bus, asks the Source of the job's kind for the upstream revision,
// answers FetchUnchanged when the stored artifact already holds it (or
// nothing, for a steady source's quiet job), and
// otherwise downloads the content, stages it as a tar in the shared storage
// and hands it to the packager with a Fetched job. Failures become
// FetchFailed outcomes with Flux's reasons and messages.
package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/provenance"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// Notice reasons the fetcher reports besides the outcome.
const (
	// ArtifactVerificationFailedReason: the stored artifact does not match
	// its digest and is rebuilt (Flux's Event reason).
	ArtifactVerificationFailedReason = "ArtifactVerificationFailed"
	// ArtifactMissingReason: the stored artifact is gone and is rebuilt.
	ArtifactMissingReason = "ArtifactMissing"
)

// Publisher publishes CloudEvents; *bus.Publisher is one.
type Publisher interface {
	Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error
}

// errStagingStopped ends the archive writer when storage stops reading.
var errStagingStopped = errors.New("staging stopped")

// Handler handles fetch jobs.
type Handler struct {
	// Sources fetch each kind, keyed by kind ("GitRepository").
	Sources map[string]source.Source
	// Storage holds the artifacts and the staging area.
	Storage storage.Storage
	// Publisher publishes results.
	Publisher Publisher
	// MaxFileSize, when positive, fails a fetch with a larger file.
	MaxFileSize int64
	// TempDir is where downloads go; the system's when empty.
	TempDir string
	// Metrics, when set, records fetch durations and bytes.
	Metrics *Metrics
	// ContentCache, when true, reuses the artifact of identical content
	// another source already fetched instead of downloading it again,
	// and asks the packager to record new artifacts for reuse (see package
	// contentcache).
	ContentCache bool
	// flights joins concurrent fetches of the same content (see inflight).
	flights inflight
	// Leases, when set (with ContentCache), joins the fetches of the same
	// content that run at the same time in other fetcher replicas (see
	// Leases); nil combines them in this fetcher only.
	Leases *Leases
	// Provenance, when set, checks each job against the live object it
	// names before anything is read or fetched for it: a stale job is
	// dropped, a forged one rejected. Nil without a cluster.
	Provenance *provenance.Checker
	// Verified, when set, lets an unchanged reconcile skip reading a
	// stored artifact this fetcher verified recently and storage still
	// describes the same way (see Verified); nil reads it every time.
	Verified *Verified
}

// Handle is a bus.Handler for the fetch stream. A failed fetch is a
// *failure.Error, which the worker reports (Report) and settles; any other
// error is the platform's (the bus, the storage).
func (h *Handler) Handle(ctx context.Context, msg *events.Message, _ bus.Delivery) error {
	req, ok := msg.Data.(*events.FetchRequested)
	if !ok {
		return fmt.Errorf("%w: unexpected event type %s on the fetch stream", events.ErrMalformed, msg.Event.Type())
	}
	if h.Provenance != nil {
		if err := h.Provenance.Check(ctx, req); err != nil {
			return h.refuse(ctx, err)
		}
	}
	start := time.Now()
	// The requests of the fetch report the hosts that held them.
	ctx, tracker := hostlimit.Track(ctx)
	result, err := h.fetch(ctx, req)
	if f := failure.As(err); f != nil && f.Handling != failure.Stalling {
		if held := tracker.Held(); held != nil {
			// Whatever the HTTP library made of it, the host (or its
			// limit) held the fetch: it is tried again when the host
			// allows, not on a backoff.
			rl := source.RateLimited(held.Host, held.Until, time.Now())
			rl.Revision, rl.Notices = f.Revision, f.Notices
			err = rl
		}
	}
	switch {
	case err == nil:
		h.observe(req.Job.Object.Kind, result, start)
	case failure.As(err) != nil && ctx.Err() == nil:
		h.observe(req.Job.Object.Kind, ResultFailed, start)
	}
	return err
}

// refuse settles a job the live object does not back: a stale one is
// acknowledged and dropped (the object's own job supersedes it), a forged
// one is terminated as malformed, and an API failure is retried.
func (h *Handler) refuse(ctx context.Context, err error) error {
	log := logr.FromContextOrDiscard(ctx)
	switch {
	case errors.Is(err, provenance.ErrStale):
		log.V(1).Info("dropping a stale job", "reason", err.Error())
		return nil
	case errors.Is(err, provenance.ErrForged):
		return fmt.Errorf("%w: refusing the job: %w", events.ErrMalformed, err)
	}
	return fmt.Errorf("check the job against its object: %w", err)
}

// Report is the worker's bus.Reporter: it publishes a failed fetch as the
// job's FetchFailed outcome, with the revision resolved before the failure
// and a failed signature check, if that is what failed.
func (h *Handler) Report(ctx context.Context, msg *events.Message, f *failure.Error) error {
	req, ok := msg.Data.(*events.FetchRequested)
	if !ok {
		return fmt.Errorf("report: %T is not a fetch request", msg.Data)
	}
	out := &events.Outcome{Job: req.Job, Revision: f.Revision, Failure: f.Data(), Notices: f.Notices}
	var unverified *source.Unverified
	if errors.As(f, &unverified) {
		out.Verification = unverified.Verification
	}
	return h.Publisher.Publish(ctx, events.PublishSubject(req.Job.Object.Kind), events.TypeFetchFailed, req.Job, out)
}

// fetch does the job and publishes its result, except a failure, which it
// returns as a *failure.Error; any other error is the platform's.
func (h *Handler) fetch(ctx context.Context, req *events.FetchRequested) (_ string, err error) {
	kind := req.Job.Object.Kind
	src, ok := h.Sources[kind]
	if !ok {
		return "", source.StalledError(source.UnsupportedKindReason, "fetching sources of kind '%s' is not supported", kind)
	}
	// The spec's timeout bounds the work; publishing the result is not
	// part of it.
	work, cancel := context.WithTimeout(ctx, src.Timeout(req))
	defer cancel()
	log := logr.FromContextOrDiscard(ctx)

	res, err := src.Resolve(work, req)
	if err != nil {
		f := source.AsError(err, sourcev1.GitOperationFailedReason)
		// The stored artifact is checked whether or not the upstream
		// answers: a corrupt or missing one is reported now, not once
		// the upstream is back.
		if prev := req.Previous; prev != nil && f.Handling != failure.Waiting {
			if notice, verr := h.verify(ctx, prev); verr == nil && notice != nil {
				if notice.Reason == ArtifactMissingReason {
					notice.Message = fmt.Sprintf("artifact '%s' is missing from storage: it is rebuilt once the source can be fetched", prev.Path)
				}
				f.Notices = append(f.Notices, *notice)
			}
		}
		return "", f
	}
	if c, ok := res.(io.Closer); ok {
		// What resolving downloaded (a Helm index) is removed with the job.
		defer func() {
			if err := c.Close(); err != nil {
				log.Error(err, "removing resolved content")
			}
		}()
	}
	revision := res.Revision()
	// A failure from here on happened with a new upstream revision known.
	defer func() {
		if ferr := failure.As(err); ferr != nil && ferr.Revision == "" {
			ferr.Revision = revision
		}
	}()

	var notices []events.Notice
	if prev := req.Previous; prev != nil && !req.Force && revision != "" && revision == prev.Revision {
		notice, err := h.verify(work, prev)
		if err != nil {
			return "", err
		}
		if notice == nil && req.Quiet {
			// A steady source: its outcome would change nothing in
			// status, so the job is its only message.
			log.V(1).Info("revision unchanged; steady source, nothing published", "revision", revision)
			return ResultQuiet, nil
		}
		if notice == nil {
			out := &events.Outcome{Job: req.Job, Revision: revision, Artifact: prev}
			if err := h.Publisher.Publish(ctx, events.PublishSubject(kind), events.TypeFetchUnchanged, req.Job, out); err != nil {
				return "", err
			}
			log.V(1).Info("revision unchanged", "revision", revision)
			return ResultUnchanged, nil
		}
		log.Info("stored artifact is not usable: rebuilding", "reason", notice.Reason, "message", notice.Message)
		notices = append(notices, *notice)
	}

	// Content that may be shared is known by one key: the content cache's
	// and the one concurrent fetches of it join on.
	share, identity := h.shareable(res)
	var contentKey string
	if share != nil {
		contentKey = contentcache.Key(kind, identity, revision, req.Includes, h.MaxFileSize)
	}

	var lead func(staged *events.Fetched)
	var lease *Lease
	if share != nil {
		// A stored artifact that no longer matches its digest may be the
		// very file the content cache shares (a hard link): the cache's
		// copy is reused only if it checks out.
		verify := hasNotice(notices, ArtifactVerificationFailedReason)
		if result, done, err := h.reuse(ctx, work, req, revision, contentKey, share, notices, verify); done || err != nil {
			return result, err
		}
		// Fetches of the same content that run now join the first: it
		// downloads, the others copy what it staged.
		fl, leader := h.flights.join(contentKey)
		if !leader {
			if result, done, err := h.follow(ctx, work, req, fl, share, notices); done || err != nil {
				if done {
					h.Metrics.countCombined(CombineFollowedLocal)
				}
				return result, err
			}
			// The leader failed, or it found the content cached, with
			// nothing staged: the cache, if it has it now, saves the
			// download.
			if result, done, err := h.reuse(ctx, work, req, revision, contentKey, share, notices, verify); done || err != nil {
				return result, err
			}
		} else {
			// copied, when set, is this job's copy of content another
			// fetch staged: the flight lands with it, so that the fetches
			// that joined this one copy it in turn.
			var copied *events.Fetched
			if staged := h.flights.recent(contentKey); staged != nil {
				// A flight of the content landed a moment ago: its staged
				// content, if still there, or the content cache, which
				// knows the content once the packager deleted it, saves
				// the download.
				if err := share.ProveAccess(work); err != nil {
					h.flights.land(contentKey, fl, nil)
					return "", source.AsError(err, sourcev1.GitOperationFailedReason)
				}
				if copied = h.copyOf(ctx, work, req, staged, notices); copied != nil {
					h.Metrics.countCombined(CombineFollowedLocal)
				} else if result, done, err := h.reuse(ctx, work, req, revision, contentKey, share, notices, verify); done || err != nil {
					h.flights.land(contentKey, fl, nil)
					return result, err
				}
			}
			// The fetches of the same content in other fetchers join too:
			// one of them downloads.
			if copied == nil && h.Leases != nil {
				var result string
				var done bool
				lease, copied, result, done, err = h.combine(ctx, work, req, revision, contentKey, share, notices, verify)
				if done || err != nil {
					h.flights.land(contentKey, fl, nil)
					return result, err
				}
				if lease != nil {
					defer lease.Release(ctx)
				}
			}
			landed := false
			lead = func(staged *events.Fetched) {
				if !landed {
					landed = true
					h.flights.land(contentKey, fl, staged)
				}
			}
			defer lead(nil)
			if copied != nil {
				// This fetcher's followers copy the copy.
				lead(copied)
				return h.publishCopy(ctx, req, copied)
			}
		}
	}

	dir, err := os.MkdirTemp(h.TempDir, "fetch-")
	if err != nil {
		return "", &failure.Error{Condition: sourcev1.StorageOperationFailedCondition, Reason: sourcev1.DirCreationFailedReason,
			Err: fmt.Errorf("failed to create temporary working directory: %w", err)}
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			log.Error(err, "removing temporary working directory", "dir", dir)
		}
	}()
	content, err := res.Download(work, dir)
	if err != nil {
		return "", source.AsError(err, sourcev1.GitOperationFailedReason)
	}

	key := storage.StagingKey(req.Job.ID)
	size, err := h.stage(work, key, content)
	if err != nil {
		return "", err
	}
	if h.Metrics != nil {
		h.Metrics.bytes.WithLabelValues(kind).Add(float64(size))
	}
	out := &events.Fetched{
		Job:          req.Job,
		Revision:     content.Revision,
		Staging:      key,
		ArtifactName: content.ArtifactName,
		Metadata:     content.Metadata,
		EventMessage: content.EventMessage,
		Notices:      notices,
		Verification: content.Verification,
		Includes:     req.Includes,
	}
	if content.File != "" {
		out.Format = events.FormatFile
	}
	if share != nil {
		// The content downloaded may be of a newer revision than resolved.
		out.ContentKey = contentcache.Key(kind, identity, content.Revision, req.Includes, h.MaxFileSize)
	}
	if lead != nil {
		// The followers copy the staged content before the packager,
		// once it has the job, deletes it.
		lead(out)
	}
	if lease != nil {
		// So do the followers in other fetchers, or they find the
		// content cache, which the packager fills before it deletes.
		if err := lease.Land(ctx, out); err != nil {
			log.Error(err, "offering the staged content to other fetchers failed", "key", contentKey)
		}
	}
	if err := h.Publisher.Publish(ctx, events.PackageSubject(kind), events.TypeFetched, req.Job, out); err != nil {
		return "", err
	}
	log.Info("content staged", "revision", content.Revision, "staging", key, "bytes", size)
	return ResultFetched, nil
}

// hasNotice reports whether notices hold one with the given reason.
func hasNotice(notices []events.Notice, reason string) bool {
	for _, n := range notices {
		if n.Reason == reason {
			return true
		}
	}
	return false
}

// shareable returns res as a source.Shareable, with its content identity,
// when the content cache is on and res's content may be shared; nil
// otherwise.
func (h *Handler) shareable(res source.Resolved) (source.Shareable, []string) {
	if !h.ContentCache {
		return nil, nil
	}
	share, ok := res.(source.Shareable)
	if !ok {
		return nil, nil
	}
	identity, ok := share.ContentIdentity()
	if !ok {
		return nil, nil
	}
	return share, identity
}

// follow waits for the fetch leading the flight of the same content and
// hands what it staged to the packager as this job's: a copy of it at the
// job's own staging key, after this source's own credentials proved they
// can read the upstream. done is false when the leader failed or the copy
// could not be made: the caller then fetches itself.
func (h *Handler) follow(ctx, work context.Context, req *events.FetchRequested, fl *flight, share source.Shareable,
	notices []events.Notice) (result string, done bool, err error) {
	release := sync.OnceFunc(fl.copied)
	defer release()
	// Proven while the leader downloads.
	if err := share.ProveAccess(work); err != nil {
		return "", false, source.AsError(err, sourcev1.GitOperationFailedReason)
	}
	staged := fl.wait(work)
	if staged == nil {
		return "", false, nil
	}
	return h.stageCopy(ctx, work, req, staged, notices, release)
}

// stageCopy copies staged content to the job's staging key, calls release
// once the copy is made, and hands the copy to the packager.
func (h *Handler) stageCopy(ctx, work context.Context, req *events.FetchRequested, staged *events.Fetched,
	notices []events.Notice, release func()) (result string, done bool, err error) {
	out := h.copyOf(ctx, work, req, staged, notices)
	if out == nil {
		return "", false, nil
	}
	release()
	result, err = h.publishCopy(ctx, req, out)
	return result, err == nil, err
}

// copyOf copies the content another fetch staged to the job's staging key
// and returns the job's Fetched for the copy; nil when the content could
// not be copied (it is gone).
func (h *Handler) copyOf(ctx, work context.Context, req *events.FetchRequested, staged *events.Fetched,
	notices []events.Notice) *events.Fetched {
	key := storage.StagingKey(req.Job.ID)
	if _, err := h.Storage.Copy(work, staged.Staging, key); err != nil {
		logr.FromContextOrDiscard(ctx).Info("the content another fetch staged could not be copied", "error", err.Error())
		return nil
	}
	out := *staged
	out.Job, out.Staging, out.Notices, out.Includes = req.Job, key, notices, req.Includes
	return &out
}

// publishCopy hands the copy of content another fetch staged to the
// packager.
func (h *Handler) publishCopy(ctx context.Context, req *events.FetchRequested, out *events.Fetched) (string, error) {
	if err := h.Publisher.Publish(ctx, events.PackageSubject(req.Job.Object.Kind), events.TypeFetched, req.Job, out); err != nil {
		return "", err
	}
	logr.FromContextOrDiscard(ctx).Info("content staged by another fetch of the same content", "revision", out.Revision, "staging", out.Staging)
	return ResultJoined, nil
}

// combine takes part, for the fetch leading the flight of key in this
// fetcher, in the fetches of the same content in other fetcher replicas
// (see Leases). It returns the lease when this fetcher leads them: the
// caller downloads, then lands or releases it. When another fetcher led,
// it returns copied, this job's Fetched for its copy of what that fetcher
// staged, yet to be published; or done, once published, when the content
// cache held the content that fetcher staged and the packager took. With
// none of them, the caller downloads alone: the bucket cannot be read, or
// the other fetcher failed or died.
func (h *Handler) combine(ctx, work context.Context, req *events.FetchRequested, revision, key string, share source.Shareable,
	notices []events.Notice, verify bool) (lease *Lease, copied *events.Fetched, result string, done bool, err error) {
	log := logr.FromContextOrDiscard(ctx)
	lease, err = h.Leases.Acquire(work, key)
	if err != nil {
		if work.Err() == nil {
			log.Error(err, "the fetches in flight in other fetchers cannot be read: fetching alone", "key", key)
			h.Metrics.countCombined(CombineBypassed)
		}
		return nil, nil, "", false, nil
	}
	if lease != nil {
		h.Metrics.countCombined(CombineLed)
		return lease, nil, "", false, nil
	}
	// Proven before the copy, as a follower in this fetcher does.
	if err := share.ProveAccess(work); err != nil {
		return nil, nil, "", false, source.AsError(err, sourcev1.GitOperationFailedReason)
	}
	staged, outcome := h.Leases.Wait(work, key)
	if staged == nil {
		h.Metrics.countCombined(outcome)
		return nil, nil, "", false, nil
	}
	if copied = h.copyOf(ctx, work, req, staged, notices); copied != nil {
		h.Metrics.countCombined(CombineFollowedRemote)
		return nil, copied, "", false, nil
	}
	// The packager took the staged content, after it recorded it in the
	// content cache.
	result, done, err = h.reuse(ctx, work, req, revision, key, share, notices, verify)
	if done {
		h.Metrics.countCombined(CombineFollowedRemote)
	}
	return nil, nil, result, done, err
}

// reuse looks the content of key (of revision) up in the content cache and, on a hit,
// hands the cached artifact to the packager instead of downloading: done
// is true when it published the Fetched job. A cache that cannot be read
// is a miss; the content is downloaded. With verify, the cached artifact
// must match its digest.
func (h *Handler) reuse(ctx, work context.Context, req *events.FetchRequested, revision, key string, share source.Shareable,
	notices []events.Notice, verify bool) (result string, done bool, err error) {
	kind := req.Job.Object.Kind
	log := logr.FromContextOrDiscard(ctx)
	idx, err := contentcache.Lookup(work, h.Storage, key, revision)
	if err != nil {
		if work.Err() == nil {
			log.Error(err, "content cache lookup failed: fetching", "key", key)
		}
		return "", false, nil
	}
	if idx == nil {
		return "", false, nil
	}
	if verify {
		if err := storage.Verify(work, h.Storage, idx.Artifact, idx.Digest); err != nil {
			log.Info("cached artifact is not intact: fetching", "key", key, "error", err.Error())
			return "", false, nil
		}
	}
	// The cached bytes are handed over only to a source whose own
	// credentials can read the upstream.
	if err := share.ProveAccess(work); err != nil {
		return "", false, source.AsError(err, sourcev1.GitOperationFailedReason)
	}
	out := &events.Fetched{
		Job:      req.Job,
		Revision: revision,
		// Nothing is staged; the key lets the packager clean up what an
		// earlier attempt of the job may have staged.
		Staging:      storage.StagingKey(req.Job.ID),
		ArtifactName: idx.ArtifactName,
		Metadata:     idx.Metadata,
		EventMessage: idx.EventMessage,
		Notices:      notices,
		Includes:     req.Includes,
		ContentKey:   key,
		Reuse:        &events.Reuse{Key: idx.Artifact, Digest: idx.Digest, Size: idx.Size},
	}
	if err := h.Publisher.Publish(ctx, events.PackageSubject(kind), events.TypeFetched, req.Job, out); err != nil {
		return "", false, err
	}
	log.Info("content reused", "revision", revision, "key", key, "artifact", idx.Artifact)
	return ResultReused, true, nil
}

// verify checks that the previous artifact is stored intact. It returns the
// notice to carry when it is not; an error only when storage cannot tell.
func (h *Handler) verify(ctx context.Context, prev *meta.Artifact) (*events.Notice, error) {
	var info storage.Info
	statted := false
	if h.Verified != nil {
		// What storage says of the artifact before it is read: if it says
		// the same next time, the read can be skipped for a while.
		if i, err := h.Storage.Stat(ctx, prev.Path); err == nil {
			if h.Verified.Fresh(prev, i) {
				return nil, nil
			}
			info, statted = i, true
		}
	}
	err := storage.Verify(ctx, h.Storage, prev.Path, prev.Digest)
	if err != nil {
		h.Verified.Forget(prev)
	}
	var mismatch *storage.DigestMismatchError
	switch {
	case err == nil:
		if statted {
			h.Verified.Remember(prev, info)
		}
		return nil, nil
	case errors.Is(err, storage.ErrNotFound), errors.Is(err, storage.ErrInvalidKey):
		return &events.Notice{Warning: true, Reason: ArtifactMissingReason,
			Message: fmt.Sprintf("artifact '%s' is missing from storage: rebuilding", prev.Path)}, nil
	case errors.As(err, &mismatch):
		return &events.Notice{Warning: true, Reason: ArtifactVerificationFailedReason, Message: mismatch.Error()}, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	default:
		// An unreadable artifact is rebuilt like a corrupt one.
		return &events.Notice{Warning: true, Reason: ArtifactVerificationFailedReason,
			Message: fmt.Sprintf("failed to verify integrity of artifact: %s", err.Error())}, nil
	}
}

// stage streams the tar of content, or its file, into storage at key and
// returns its size. An archiving failure is a *failure.Error; a storage
// failure is not.
func (h *Handler) stage(ctx context.Context, key string, content *source.Content) (int64, error) {
	if content.File != "" {
		return h.stageFile(ctx, key, content.File)
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := archive.WriteTarFS(ctx, pw, content.Tree(), archive.TarOptions{Exclude: content.Exclude, MaxFileSize: h.MaxFileSize})
		pw.CloseWithError(err)
		done <- err
	}()
	info, err := h.Storage.Put(ctx, key, pr)
	// Unblock the writer if Put stopped reading early.
	pr.CloseWithError(errStagingStopped)
	if werr := <-done; werr != nil && !errors.Is(werr, errStagingStopped) {
		handling := failure.Transient
		if errors.Is(werr, archive.ErrTooLarge) {
			// The same content is as large the next time. The message
			// names the file by its path in the tree.
			handling = failure.Final
		}
		return 0, stageFailure(handling, "archive", werr)
	}
	if err != nil {
		if ctx.Err() != nil {
			// The spec's timeout ran out while staging.
			return 0, stageFailure(failure.Transient, "archive", ctx.Err())
		}
		// A storage that cannot take the content (full, refusing) is
		// Flux's StorageOperationFailed, shown on the source at once and
		// retried: the operator sees it where Flux users look.
		return 0, stageFailure(failure.Transient, "archive", err)
	}
	return info.Size, nil
}

// stageFile stores the file that is the artifact itself at key, as it is.
// A file that cannot be read and a storage that cannot take it are each a
// *failure.Error (StorageOperationFailed).
func (h *Handler) stageFile(ctx context.Context, key, file string) (int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, failure.New(failure.Transient, sourcev1.StorageOperationFailedCondition, sourcev1.ArchiveOperationFailedReason,
			"unable to stage artifact: %w", err)
	}
	defer f.Close()
	info, err := h.Storage.Put(ctx, key, f)
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

func (h *Handler) observe(kind, result string, start time.Time) {
	if h.Metrics != nil {
		h.Metrics.duration.WithLabelValues(kind, result).Observe(time.Since(start).Seconds())
	}
}

// JobTimeout is the deadline the job m needs (the bus worker's
// TimeoutOf): its source's spec.timeout, which bounds the fetch, and a
// minute to store and publish the result. Zero for a job of no known
// kind.
func (h *Handler) JobTimeout(m *events.Message) time.Duration {
	req, ok := m.Data.(*events.FetchRequested)
	if !ok {
		return 0
	}
	src, ok := h.Sources[req.Job.Object.Kind]
	if !ok {
		return 0
	}
	return src.Timeout(req) + time.Minute
}

// DeadlineCondition is the condition a fetch past its deadline sets (the
// bus worker's DeadlineCondition): FetchFailed.
func DeadlineCondition(*events.Message) string { return sourcev1.FetchFailedCondition }
