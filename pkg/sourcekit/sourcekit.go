// Package sourcekit is what a plug-in source kind's fetcher is written
// with (docs/writing-a-source-kind.md): the author gives a Fetch function
// for one kind, and the kit does the rest as Headwater's built-in fetchers
// do. It connects to the bus as the kind's own identity
// (events.PluginIdentity), takes that kind's jobs only, checks that the
// stored artifact is intact before offering it as Previous, stages what
// Fetch downloaded (a tree, archived, or one file) in the shared storage,
// and answers with the same events the built-in fetchers publish
// (Fetched, FetchUnchanged, FetchFailed), the sealed job carried
// unchanged: it follows the protocol of every fetcher (package fetchjob),
// with the same cache of artifacts found intact (storage.Verified). The
// watcher, packager and artifact-server do the rest.
package sourcekit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
	"github.com/headwater-gitops/headwater/pkg/fetchjob"
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

// handler handles the fetch jobs of one kind, on the protocol of every
// fetcher (package fetchjob).
type handler struct {
	kind  string
	fetch FetchFunc
	store storage.Storage
	// verified is the cache of stored artifacts found intact, which lets
	// an unchanged check stat an artifact instead of reading it.
	verified *storage.Verified
	pub      fetchjob.Publisher
	secrets  client.Reader
	workDir  string
	timeout  time.Duration
	maxSize  int64
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
	// is rebuilt: the bus contract's, as every fetcher gives them.
	ArtifactMissingReason            = events.ArtifactMissingReason
	ArtifactVerificationFailedReason = events.ArtifactVerificationFailedReason
)

// handle is the bus.Handler of the kind's fetch jobs.
func (h *handler) handle(ctx context.Context, msg *events.Message, _ bus.Delivery) error {
	req, err := fetchjob.Requested(msg)
	if err != nil {
		return err
	}
	if req.Plugin == nil || !strings.EqualFold(req.Plugin.Kind, h.kind) || !strings.EqualFold(req.Job.Object.Kind, h.kind) {
		return Stalled(UnsupportedKindReason, "this fetcher fetches sources of kind '%s' only, not '%s'", h.kind, req.Job.Object.Kind)
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()

	r := &Request{Namespace: req.Job.Object.Namespace, Name: req.Job.Object.Name, Spec: req.Plugin.Spec, Secrets: h.secrets}
	var notices []events.Notice
	if prev := req.Previous; prev != nil && !req.Force {
		notice, err := fetchjob.CheckPrevious(ctx, h.store, h.verified, prev)
		switch {
		case err != nil:
			return Transient(sourcev1.StatOperationFailedReason, "checking the stored artifact: %s", err.Error())
		case notice != nil:
			notices = append(notices, *notice)
		default:
			r.Previous = prev
		}
	}
	dir, remove, err := fetchjob.WorkDir(ctx, h.workDir)
	if err != nil {
		return err
	}
	defer remove()
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
		_, err := fetchjob.Unchanged(ctx, h.pub, req)
		return err
	}
	if res.Unchanged {
		return Final(InvalidResultReason, "the fetcher of kind '%s' answered unchanged without a stored artifact", h.kind)
	}
	return h.stage(ctx, req, res, notices)
}

// stage writes the result's content to the job's staging key and hands it
// to the packager.
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
		size, err = fetchjob.StageFile(ctx, h.store, key, res.File)
	case res.Dir != "" && res.File == "":
		if out.ArtifactName == "" {
			out.ArtifactName = name + ".tar.gz"
		}
		size, err = fetchjob.StageTree(ctx, h.store, key, os.DirFS(res.Dir), archive.TarOptions{MaxFileSize: h.maxSize})
	default:
		return Final(InvalidResultReason, "the fetcher of kind '%s' must stage a directory or a file", h.kind)
	}
	if err != nil {
		return err
	}
	if out.EventMessage == "" {
		out.EventMessage = fmt.Sprintf("stored artifact for revision '%s'", res.Revision)
	}
	if err := fetchjob.Hand(ctx, h.pub, out); err != nil {
		return err
	}
	logr.FromContextOrDiscard(ctx).Info("content staged", "revision", res.Revision, "staging", key, "bytes", size)
	return nil
}

// report is the worker's bus.Reporter: a failed fetch is published as the
// job's FetchFailed outcome.
func (h *handler) report(ctx context.Context, msg *events.Message, f *failure.Error) error {
	return fetchjob.Report(ctx, h.pub, msg, f, nil)
}
