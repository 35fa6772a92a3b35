// Package packager turns fetched content into artifacts: it handles the
// Fetched and DeleteRequested jobs of the package stream, and the
// GenerateRequested jobs that compose an ArtifactGenerator's outputs from
// stored artifacts (generate.go).
//
// Every Fetched job goes through one pipeline, whatever its content:
//
//	content in  -> the job's input writes the artifact to storage, with
//	               its digest (input: staged content canonicalised, a
//	               staged blob stored as it is, a cached artifact copied)
//	latest      -> the source's latest pointer moves to it
//	record      -> the content cache learns of it
//	announce    -> Packaged is published
//	clean up    -> the staged content goes, retention collects old artifacts
//
// Only the content-in stage differs between kinds of content (see input);
// a new kind (a Helm chart stored as it is, an OCI layer) is a new input
// that plan chooses. Each stage returns a *failure.Error in Flux's words,
// or the platform's error (the bus): the bus worker decides on retries and
// Report publishes the failure.
//
// The order makes a job idempotent: the artifact is written (atomically),
// pointed at and announced, and only then is the staged content deleted. A
// redelivered job whose staged content is gone therefore finds its
// artifact stored and announces it again (deduplicated on the bus by its
// message ID).
package packager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/tracing"
	"github.com/headwater-gitops/headwater/services/packager/internal/retention"
)

// Publisher publishes a job's result; *bus.Publisher is one.
type Publisher interface {
	Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error
}

// Packager handles the jobs of the package stream. Its Handle method is a
// bus.Handler, its Report method the matching bus.Reporter.
type Packager struct {
	store   storage.Storage
	pub     Publisher
	opts    Options
	metrics *Metrics
	// now is the clock, replaceable in tests.
	now func() time.Time
}

// New returns a Packager writing to store and publishing with pub. metrics
// may be nil.
func New(store storage.Storage, pub Publisher, opts Options, metrics *Metrics) *Packager {
	return &Packager{store: store, pub: pub, opts: opts, metrics: metrics, now: time.Now}
}

// Handle handles one job. A failed Fetched job is a *failure.Error, which
// the worker reports (Report) and settles; any other error is the
// platform's (the bus, or the storage while deleting a source).
//
// The job is a span of its own ("package"), a child of the worker's.
func (p *Packager) Handle(ctx context.Context, m *events.Message, _ bus.Delivery) (err error) {
	ctx, span := tracing.StartJob(ctx, tracer, "package", events.JobOf(m.Data))
	defer func() { tracing.End(span, err) }()
	switch data := m.Data.(type) {
	case *events.Fetched:
		return p.packageFetched(ctx, data)
	case *events.DeleteRequested:
		return p.deleteSource(ctx, data)
	case *events.GenerateRequested:
		return p.generate(ctx, data)
	}
	return fmt.Errorf("%w: the packager does not handle %q", events.ErrMalformed, m.Event.Type())
}

// Report is the worker's bus.Reporter: it publishes a failed Fetched job
// as its PackageFailed outcome. A failure that will not be retried ends
// the job, so its staged content goes once the outcome is published, as
// after a success.
func (p *Packager) Report(ctx context.Context, msg *events.Message, f *failure.Error) error {
	if gen, ok := msg.Data.(*events.GenerateRequested); ok {
		// An ArtifactGenerator's failure: nothing was staged, nothing is
		// announced but the failure; the stored outputs stay served.
		out := events.Outcome{Job: gen.Job, Revision: gen.Revision, Failure: f.Data()}
		return p.pub.Publish(ctx, events.PublishSubject(gen.Job.Object.Kind), events.TypePackageFailed, gen.Job, out)
	}
	job, ok := msg.Data.(*events.Fetched)
	if !ok {
		return fmt.Errorf("report: %T is not a Fetched job", msg.Data)
	}
	out := events.Outcome{
		Job:          job.Job,
		Revision:     job.Revision,
		Notices:      job.Notices,
		Failure:      f.Data(),
		Verification: job.Verification,
	}
	if err := p.pub.Publish(ctx, events.PublishSubject(job.Job.Object.Kind), events.TypePackageFailed, job.Job, out); err != nil {
		return err
	}
	// A job whose staging key is invalid names nothing of its own.
	if (f.Handling == failure.Final || f.Handling == failure.Stalling) && checkStagingKey(job.Staging) == nil {
		p.deleteStaging(ctx, job.Staging)
	}
	return nil
}

// DeadlineCondition is the condition a job past its deadline sets (the
// bus worker's DeadlineCondition): an ArtifactGenerator's Ready, a
// source's StorageOperationFailed.
func DeadlineCondition(m *events.Message) string {
	if _, ok := m.Data.(*events.GenerateRequested); ok {
		return meta.ReadyCondition
	}
	return sourcev1.StorageOperationFailedCondition
}

// archiveFailure is a failed step of the pipeline in Flux's words
// (GitRepositoryReconciler.reconcileArtifact): StorageOperationFailed,
// reason ArchiveOperationFailed. Storage that fails is Transient; content
// that cannot become an artifact, or a job that names what is not there,
// is Final.
func archiveFailure(h failure.Handling, format string, args ...any) *failure.Error {
	return failure.New(h, sourcev1.StorageOperationFailedCondition, sourcev1.ArchiveOperationFailedReason,
		"unable to archive artifact to storage: "+format, args...)
}

// input is the content-in stage of the pipeline: it writes a job's
// artifact to storage at key and describes it, with its digest in the
// packager's algorithm computed from the bytes written, and as storage
// described the object it stored (what the content cache copies). Its
// errors are *failure.Error, or wrap errStagingGone when the staged content
// it reads is gone.
type input interface {
	write(ctx context.Context, key string) (*meta.Artifact, storage.Info, error)
}

// errStagingGone is wrapped by an input's error when the staged content
// it reads does not exist: the pipeline then recovers the artifact an
// earlier attempt stored.
var errStagingGone = errors.New("staged content not found")

// packaging is a Fetched job on its way through the pipeline.
type packaging struct {
	*events.Fetched
	// dir is the source's storage directory, key its artifact's key.
	dir, key string
	// in writes the artifact.
	in input
	// cacheKey is the content cache entry the artifact is recorded under
	// (new content) or was copied from (reused content); "" for none.
	cacheKey string
	// reused is true when in copies a cached artifact.
	reused bool
}

// plan checks a Fetched job and chooses its input: the cached artifact it
// reuses, the staged tar the fetcher wrote, or the staged file that is the
// artifact itself. An invalid job is a Final
// failure.
func (p *Packager) plan(f *events.Fetched) (*packaging, error) {
	dir, err := sourceDir(f.Job.Object)
	if err != nil {
		return nil, archiveFailure(failure.Final, "%w", err)
	}
	key, err := artifactKey(dir, f.ArtifactName)
	if err != nil {
		return nil, archiveFailure(failure.Final, "%w", err)
	}
	if err := checkStagingKey(f.Staging); err != nil {
		return nil, archiveFailure(failure.Final, "%w", err)
	}
	j := &packaging{Fetched: f, dir: dir, key: key, cacheKey: f.ContentKey}
	switch {
	case f.Reuse != nil:
	case f.Format == events.FormatFile:
		j.in = &stagedFile{p: p, job: f}
		return j, nil
	case f.Format == events.FormatTree:
		j.in = &stagedTar{p: p, job: f}
		return j, nil
	default:
		return nil, archiveFailure(failure.Final, "unknown staged format %q", f.Format)
	}
	cacheKey, ok := contentcache.KeyOfArtifact(f.Reuse.Key)
	if !ok {
		return nil, archiveFailure(failure.Final, "invalid cached artifact key %q", f.Reuse.Key)
	}
	j.in = &cachedArtifact{p: p, reuse: f.Reuse, cacheKey: cacheKey}
	j.cacheKey, j.reused = cacheKey, true
	return j, nil
}

// packageFetched takes a Fetched job through the pipeline.
func (p *Packager) packageFetched(ctx context.Context, f *events.Fetched) error {
	j, err := p.plan(f)
	if err != nil {
		return err
	}
	artifact, info, err := j.in.write(ctx, j.key)
	switch {
	case errors.Is(err, errStagingGone):
		// The latest pointer is left alone: a newer job may have moved
		// it on since the artifact was stored.
		if artifact, info, err = p.stored(ctx, j); err != nil {
			return err
		}
		p.record(ctx, j, artifact, info)
	case err != nil:
		return err
	default:
		// The pointer and the content cache are independent objects:
		// both are written at once (on S3, their round trips overlap).
		// Recorded before it is announced, so that whoever learns of the
		// artifact can reuse it.
		var wg sync.WaitGroup
		wg.Go(func() { p.record(ctx, j, artifact, info) })
		err := p.setLatest(ctx, path.Join(j.dir, storage.LatestName), j.key, j.Job)
		wg.Wait()
		if err != nil {
			return archiveFailure(failure.Transient, "update latest pointer: %w", err)
		}
		p.observe(j, artifact)
	}
	return p.announce(ctx, j, artifact)
}

// setLatest moves the latest pointer key to target for job, unless a job
// requested after it set the pointer (storage.ErrSuperseded): a job
// finished late, its packager cut off from the bus while the job was done
// again elsewhere and newer ones stored, must not move status.url back to
// an older revision, nor let retention, which keeps the pointer's target,
// collect the artifact the source's status names. The late job is
// otherwise done as any other: its artifact stays stored (retention
// collects it in time) and its outcome is published, for the watcher to
// drop as late.
func (p *Packager) setLatest(ctx context.Context, key, target string, job events.Job) error {
	err := p.store.SetLatest(ctx, key, target, job.RequestedAt)
	if !errors.Is(err, storage.ErrSuperseded) {
		return err
	}
	p.superseded(ctx, key, job, err)
	return nil
}

// superseded logs and counts a move or removal of the latest pointer key
// that a newer job's left undone (err wraps storage.ErrSuperseded).
func (p *Packager) superseded(ctx context.Context, key string, job events.Job, err error) {
	logr.FromContextOrDiscard(ctx).Info("latest pointer left to a newer job", "pointer", key, "requestedat", job.RequestedAt, "reason", err.Error())
	if p.metrics != nil {
		p.metrics.LatestSuperseded.Inc()
	}
}

// stored describes the artifact an earlier attempt of j stored, for a job
// redelivered after its staged content was deleted: that attempt stored,
// pointed at and announced the artifact before deleting it.
func (p *Packager) stored(ctx context.Context, j *packaging) (*meta.Artifact, storage.Info, error) {
	artifact, info, err := p.describe(ctx, j.key)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return nil, info, archiveFailure(failure.Final, "staged content %s is gone and artifact %s is not stored", j.Staging, j.key)
	case err != nil:
		return nil, info, archiveFailure(failure.Transient, "%w", err)
	}
	logr.FromContextOrDiscard(ctx).Info("staged content gone, artifact already stored", "artifact", j.key)
	return artifact, info, nil
}

// describe describes the artifact stored at key, computing its digest from
// the stored bytes, and returns what storage said of the object it read.
func (p *Packager) describe(ctx context.Context, key string) (*meta.Artifact, storage.Info, error) {
	obj, err := p.store.Open(ctx, key)
	if err != nil {
		return nil, storage.Info{}, err
	}
	defer obj.Close()
	digester := p.opts.Algorithm().Digester()
	n, err := io.Copy(digester.Hash(), obj)
	if err != nil {
		return nil, storage.Info{}, fmt.Errorf("read artifact %s: %w", key, err)
	}
	return &meta.Artifact{
		Path:           key,
		Digest:         digester.Digest().String(),
		Size:           &n,
		LastUpdateTime: metav1.NewTime(obj.Info().ModTime),
	}, obj.Info(), nil
}

func (p *Packager) observe(j *packaging, artifact *meta.Artifact) {
	if p.metrics == nil {
		return
	}
	p.metrics.ArtifactBytes.Observe(float64(*artifact.Size))
	if j.reused {
		p.metrics.Reused.Inc()
	}
}

// record keeps the content cache up to date with the artifact stored for
// j; the packager is the cache's one writer. New content is recorded under
// its content key; reused content refreshes the index of the entry it was
// copied from, so that the janitor keeps an entry in use. A failure is
// only logged: the cache is an optimisation.
func (p *Packager) record(ctx context.Context, j *packaging, artifact *meta.Artifact, stored storage.Info) {
	if j.cacheKey == "" || p.opts.ContentCacheTTL <= 0 {
		return
	}
	log := logr.FromContextOrDiscard(ctx)
	idx := contentcache.Index{
		Key:          j.cacheKey,
		Digest:       artifact.Digest,
		Algorithm:    p.opts.Algorithm().String(),
		Size:         *artifact.Size,
		Revision:     j.Revision,
		ArtifactName: j.ArtifactName,
		EventMessage: j.EventMessage,
		Metadata:     j.Metadata,
	}
	if j.reused {
		if err := contentcache.Refresh(ctx, p.store, idx, p.now()); err != nil {
			log.Error(err, "refreshing the content cache entry failed", "key", j.cacheKey)
		}
		return
	}
	if err := contentcache.Record(ctx, p.store, stored, idx); err != nil {
		log.Error(err, "recording the artifact in the content cache failed", "key", j.cacheKey)
		return
	}
	if p.metrics != nil {
		p.metrics.Recorded.Inc()
	}
	log.V(1).Info("artifact recorded in the content cache", "key", j.cacheKey)
}

// announce publishes Packaged for the artifact stored for j, then cleans
// up after the job: its staged content (an earlier attempt of a reusing
// job may have staged some too) and the source's old artifacts. Its error
// is the bus's.
func (p *Packager) announce(ctx context.Context, j *packaging, artifact *meta.Artifact) error {
	artifact.Revision = j.Revision
	artifact.Metadata = j.Metadata
	out := events.Outcome{
		Job:               j.Job,
		Revision:          j.Revision,
		Artifact:          artifact,
		EventMessage:      j.EventMessage,
		Notices:           j.Notices,
		IncludedArtifacts: includedArtifacts(j.Includes),
		Verification:      j.Verification,
	}
	if err := p.pub.Publish(ctx, events.PublishSubject(j.Job.Object.Kind), events.TypePackaged, j.Job, out); err != nil {
		return err
	}
	log := logr.FromContextOrDiscard(ctx)
	if j.reused {
		log = log.WithValues("reused", j.Reuse.Key)
	}
	log.Info("artifact stored", "artifact", j.key, "digest", artifact.Digest, "size", *artifact.Size, "revision", j.Revision)
	// Independent of each other: at once (on S3, overlapping round trips).
	var wg sync.WaitGroup
	wg.Go(func() { p.deleteStaging(ctx, j.Staging) })
	p.collect(ctx, j.dir, j.key)
	wg.Wait()
	return nil
}

// deleteStaging removes a job's staged content; a failure is only logged, as
// the staging janitor removes what is left behind.
func (p *Packager) deleteStaging(ctx context.Context, key string) {
	if err := p.store.Delete(ctx, key); err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "deleting staged content failed", "staging", key)
	}
}

// collect applies retention to a source directory; errors are logged.
func (p *Packager) collect(ctx context.Context, dir, current string) {
	log := logr.FromContextOrDiscard(ctx)
	deleted, err := retention.Collect(ctx, p.store, dir, current, p.opts.Retention(), p.now())
	if p.metrics != nil {
		p.metrics.GCDeleted.Add(float64(len(deleted)))
	}
	if len(deleted) > 0 {
		log.Info("garbage collected artifacts", "dir", dir, "deleted", deleted)
	}
	if err != nil {
		log.Error(err, "garbage collection failed", "dir", dir)
	}
}

// deleteSource removes every artifact of a deleted source and its latest
// pointer, then publishes Deleted. Storage failures are retried.
func (p *Packager) deleteSource(ctx context.Context, r *events.DeleteRequested) error {
	dir, err := sourceDir(r.Job.Object)
	if err != nil {
		return fmt.Errorf("%w: %w", events.ErrMalformed, err)
	}
	// The pointer goes first, so it never points at a deleted artifact.
	if err := p.store.Delete(ctx, path.Join(dir, storage.LatestName)); err != nil {
		return err
	}
	objs, err := p.store.List(ctx, dir)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := p.store.Delete(ctx, o.Key); err != nil {
			return err
		}
	}
	if err := p.pub.Publish(ctx, events.PublishSubject(r.Job.Object.Kind), events.TypeDeleted, r.Job, events.Outcome{Job: r.Job}); err != nil {
		return err
	}
	logr.FromContextOrDiscard(ctx).Info("artifacts deleted", "dir", dir, "count", len(objs))
	return nil
}

// sourceDir returns the storage directory of obj, checking that kind,
// namespace and name are one plain path segment each, so a job can never
// reach another source's directory or the internal ones.
func sourceDir(obj events.ObjectRef) (string, error) {
	for _, s := range []string{obj.Kind, obj.Namespace, obj.Name} {
		if err := checkSegment(s); err != nil {
			return "", fmt.Errorf("invalid object %s/%s/%s: %w", obj.Kind, obj.Namespace, obj.Name, err)
		}
	}
	return storage.SourceDir(obj.Kind, obj.Namespace, obj.Name), nil
}

// artifactKey returns the key of the artifact file name in dir.
func artifactKey(dir, name string) (string, error) {
	if err := checkSegment(name); err != nil {
		return "", fmt.Errorf("invalid artifact name: %w", err)
	}
	if name == storage.LatestName {
		return "", fmt.Errorf("invalid artifact name: %q is the latest pointer", name)
	}
	return path.Join(dir, name), nil
}

// checkStagingKey checks that key is an object of the staging directory, so
// a job can neither read nor delete anything else.
func checkStagingKey(key string) error {
	dir, name := path.Split(key)
	if dir != storage.StagingDir+"/" || checkSegment(name) != nil {
		return fmt.Errorf("invalid staging key %q", key)
	}
	return nil
}

// checkSegment accepts a non-empty path segment that is not hidden.
func checkSegment(s string) error {
	if s == "" || strings.HasPrefix(s, ".") || strings.ContainsAny(s, "/\\\x00") {
		return fmt.Errorf("%q is not a plain name", s)
	}
	return nil
}
