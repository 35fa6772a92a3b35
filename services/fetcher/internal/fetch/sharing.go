package fetch

import (
	"context"
	"sync"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/fetchjob"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// sharing is one fetch's part in the sharing of identical content
// (Handler.ContentCache). Its content is known by one key, the content
// cache's and the one concurrent fetches of it join on. Before the fetch
// downloads, join tries in turn what saves the download: the artifact the
// content cache holds for the key; the fetch of the same content running
// in this fetcher (inflight), whose staged content a follower copies; the
// one that landed a moment ago; the one running in another fetcher
// (Leases). When none does, the fetch downloads and offers what it staged
// to the fetches that joined it, and leave ends its part.
//
// Every copy or reuse is handed over only after the source's own
// credentials proved they can read the upstream (source.Shareable). A nil
// *sharing is a fetch whose content is not shared: its methods do nothing.
type sharing struct {
	h   *Handler
	req *events.FetchRequested
	// share is the resolved source, and identity its content identity.
	share    source.Shareable
	identity []string
	// revision is the resolved revision, and key the content key of it.
	revision, key string
	// notices go with the job's Fetched, however it is made.
	notices []events.Notice
	// verify asks that a cached artifact match its digest before it is
	// reused: the source's own stored artifact did not, and it may be the
	// very file the content cache shares (a hard link).
	verify bool

	// flight is the flight of key this fetch joined in this fetcher,
	// leader whether it leads it, and landed whether it has landed.
	flight         *flight
	leader, landed bool
	// lease, when set, is this fetcher's lead of the fetches of key in
	// every fetcher: released by leave.
	lease *Lease
}

// sharing returns the fetch of req's content resolved as res, of
// revision, as a sharing; nil when the content cache is off or res's
// content may not be shared.
func (h *Handler) sharing(req *events.FetchRequested, res source.Resolved, revision string, notices []events.Notice) *sharing {
	if !h.ContentCache {
		return nil
	}
	share, ok := res.(source.Shareable)
	if !ok {
		return nil
	}
	identity, ok := share.ContentIdentity()
	if !ok {
		return nil
	}
	s := &sharing{h: h, req: req, share: share, identity: identity, revision: revision, notices: notices,
		verify: fetchjob.HasNotice(notices, events.ArtifactVerificationFailedReason)}
	s.key = s.contentKey(revision)
	return s
}

// contentKey is the content key of the content at revision (the content
// downloaded may be of a newer revision than resolved); empty for content
// that is not shared.
func (s *sharing) contentKey(revision string) string {
	if s == nil {
		return ""
	}
	return contentcache.Key(s.req.Job.Object.Kind, s.identity, revision, s.req.Includes, s.h.MaxFileSize)
}

// join hands the job the content another fetch has, or is fetching, and
// returns the result once the job's Fetched is published. An empty result
// and no error: the caller downloads, then calls offer, and leave in any
// case.
func (s *sharing) join(ctx, work context.Context) (string, error) {
	if s == nil {
		return "", nil
	}
	if result, err := s.reuse(ctx, work); result != "" || err != nil {
		return result, err
	}
	s.flight, s.leader = s.h.flights.join(s.key)
	if s.leader {
		return s.lead(ctx, work)
	}
	return s.follow(ctx, work)
}

// follow waits for the fetch leading the flight of the same content in
// this fetcher and hands a copy of what it staged to the packager. When
// the leader failed, or found the content cached with nothing staged, the
// cache, if it has the content now, saves the download.
func (s *sharing) follow(ctx, work context.Context) (string, error) {
	result, err := s.copyFlight(ctx, work)
	if result != "" {
		s.h.Metrics.countCombined(CombineFollowedLocal)
	}
	if result != "" || err != nil {
		return result, err
	}
	return s.reuse(ctx, work)
}

// copyFlight is follow's copy: made at the job's own staging key once
// this source's credentials proved they can read the upstream (while the
// leader downloads), after which the leader may hand its content on.
func (s *sharing) copyFlight(ctx, work context.Context) (string, error) {
	release := sync.OnceFunc(s.flight.copied)
	defer release()
	if err := s.share.ProveAccess(work); err != nil {
		return "", source.AsError(err, sourcev1.GitOperationFailedReason)
	}
	staged := s.flight.wait(work)
	if staged == nil {
		return "", nil
	}
	copied := s.copyOf(ctx, work, staged)
	if copied == nil {
		return "", nil
	}
	release()
	return s.publishCopy(ctx, copied)
}

// lead is the part of the fetch leading the flight of its content in this
// fetcher: content a flight of it staged a moment ago, or the fetch of it
// leading in another fetcher staged, is copied, and the copy handed to
// this fetcher's followers and the packager. With none, the caller
// downloads.
func (s *sharing) lead(ctx, work context.Context) (string, error) {
	copied, result, err := s.copyLanded(ctx, work)
	if copied == nil && result == "" && err == nil && s.h.Leases != nil {
		copied, result, err = s.combine(ctx, work)
	}
	if result != "" || err != nil {
		s.land(nil)
		return result, err
	}
	if copied == nil {
		return "", nil
	}
	// This fetcher's followers copy the copy.
	s.land(copied)
	return s.publishCopy(ctx, copied)
}

// copyLanded copies the content a flight of the same content staged when
// it landed a moment ago, if still there; the content cache, which knows
// the content once the packager deleted it, saves the download otherwise.
// It returns the copy, yet to be published, or the result of the reuse.
func (s *sharing) copyLanded(ctx, work context.Context) (*events.Fetched, string, error) {
	staged := s.h.flights.recent(s.key)
	if staged == nil {
		return nil, "", nil
	}
	if err := s.share.ProveAccess(work); err != nil {
		return nil, "", source.AsError(err, sourcev1.GitOperationFailedReason)
	}
	if copied := s.copyOf(ctx, work, staged); copied != nil {
		s.h.Metrics.countCombined(CombineFollowedLocal)
		return copied, "", nil
	}
	result, err := s.reuse(ctx, work)
	return nil, result, err
}

// combine takes part in the fetches of the same content in other fetcher
// replicas (see Leases). When this fetcher leads them, it keeps the lease
// and returns nothing: the caller downloads. When another fetcher led, it
// returns this job's copy of what that one staged, yet to be published; or
// the result, once published, when the content cache holds the content
// that fetcher staged and the packager took. With none of them, the caller
// downloads alone: the leases cannot be read, or the other fetcher failed
// or died.
func (s *sharing) combine(ctx, work context.Context) (*events.Fetched, string, error) {
	lease, err := s.h.Leases.Acquire(work, s.key)
	if err != nil {
		if work.Err() == nil {
			logr.FromContextOrDiscard(ctx).Error(err, "the fetches in flight in other fetchers cannot be read: fetching alone", "key", s.key)
			s.h.Metrics.countCombined(CombineBypassed)
		}
		return nil, "", nil
	}
	if lease != nil {
		s.h.Metrics.countCombined(CombineLed)
		s.lease = lease
		return nil, "", nil
	}
	// Proven before the copy, as a follower in this fetcher does.
	if err := s.share.ProveAccess(work); err != nil {
		return nil, "", source.AsError(err, sourcev1.GitOperationFailedReason)
	}
	staged, outcome := s.h.Leases.Wait(work, s.key)
	if staged == nil {
		s.h.Metrics.countCombined(outcome)
		return nil, "", nil
	}
	if copied := s.copyOf(ctx, work, staged); copied != nil {
		s.h.Metrics.countCombined(CombineFollowedRemote)
		return copied, "", nil
	}
	// The packager took the staged content, after it recorded it in the
	// content cache.
	result, err := s.reuse(ctx, work)
	if result != "" {
		s.h.Metrics.countCombined(CombineFollowedRemote)
	}
	return nil, result, err
}

// reuse looks the content up in the content cache and, on a hit, hands
// the cached artifact to the packager instead of downloading, and returns
// the result. A cache that cannot be read is a miss: the content is
// downloaded. With verify, the cached artifact must match its digest.
func (s *sharing) reuse(ctx, work context.Context) (string, error) {
	log := logr.FromContextOrDiscard(ctx)
	idx, err := contentcache.Lookup(work, s.h.Storage, s.key, s.revision)
	if err != nil {
		if work.Err() == nil {
			log.Error(err, "content cache lookup failed: fetching", "key", s.key)
		}
		return "", nil
	}
	if idx == nil {
		return "", nil
	}
	if s.verify {
		if err := storage.Verify(work, s.h.Storage, idx.Artifact, idx.Digest); err != nil {
			log.Info("cached artifact is not intact: fetching", "key", s.key, "error", err.Error())
			return "", nil
		}
	}
	// The cached bytes are handed over only to a source whose own
	// credentials can read the upstream.
	if err := s.share.ProveAccess(work); err != nil {
		return "", source.AsError(err, sourcev1.GitOperationFailedReason)
	}
	out := &events.Fetched{
		Job:      s.req.Job,
		Revision: s.revision,
		// Nothing is staged; the key lets the packager clean up what an
		// earlier attempt of the job may have staged.
		Staging:      storage.StagingKey(s.req.Job.ID),
		ArtifactName: idx.ArtifactName,
		Metadata:     idx.Metadata,
		EventMessage: idx.EventMessage,
		Notices:      s.notices,
		Includes:     s.req.Includes,
		ContentKey:   s.key,
		Reuse:        &events.Reuse{Key: idx.Artifact, Digest: idx.Digest, Size: idx.Size},
	}
	if err := fetchjob.Hand(ctx, s.h.Publisher, out); err != nil {
		return "", err
	}
	log.Info("content reused", "revision", s.revision, "key", s.key, "artifact", idx.Artifact)
	return ResultReused, nil
}

// copyOf copies the content another fetch staged to the job's staging key
// and returns the job's Fetched for the copy; nil when the content could
// not be copied (it is gone).
func (s *sharing) copyOf(ctx, work context.Context, staged *events.Fetched) *events.Fetched {
	key := storage.StagingKey(s.req.Job.ID)
	if _, err := s.h.Storage.Copy(work, staged.Staging, key); err != nil {
		logr.FromContextOrDiscard(ctx).Info("the content another fetch staged could not be copied", "error", err.Error())
		return nil
	}
	out := *staged
	out.Job, out.Staging, out.Notices, out.Includes = s.req.Job, key, s.notices, s.req.Includes
	return &out
}

// publishCopy hands the copy of content another fetch staged to the
// packager.
func (s *sharing) publishCopy(ctx context.Context, out *events.Fetched) (string, error) {
	if err := fetchjob.Hand(ctx, s.h.Publisher, out); err != nil {
		return "", err
	}
	logr.FromContextOrDiscard(ctx).Info("content staged by another fetch of the same content", "revision", out.Revision, "staging", out.Staging)
	return ResultJoined, nil
}

// offer hands what the fetch staged, out, to the fetches that joined it,
// before the packager, once it has the job, deletes it: this fetcher's
// followers copy it now; the followers in other fetchers copy it, or find
// the content cache, which the packager fills before it deletes.
func (s *sharing) offer(ctx context.Context, out *events.Fetched) {
	if s == nil {
		return
	}
	s.land(out)
	if s.lease != nil {
		if err := s.lease.Land(ctx, out); err != nil {
			logr.FromContextOrDiscard(ctx).Error(err, "offering the staged content to other fetchers failed", "key", s.key)
		}
	}
}

// leave ends the fetch's part: a flight it leads and has not landed lands
// with nothing (its followers fetch themselves), and its lease is
// released.
func (s *sharing) leave(ctx context.Context) {
	if s == nil {
		return
	}
	s.land(nil)
	if s.lease != nil {
		s.lease.Release(ctx)
	}
}

// land lands the flight this fetch leads, once, with staged (nil when it
// has nothing staged), and waits until the followers have copied it.
func (s *sharing) land(staged *events.Fetched) {
	if !s.leader || s.landed {
		return
	}
	s.landed = true
	s.h.flights.land(s.key, s.flight, staged)
}
