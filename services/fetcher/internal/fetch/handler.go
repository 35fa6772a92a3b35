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
	"strings"
	"time"

	"github.com/fluxcd/pkg/apis/acl"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/fetchjob"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/tracing"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/provenance"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// Notice reasons the fetcher reports besides the outcome: the bus
// contract's (events.ArtifactMissingReason, ...), named here too.
const (
	// ArtifactVerificationFailedReason: the stored artifact does not match
	// its digest and is rebuilt (Flux's Event reason).
	ArtifactVerificationFailedReason = events.ArtifactVerificationFailedReason
	// ArtifactMissingReason: the stored artifact is gone and is rebuilt.
	ArtifactMissingReason = events.ArtifactMissingReason
)

// Publisher publishes CloudEvents; *bus.Publisher is one.
type Publisher = fetchjob.Publisher

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
	// describes the same way (see storage.Verified); nil reads it every time.
	Verified *storage.Verified
}

// Handle is a bus.Handler for the fetch stream. A failed fetch is a
// *failure.Error, which the worker reports (Report) and settles; any other
// error is the platform's (the bus, the storage).
//
// The fetch is a span of its own ("fetch"), a child of the worker's.
func (h *Handler) Handle(ctx context.Context, msg *events.Message, _ bus.Delivery) (err error) {
	ctx, span := tracing.StartJob(ctx, tracer, "fetch", events.JobOf(msg.Data))
	defer func() { tracing.End(span, err) }()
	req, err := fetchjob.Requested(msg)
	if err != nil {
		return err
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
	err = refused(err)
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

// refused returns the failure of a fetch the egress policy refused as
// Stalling with Flux's reason AccessDenied, in the condition it names (its
// message, the library's words ending in the policy's, tells nothing of
// the address dialled): retrying cannot help before the spec or the
// operator's -allowed-destinations change, so the object stalls at once,
// with a Warning Event, instead of being retried as a server that is
// down. Any other err is returned as it is. Some libraries keep only the
// words of the cause (go-git's UnexpectedError), so the words count as
// well as the error chain.
func refused(err error) error {
	f := failure.As(err)
	if f == nil || (!egress.Refused(err) && !strings.Contains(f.Error(), egress.ErrRefused.Error())) {
		return err
	}
	condition := f.Condition
	if condition == "" {
		condition = sourcev1.FetchFailedCondition
	}
	return &failure.Error{Handling: failure.Stalling, Condition: condition, Reason: acl.AccessDeniedReason,
		Err: f.Err, Revision: f.Revision, Notices: f.Notices}
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
	var verification *events.Verification
	var unverified *source.Unverified
	if errors.As(f, &unverified) {
		verification = unverified.Verification
	}
	return fetchjob.Report(ctx, h.Publisher, msg, f, verification)
}

// fetch does the job and publishes its result, except a failure, which it
// returns as a *failure.Error; any other error is the platform's. Its
// steps: resolve the upstream revision, answer unchanged when the stored
// artifact holds it, share the content another fetch has or is fetching,
// otherwise download and stage it, and hand it to the packager.
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

	res, err := h.resolve(ctx, work, src, req)
	if err != nil {
		return "", err
	}
	defer closeResolved(ctx, res)
	revision := res.Revision()
	// A failure from here on happened with a new upstream revision known.
	defer func() {
		if ferr := failure.As(err); ferr != nil && ferr.Revision == "" {
			ferr.Revision = revision
		}
	}()

	notices, result, err := h.unchanged(ctx, work, req, revision)
	if result != "" || err != nil {
		return result, err
	}

	sh := h.sharing(req, res, revision, notices)
	defer sh.leave(ctx)
	if result, err := sh.join(ctx, work); result != "" || err != nil {
		return result, err
	}

	out, err := h.download(ctx, work, req, res, notices)
	if err != nil {
		return "", err
	}
	out.ContentKey = sh.contentKey(out.Revision)
	sh.offer(ctx, out)
	if err := fetchjob.Hand(ctx, h.Publisher, out); err != nil {
		return "", err
	}
	return ResultFetched, nil
}

// resolve asks src for the job's upstream revision. A failure to resolve
// carries the notice of a stored artifact that is not intact: it is
// checked whether or not the upstream answers, so a corrupt or missing
// one is reported now, not once the upstream is back.
func (h *Handler) resolve(ctx, work context.Context, src source.Source, req *events.FetchRequested) (source.Resolved, error) {
	res, err := src.Resolve(work, req)
	if err == nil {
		return res, nil
	}
	f := source.AsError(err, sourcev1.GitOperationFailedReason)
	if prev := req.Previous; prev != nil && f.Handling != failure.Waiting {
		if notice, verr := fetchjob.CheckPrevious(ctx, h.Storage, h.Verified, prev); verr == nil && notice != nil {
			if notice.Reason == events.ArtifactMissingReason {
				notice.Message = fmt.Sprintf("artifact '%s' is missing from storage: it is rebuilt once the source can be fetched", prev.Path)
			}
			f.Notices = append(f.Notices, *notice)
		}
	}
	return nil, f
}

// closeResolved removes what resolving downloaded (a Helm index), if
// anything.
func closeResolved(ctx context.Context, res source.Resolved) {
	if c, ok := res.(io.Closer); ok {
		if err := c.Close(); err != nil {
			logr.FromContextOrDiscard(ctx).Error(err, "removing resolved content")
		}
	}
}

// unchanged answers the job, and returns its result, when the upstream
// revision is the one the stored artifact holds and the artifact is
// intact. When it is not intact, it returns the notice that says so: the
// artifact is rebuilt. Forced jobs are never unchanged.
func (h *Handler) unchanged(ctx, work context.Context, req *events.FetchRequested, revision string) ([]events.Notice, string, error) {
	prev := req.Previous
	if prev == nil || req.Force || revision == "" || revision != prev.Revision {
		return nil, "", nil
	}
	notice, err := fetchjob.CheckPrevious(work, h.Storage, h.Verified, prev)
	if err != nil {
		return nil, "", err
	}
	if notice != nil {
		logr.FromContextOrDiscard(ctx).Info("stored artifact is not usable: rebuilding", "reason", notice.Reason, "message", notice.Message)
		return []events.Notice{*notice}, "", nil
	}
	published, err := fetchjob.Unchanged(ctx, h.Publisher, req)
	switch {
	case err != nil:
		return nil, "", err
	case published:
		return nil, ResultUnchanged, nil
	}
	return nil, ResultQuiet, nil
}

// download downloads the resolved content into a temporary directory and
// stages it at the job's staging key, and returns the job's Fetched for
// the packager, notices included.
func (h *Handler) download(ctx, work context.Context, req *events.FetchRequested, res source.Resolved,
	notices []events.Notice) (*events.Fetched, error) {
	dir, remove, err := fetchjob.WorkDir(ctx, h.TempDir)
	if err != nil {
		return nil, err
	}
	defer remove()
	content, err := res.Download(work, dir)
	if err != nil {
		return nil, source.AsError(err, sourcev1.GitOperationFailedReason)
	}
	key := storage.StagingKey(req.Job.ID)
	size, err := h.stage(work, key, content)
	if err != nil {
		return nil, err
	}
	if h.Metrics != nil {
		h.Metrics.bytes.WithLabelValues(req.Job.Object.Kind).Add(float64(size))
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
	logr.FromContextOrDiscard(ctx).Info("content staged", "revision", content.Revision, "staging", key, "bytes", size)
	return out, nil
}

// stage streams the tar of content, or its file, into storage at key and
// returns its size (see fetchjob.StageTree and StageFile).
func (h *Handler) stage(ctx context.Context, key string, content *source.Content) (int64, error) {
	if content.File != "" {
		return fetchjob.StageFile(ctx, h.Storage, key, content.File)
	}
	return fetchjob.StageTree(ctx, h.Storage, key, content.Tree(), archive.TarOptions{Exclude: content.Exclude, MaxFileSize: h.MaxFileSize})
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
