// Package sourcekit is what a plug-in source kind's fetcher is written
// with (docs/writing-a-source-kind.md): the author gives a Fetch function
// for one kind, and the kit does the rest as Headwater's built-in fetchers
// do. It connects to the bus as the kind's own identity
// (events.PluginIdentity), takes that kind's jobs only, checks that the
// stored artifact is intact before offering it as Previous, stages what
// Fetch downloaded (a tree, archived, or one file) in the shared storage,
// and answers with the same events the built-in fetchers publish
// (Fetched, FetchUnchanged, FetchFailed), the sealed job carried
// unchanged. The watcher, packager and artifact-server do the rest.
package sourcekit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// Request is one fetch job of the kind, as Fetch sees it.
type Request struct {
	// Namespace and Name of the object: Secrets it names are in
	// Namespace.
	Namespace, Name string
	// Spec is the object's spec, as JSON.
	Spec json.RawMessage
	// Previous is the artifact stored for the object, nil when there is
	// none, when it is not intact in storage, or when the spec changed
	// since it was made. Fetch may answer Unchanged only when it is set.
	Previous *meta.Artifact
	// Dir is an empty directory for Fetch's downloads, removed after
	// the job.
	Dir string
	// Secrets reads the Secrets the spec names (nil without a cluster).
	Secrets client.Reader
}

// Result is what Fetch found.
type Result struct {
	// Revision is the upstream revision, in Flux's formats where one fits
	// ("sha256:<hex>", "etag:<value>"). The same revision as Previous's
	// means the content did not change.
	Revision string
	// Unchanged says the upstream has not changed since Previous (a 304
	// to a conditional request): nothing was downloaded.
	Unchanged bool
	// Dir, when set, is a directory whose tree becomes the artifact (a
	// canonical tar.gz); File, when set, a file stored as it is.
	// Exactly one is set unless Unchanged.
	Dir, File string
	// ArtifactName is the artifact's file name; default: the revision's
	// hash, with ".tar.gz" for a Dir and File's extension for a File.
	ArtifactName string
	// Message is the NewArtifact Event's message; default:
	// "stored artifact for revision '<revision>'".
	Message string
	// Metadata is recorded as the artifact's metadata (empty values are
	// left out), and is Previous.Metadata on the next check: where a kind
	// keeps what its conditional requests are made from (an ETag).
	Metadata map[string]string
}

// FetchFunc fetches one object of the kind. Its errors become the
// object's FetchFailed condition and a Warning Event: make them with
// Stalled (retrying cannot help until the spec changes), Final (the next
// interval tries again) or Transient (retried with a backoff); any other
// error is a Transient one with reason FetchFailedReason. Messages must
// not hold credentials.
type FetchFunc func(ctx context.Context, req *Request) (*Result, error)

// Stalled is a failure retrying cannot help until the spec or a Secret
// changes (an invalid URL, a missing Secret): reason is a Flux reason
// (sourcev1.URLInvalidReason, ...) or the kind's own.
func Stalled(reason, format string, args ...any) error {
	return failure.New(failure.Stalling, sourcev1.FetchFailedCondition, reason, format, args...)
}

// Transient is a failure that may pass by itself (a timeout, a 5xx): the
// job is retried with a backoff, then the source on the watcher's.
func Transient(reason, format string, args ...any) error {
	return failure.New(failure.Transient, sourcev1.FetchFailedCondition, reason, format, args...)
}

// Final is a failure the same job will meet again (a 404, content that
// breaks the kind's rules): the job ends, the next interval tries again.
func Final(reason, format string, args ...any) error {
	return failure.New(failure.Final, sourcev1.FetchFailedCondition, reason, format, args...)
}

// handler handles the fetch jobs of one kind.
type handler struct {
	kind    string
	fetch   FetchFunc
	store   storage.Storage
	pub     *bus.Publisher
	secrets client.Reader
	workDir string
	timeout time.Duration
	maxSize int64
}

// Reasons of the failures the kit reports itself.
const (
	// UnsupportedKindReason: a job that is not of the fetcher's kind or
	// carries no plug-in spec.
	UnsupportedKindReason = "UnsupportedKind"
	// FetchFailedReason: Fetch returned an error that is no failure of
	// the kit's constructors.
	FetchFailedReason = "FetchFailed"
	// InvalidResultReason: Fetch returned a Result the kit cannot use (no
	// revision, neither or both of Dir and File, unchanged without a
	// stored artifact).
	InvalidResultReason = "InvalidFetchResult"
	// ArtifactMissingReason and ArtifactVerificationFailedReason are the
	// Warning notices of a stored artifact that is gone or corrupt, and
	// is rebuilt.
	ArtifactMissingReason            = "ArtifactMissing"
	ArtifactVerificationFailedReason = "ArtifactVerificationFailed"
)

// handle is the bus.Handler of the kind's fetch jobs.
func (h *handler) handle(ctx context.Context, msg *events.Message, _ bus.Delivery) error {
	req, ok := msg.Data.(*events.FetchRequested)
	if !ok {
		return fmt.Errorf("%w: unexpected %s on the fetch stream", events.ErrMalformed, msg.Event.Type())
	}
	if req.Plugin == nil || !strings.EqualFold(req.Plugin.Kind, h.kind) || !strings.EqualFold(req.Job.Object.Kind, h.kind) {
		return Stalled(UnsupportedKindReason, "this fetcher fetches sources of kind '%s' only, not '%s'", h.kind, req.Job.Object.Kind)
	}
	log := logr.FromContextOrDiscard(ctx)
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()

	r := &Request{Namespace: req.Job.Object.Namespace, Name: req.Job.Object.Name, Spec: req.Plugin.Spec, Secrets: h.secrets}
	var notices []events.Notice
	if prev := req.Previous; prev != nil && !req.Force {
		err := storage.Verify(ctx, h.store, prev.Path, prev.Digest)
		switch {
		case err != nil && ctx.Err() != nil:
			return Transient(sourcev1.StatOperationFailedReason, "checking the stored artifact: %s", ctx.Err().Error())
		case errors.Is(err, storage.ErrNotFound), errors.Is(err, storage.ErrInvalidKey):
			notices = append(notices, events.Notice{Warning: true, Reason: ArtifactMissingReason,
				Message: fmt.Sprintf("artifact '%s' is missing from storage: rebuilding", prev.Path)})
		case err != nil:
			notices = append(notices, events.Notice{Warning: true, Reason: ArtifactVerificationFailedReason,
				Message: fmt.Sprintf("failed to verify integrity of artifact '%s': rebuilding", prev.Path)})
		default:
			r.Previous = prev
		}
	}
	dir, err := os.MkdirTemp(h.workDir, "fetch-")
	if err != nil {
		return failure.New(failure.Transient, sourcev1.StorageOperationFailedCondition, sourcev1.DirCreationFailedReason,
			"failed to create temporary working directory: %w", err)
	}
	defer os.RemoveAll(dir)
	r.Dir = dir

	res, err := h.fetch(ctx, r)
	if err != nil {
		if failure.As(err) == nil {
			err = failure.Wrap(err, sourcev1.FetchFailedCondition, FetchFailedReason)
		}
		return err
	}
	if res == nil || res.Revision == "" && !res.Unchanged {
		return Final(InvalidResultReason, "the fetcher of kind '%s' returned no revision", h.kind)
	}
	if r.Previous != nil && (res.Unchanged || res.Revision == r.Previous.Revision) {
		if req.Quiet {
			log.V(1).Info("revision unchanged; steady source, nothing published", "revision", r.Previous.Revision)
			return nil
		}
		out := &events.Outcome{Job: req.Job, Revision: r.Previous.Revision, Artifact: r.Previous}
		log.V(1).Info("revision unchanged", "revision", r.Previous.Revision)
		return h.pub.Publish(ctx, events.PublishSubject(h.kind), events.TypeFetchUnchanged, req.Job, out)
	}
	if res.Unchanged {
		return Final(InvalidResultReason, "the fetcher of kind '%s' answered unchanged without a stored artifact", h.kind)
	}
	return h.stage(ctx, req, res, notices)
}

// stage writes the result's content to the job's staging key and publishes
// Fetched for the packager.
func (h *handler) stage(ctx context.Context, req *events.FetchRequested, res *Result, notices []events.Notice) error {
	key := storage.StagingKey(req.Job.ID)
	out := &events.Fetched{Job: req.Job, Revision: res.Revision, Staging: key, ArtifactName: res.ArtifactName,
		EventMessage: res.Message, Notices: notices}
	for k, v := range res.Metadata {
		if v != "" {
			if out.Metadata == nil {
				out.Metadata = map[string]string{}
			}
			out.Metadata[k] = v
		}
	}
	sum := sha256.Sum256([]byte(res.Revision))
	name := hex.EncodeToString(sum[:8])
	var size int64
	var err error
	switch {
	case res.File != "" && res.Dir == "":
		out.Format = events.FormatFile
		if out.ArtifactName == "" {
			out.ArtifactName = name + path.Ext(res.File)
		}
		size, err = h.putFile(ctx, key, res.File)
	case res.Dir != "" && res.File == "":
		if out.ArtifactName == "" {
			out.ArtifactName = name + ".tar.gz"
		}
		size, err = h.putTree(ctx, key, res.Dir)
	default:
		return Final(InvalidResultReason, "the fetcher of kind '%s' must stage a directory or a file", h.kind)
	}
	if err != nil {
		return err
	}
	if out.EventMessage == "" {
		out.EventMessage = fmt.Sprintf("stored artifact for revision '%s'", res.Revision)
	}
	if err := h.pub.Publish(ctx, events.PackageSubject(h.kind), events.TypeFetched, req.Job, out); err != nil {
		return err
	}
	logr.FromContextOrDiscard(ctx).Info("content staged", "revision", res.Revision, "staging", key, "bytes", size)
	return nil
}

// putTree archives dir into storage at key.
func (h *handler) putTree(ctx context.Context, key, dir string) (int64, error) {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := archive.WriteTar(ctx, pw, dir, archive.TarOptions{MaxFileSize: h.maxSize})
		pw.CloseWithError(err)
		done <- err
	}()
	info, err := h.store.Put(ctx, key, pr)
	pr.CloseWithError(errStagingStopped)
	if werr := <-done; werr != nil && !errors.Is(werr, errStagingStopped) {
		handling := failure.Transient
		if errors.Is(werr, archive.ErrTooLarge) {
			// The same content is as large the next time.
			handling = failure.Final
		}
		return 0, failure.New(handling, sourcev1.StorageOperationFailedCondition, sourcev1.ArchiveOperationFailedReason,
			"unable to archive artifact to storage: %w", werr)
	}
	if err != nil {
		return 0, failure.New(failure.Transient, sourcev1.StorageOperationFailedCondition, sourcev1.ArchiveOperationFailedReason,
			"unable to archive artifact to storage: %w", err)
	}
	return info.Size, nil
}

// errStagingStopped ends the archive writer when storage stops reading.
var errStagingStopped = errors.New("staging stopped")

// putFile stores file at key as it is.
func (h *handler) putFile(ctx context.Context, key, file string) (int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, failure.New(failure.Transient, sourcev1.StorageOperationFailedCondition, sourcev1.ArchiveOperationFailedReason,
			"unable to stage artifact: %w", err)
	}
	defer f.Close()
	info, err := h.store.Put(ctx, key, f)
	if err != nil {
		return 0, failure.New(failure.Transient, sourcev1.StorageOperationFailedCondition, sourcev1.ArchiveOperationFailedReason,
			"unable to copy artifact to storage: %w", err)
	}
	return info.Size, nil
}

// report is the worker's bus.Reporter: a failed fetch is published as the
// job's FetchFailed outcome.
func (h *handler) report(ctx context.Context, msg *events.Message, f *failure.Error) error {
	req, ok := msg.Data.(*events.FetchRequested)
	if !ok {
		return fmt.Errorf("report: %T is not a fetch request", msg.Data)
	}
	out := &events.Outcome{Job: req.Job, Revision: f.Revision, Failure: f.Data(), Notices: f.Notices}
	// The kind's own subject: the only one this identity may publish on.
	return h.pub.Publish(ctx, events.PublishSubject(h.kind), events.TypeFetchFailed, req.Job, out)
}
