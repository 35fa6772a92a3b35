// Package packager turns staged content into artifacts: it handles the
// Fetched and DeleteRequested jobs of the package stream.
//
// A Fetched job is done in an order that makes it idempotent: write the
// artifact (atomically), point latest at it, publish Packaged, and only then
// delete the staged content and collect garbage. A redelivered job whose
// staged content is gone therefore finds its artifact stored and publishes
// Packaged again (deduplicated on the bus by its message ID).
//
// A Fetched job with includes (a GitRepository's spec.include) merges the
// included artifacts into the staged content as it is canonicalised; see
// include.go.
package packager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	"github.com/opencontainers/go-digest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/services/packager/internal/retention"
)

// Publisher publishes a job's result; *bus.Publisher is one.
type Publisher interface {
	Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error
}

// Packager handles the jobs of the package stream. Its Handle method is a
// bus.Handler.
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

// Handle handles one job. See bus.Handler for what its error means.
func (p *Packager) Handle(ctx context.Context, m *events.Message, d bus.Delivery) error {
	switch data := m.Data.(type) {
	case *events.Fetched:
		return p.packageFetched(ctx, data, d)
	case *events.DeleteRequested:
		return p.deleteSource(ctx, data, d)
	}
	return fmt.Errorf("%w: the packager does not handle %q", events.ErrMalformed, m.Event.Type())
}

// contentError says the staged content itself cannot be archived (an unsafe
// path, a file over the limit, a corrupt tar): retrying cannot help.
type contentError struct{ err error }

func (e *contentError) Error() string { return e.err.Error() }
func (e *contentError) Unwrap() error { return e.err }

// packageFetched stores the artifact of a Fetched job and publishes the
// outcome.
func (p *Packager) packageFetched(ctx context.Context, f *events.Fetched, d bus.Delivery) error {
	log := logr.FromContextOrDiscard(ctx)
	dir, err := sourceDir(f.Job.Object)
	if err != nil {
		return p.fail(ctx, f, err)
	}
	key, err := artifactKey(dir, f.ArtifactName)
	if err != nil {
		return p.fail(ctx, f, err)
	}
	if err := checkStagingKey(f.Staging); err != nil {
		return p.fail(ctx, f, err)
	}
	if f.Reuse != nil {
		return p.packageReused(ctx, f, d, dir, key)
	}

	artifact, err := p.write(ctx, f, key)
	var content *contentError
	var ferr *failure.Error
	switch {
	case errors.Is(err, errStagingGone):
		// Redelivered after the staged content was deleted: the artifact
		// was stored, pointed at and announced before that, so announce it
		// again (the bus drops the duplicate). The latest pointer is left
		// alone: a newer job may have moved it on since.
		artifact, err = p.recover(ctx, key)
		if errors.Is(err, storage.ErrNotFound) {
			return p.fail(ctx, f, fmt.Errorf("staged content %s is gone and artifact %s is not stored", f.Staging, key))
		}
		if err != nil {
			return p.retryOrFail(ctx, f, d, err)
		}
		log.Info("staged content gone, artifact already stored", "artifact", key)
	case errors.As(err, &content), errors.As(err, &ferr):
		if err := p.publishFailure(ctx, f, err); err != nil {
			return err
		}
		p.deleteStaging(ctx, f.Staging)
		return &failure.Error{Handling: failure.Final, Err: fmt.Errorf("package failed: %w", err)}
	case err != nil:
		return p.retryOrFail(ctx, f, d, err)
	default:
		if err := p.store.SetLatest(ctx, path.Join(dir, storage.LatestName), key); err != nil {
			return p.retryOrFail(ctx, f, d, fmt.Errorf("update latest pointer: %w", err))
		}
		if p.metrics != nil {
			p.metrics.ArtifactBytes.Observe(float64(*artifact.Size))
		}
	}
	artifact.Revision = f.Revision
	out := events.Outcome{
		Job:               f.Job,
		Revision:          f.Revision,
		Artifact:          artifact,
		EventMessage:      f.EventMessage,
		Notices:           f.Notices,
		IncludedArtifacts: includedArtifacts(f.Includes),
		Verification:      f.Verification,
	}
	// Recorded before it is announced, so that whoever learns of the
	// artifact can reuse it.
	p.record(ctx, f, key, artifact)
	if err := p.pub.Publish(ctx, events.PublishSubject(f.Job.Object.Kind), events.TypePackaged, f.Job, out); err != nil {
		return err
	}
	log.Info("artifact stored", "artifact", key, "digest", artifact.Digest, "size", *artifact.Size, "revision", f.Revision)
	p.deleteStaging(ctx, f.Staging)
	p.collect(ctx, dir, key)
	return nil
}

// packageReused stores the artifact of a Fetched job that reuses a cached
// artifact: it copies the cached artifact to key (no bytes move through the
// packager on a directory or S3 storage), checks the copy's size and
// digest against the record, and then goes on as for fetched content. A
// cached artifact that vanished (the janitor removed it after the fetcher
// looked) fails the job without stalling, so the next reconcile fetches;
// one that does not match its record is removed from the cache likewise.
func (p *Packager) packageReused(ctx context.Context, f *events.Fetched, d bus.Delivery, dir, key string) error {
	log := logr.FromContextOrDiscard(ctx)
	cacheKey, ok := contentcache.KeyOfArtifact(f.Reuse.Key)
	if !ok {
		return p.fail(ctx, f, fmt.Errorf("invalid cached artifact key %q", f.Reuse.Key))
	}
	artifact, err := p.copyReused(ctx, f.Reuse, key)
	var mismatch *reuseMismatchError
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return p.fail(ctx, f, fmt.Errorf("cached artifact %s is gone: %w", f.Reuse.Key, err))
	case errors.As(err, &mismatch):
		if ferr := contentcache.Forget(ctx, p.store, cacheKey); ferr != nil {
			log.Error(ferr, "removing a broken content cache entry failed", "key", cacheKey)
		}
		return p.fail(ctx, f, err)
	case err != nil:
		return p.retryOrFail(ctx, f, d, err)
	}
	if err := p.store.SetLatest(ctx, path.Join(dir, storage.LatestName), key); err != nil {
		return p.retryOrFail(ctx, f, d, fmt.Errorf("update latest pointer: %w", err))
	}
	if p.metrics != nil {
		p.metrics.ArtifactBytes.Observe(float64(*artifact.Size))
		p.metrics.Reused.Inc()
	}
	artifact.Revision = f.Revision
	out := events.Outcome{
		Job:               f.Job,
		Revision:          f.Revision,
		Artifact:          artifact,
		EventMessage:      f.EventMessage,
		Notices:           f.Notices,
		IncludedArtifacts: includedArtifacts(f.Includes),
		Verification:      f.Verification,
	}
	if err := p.pub.Publish(ctx, events.PublishSubject(f.Job.Object.Kind), events.TypePackaged, f.Job, out); err != nil {
		return err
	}
	log.Info("artifact stored", "artifact", key, "digest", artifact.Digest, "size", *artifact.Size, "revision", f.Revision,
		"reused", f.Reuse.Key)
	// An earlier attempt of the job may have staged content.
	p.deleteStaging(ctx, f.Staging)
	p.collect(ctx, dir, key)
	return nil
}

// reuseMismatchError says a cached artifact is not what its record says.
type reuseMismatchError struct{ msg string }

func (e *reuseMismatchError) Error() string { return e.msg }

// copyReused copies the cached artifact r names to key and describes the
// copy, with its digest computed from the stored bytes (in the packager's
// algorithm) and checked against the record.
func (p *Packager) copyReused(ctx context.Context, r *events.Reuse, key string) (*meta.Artifact, error) {
	// Check the size first, so a stale record never replaces key.
	info, err := p.store.Stat(ctx, r.Key)
	if err != nil {
		return nil, err
	}
	if info.Size != r.Size {
		return nil, &reuseMismatchError{fmt.Sprintf("cached artifact %s is %d bytes, recorded as %d", r.Key, info.Size, r.Size)}
	}
	if _, err := p.store.Copy(ctx, r.Key, key); err != nil {
		return nil, fmt.Errorf("copy cached artifact: %w", err)
	}
	artifact, err := p.recover(ctx, key)
	if err != nil {
		return nil, err
	}
	recorded, err := digest.Parse(r.Digest)
	switch {
	case *artifact.Size != r.Size:
		return nil, &reuseMismatchError{fmt.Sprintf("copy of cached artifact %s is %d bytes, recorded as %d", r.Key, *artifact.Size, r.Size)}
	case err != nil:
		return nil, &reuseMismatchError{fmt.Sprintf("cached artifact %s has an invalid digest %q", r.Key, r.Digest)}
	case recorded.Algorithm() == p.opts.Algorithm() && recorded.String() != artifact.Digest:
		return nil, &reuseMismatchError{fmt.Sprintf("cached artifact %s does not match its digest '%s'", r.Key, r.Digest)}
	}
	artifact.LastUpdateTime = metav1.NewTime(p.now())
	return artifact, nil
}

// record adds the artifact just stored at key for f to the content cache
// under f's content key, so that sources with the same content reuse it.
// A failure is only logged: the cache is an optimisation.
func (p *Packager) record(ctx context.Context, f *events.Fetched, key string, artifact *meta.Artifact) {
	if f.ContentKey == "" || p.opts.ContentCacheTTL <= 0 {
		return
	}
	log := logr.FromContextOrDiscard(ctx)
	idx := contentcache.Index{
		Key:          f.ContentKey,
		Digest:       artifact.Digest,
		Algorithm:    p.opts.Algorithm().String(),
		Size:         *artifact.Size,
		Revision:     f.Revision,
		ArtifactName: f.ArtifactName,
		EventMessage: f.EventMessage,
	}
	if err := contentcache.Record(ctx, p.store, key, idx); err != nil {
		log.Error(err, "recording the artifact in the content cache failed", "key", f.ContentKey)
		return
	}
	if p.metrics != nil {
		p.metrics.Recorded.Inc()
	}
	log.V(1).Info("artifact recorded in the content cache", "key", f.ContentKey)
}

// errStagingGone is wrapped by write's error when the staged content does
// not exist.
var errStagingGone = errors.New("staged content not found")

// write canonicalises the staged tar of f, merged with the artifacts f
// includes, into the artifact at key, streaming from one to the other
// through pipes. A missing staged object wraps errStagingGone; content
// that cannot be archived is a *contentError; an include that is invalid,
// unavailable or cannot be copied is an *events.Failure; anything else is a
// storage failure worth retrying.
func (p *Packager) write(ctx context.Context, f *events.Fetched, key string) (*meta.Artifact, error) {
	if err := checkIncludes(f.Job.Object, f.Includes); err != nil {
		return nil, err
	}
	obj, err := p.store.Open(ctx, f.Staging)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, fmt.Errorf("%w: %w", errStagingGone, err)
	}
	if err != nil {
		return nil, fmt.Errorf("open staged content: %w", err)
	}
	defer obj.Close()

	src := &recordingReader{r: obj}
	var in io.Reader = src
	var m *merger
	if len(f.Includes) > 0 {
		if m, err = p.openIncludes(ctx, f.Includes); err != nil {
			return nil, err
		}
		defer m.close()
		in = m.start(src)
		logr.FromContextOrDiscard(ctx).V(1).Info("merging includes", "includes", describeIncludes(f.Includes))
	}
	pr, pw := io.Pipe()
	dst := &recordingWriter{w: pw}
	type canonical struct {
		res archive.Result
		err error
	}
	done := make(chan canonical, 1)
	go func() {
		res, err := archive.Canonicalize(dst, in, archive.CanonicalOptions{
			Algorithm:   p.opts.Algorithm(),
			MaxFileSize: p.opts.MaxFileSize,
		})
		pw.CloseWithError(err) // nil: the reader sees EOF
		done <- canonical{res, err}
	}()
	info, putErr := p.store.Put(ctx, key, pr)
	// Unblock the writer if Put stopped reading early.
	pr.CloseWithError(errPutStopped)
	c := <-done
	var mergeErr, includeReadErr error
	if m != nil {
		mergeErr = m.wait()
		includeReadErr = m.storageErr()
	}

	switch {
	case src.err != nil:
		return nil, fmt.Errorf("read staged content: %w", src.err)
	case includeReadErr != nil:
		return nil, includeReadErr
	case mergeErr != nil:
		return nil, m.failure(mergeErr)
	case c.err != nil && dst.err == nil:
		// Canonicalize failed on its own, not because Put stopped.
		return nil, &contentError{err: c.err}
	case putErr != nil:
		return nil, fmt.Errorf("store artifact: %w", putErr)
	case c.err != nil:
		return nil, c.err
	case info.Size != c.res.Size:
		return nil, fmt.Errorf("store artifact %s: wrote %d bytes, stored %d", key, c.res.Size, info.Size)
	}
	size := c.res.Size
	return &meta.Artifact{
		Path:           key,
		Digest:         c.res.Digest.String(),
		Size:           &size,
		LastUpdateTime: metav1.NewTime(p.now()),
	}, nil
}

var errPutStopped = errors.New("artifact write stopped")

// recover describes the artifact already stored at key, computing its
// digest from the stored bytes.
func (p *Packager) recover(ctx context.Context, key string) (*meta.Artifact, error) {
	obj, err := p.store.Open(ctx, key)
	if err != nil {
		return nil, err
	}
	defer obj.Close()
	digester := p.opts.Algorithm().Digester()
	n, err := io.Copy(digester.Hash(), obj)
	if err != nil {
		return nil, fmt.Errorf("read artifact %s: %w", key, err)
	}
	return &meta.Artifact{
		Path:           key,
		Digest:         digester.Digest().String(),
		Size:           &n,
		LastUpdateTime: metav1.NewTime(obj.Info().ModTime),
	}, nil
}

// retryOrFail returns a storage failure for a retry, or, on the last
// attempt, publishes it and terminates the job.
func (p *Packager) retryOrFail(ctx context.Context, f *events.Fetched, d bus.Delivery, err error) error {
	if !d.Last {
		return err
	}
	return p.fail(ctx, f, err)
}

// fail publishes PackageFailed for f and returns a terminal error; when the
// publish itself fails it returns that error, so the job is retried.
func (p *Packager) fail(ctx context.Context, f *events.Fetched, cause error) error {
	if err := p.publishFailure(ctx, f, cause); err != nil {
		return err
	}
	return &failure.Error{Handling: failure.Final, Err: fmt.Errorf("package failed: %w", cause)}
}

// publishFailure publishes PackageFailed for f: cause itself when it is an
// *events.Failure, otherwise a StorageOperationFailed failure with cause
// as its message.
func (p *Packager) publishFailure(ctx context.Context, f *events.Fetched, cause error) error {
	ferr := failure.As(cause)
	if ferr == nil {
		// Flux's words (GitRepositoryReconciler.reconcileArtifact).
		ferr = failure.New(failure.Transient, sourcev1.StorageOperationFailedCondition, sourcev1.ArchiveOperationFailedReason,
			"unable to archive artifact to storage: %w", cause)
	}
	out := events.Outcome{
		Job:          f.Job,
		Revision:     f.Revision,
		Notices:      f.Notices,
		Failure:      ferr.Data(),
		Verification: f.Verification,
	}
	return p.pub.Publish(ctx, events.PublishSubject(f.Job.Object.Kind), events.TypePackageFailed, f.Job, out)
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
func (p *Packager) deleteSource(ctx context.Context, r *events.DeleteRequested, _ bus.Delivery) error {
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

// recordingReader remembers the first error of its reader other than EOF.
type recordingReader struct {
	r   io.Reader
	err error
}

func (r *recordingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF && r.err == nil {
		r.err = err
	}
	return n, err
}

// recordingWriter remembers the first error of its writer.
type recordingWriter struct {
	w   io.Writer
	err error
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	if err != nil && w.err == nil {
		w.err = err
	}
	return n, err
}
