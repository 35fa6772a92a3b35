// Package helmfetch fetches HelmRepository sources (type default: an HTTP
// or HTTPS chart repository) as Flux's HelmRepository controller does,
// but without holding the index in memory and without downloading an
// unchanged one:
//
//   - The index is requested with the validators (ETag, Last-Modified) of
//     the last one this fetcher downloaded with the same URL and
//     credentials; a 304 answers the revision it had, so an unchanged index
//     costs one round trip and no parse.
//   - A 200 is streamed to a local file, digested and checked as a Helm
//     index (package helmindex) while it streams, within
//     -helm-index-max-size.
//   - The revision is Flux's, "sha256:<hex>" of the index as served, and
//     the artifact is the index as served (index-<hex>.yaml): its digest is
//     the revision.
package helmfetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/helmindex"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// Kind is the source kind this package fetches.
const Kind = sourcev1.HelmRepositoryKind

// DefaultMaxIndexSize is the largest index fetched by default, as Flux's.
const DefaultMaxIndexSize = 50 << 20

// IndexFile is the name of the downloaded index in the download directory.
const IndexFile = "index.yaml"

// Results of an index request, the result label of
// headwater_helm_index_requests_total.
const (
	// IndexDownloaded: the server sent the index (200).
	IndexDownloaded = "downloaded"
	// IndexNotModified: the server answered 304 to a conditional request.
	IndexNotModified = "not_modified"
)

// Source fetches HelmRepository sources.
type Source struct {
	// Secrets reads the Secrets named by the spec; nil means none can be
	// read.
	Secrets secrets.Reader
	// MaxIndexSize bounds an index; DefaultMaxIndexSize when not positive.
	MaxIndexSize int64
	// Validators remembers the validators of downloaded indexes; nil
	// makes every request unconditional.
	Validators *Validators
	// TempDir is where indexes are downloaded to; the system's when empty.
	TempDir string
	// Recent shares the downloads of sources fetched together; nil
	// shares none.
	Recent *Recent

	transports Transports
	requests   *prometheus.CounterVec
}

// Limit passes every request of the source, and of the HelmCharts that
// read their repositories through it, through l (see package hostlimit).
func (s *Source) Limit(l *hostlimit.Limiter) { s.transports.Limiter = l }

// NewSource returns a Source; it registers
// headwater_helm_index_requests_total{result} on reg when reg is not nil.
func NewSource(r secrets.Reader, maxIndexSize int64, validators *Validators, reg prometheus.Registerer) *Source {
	s := &Source{Secrets: r, MaxIndexSize: maxIndexSize, Validators: validators}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Name: "helm_index_requests_total",
		Help: "Requests of Helm repository indexes, by result: downloaded (200) or not_modified (a 304 to a conditional request).",
	}, []string{"result"})
	s.requests.WithLabelValues(IndexDownloaded)
	s.requests.WithLabelValues(IndexNotModified)
	if reg != nil {
		reg.MustRegister(s.requests)
	}
	return s
}

var (
	_ source.Source    = (*Source)(nil)
	_ source.Shareable = (*resolved)(nil)
	_ io.Closer        = (*resolved)(nil)
)

// Timeout is spec.timeout, 60s when unset.
func (s *Source) Timeout(req *events.FetchRequested) time.Duration {
	if spec := req.HelmRepository; spec != nil {
		return source.TimeoutOf(spec.Timeout)
	}
	return source.DefaultTimeout
}

func (s *Source) maxIndexSize() int64 {
	if s.MaxIndexSize > 0 {
		return s.MaxIndexSize
	}
	return DefaultMaxIndexSize
}

// Resolve checks the spec, reads its Secrets and requests the index,
// conditionally when this fetcher has its validators: a 304 resolves to
// the revision remembered with them, a 200 is downloaded to a local file
// (checked and digested as it streams) and resolves to its digest. The
// caller must Close the result.
func (s *Source) Resolve(ctx context.Context, req *events.FetchRequested) (source.Resolved, error) {
	spec := req.HelmRepository
	if spec == nil {
		return nil, source.MissingSpec(req, "HelmRepository spec")
	}
	if spec.Type == sourcev1.HelmRepositoryTypeOCI {
		return nil, source.StalledError(source.InvalidSpecReason, "a HelmRepository of type 'oci' has no artifact to fetch")
	}
	access, err := NewAccess(ctx, s.Secrets, &s.transports, req.Job.Object.Namespace, spec)
	if err != nil {
		return nil, err
	}
	r := &resolved{src: s, access: access, specURL: failure.RedactURL(spec.URL)}
	r.key = validatorKey(access.IndexURL(), access.Fingerprint)
	// One request of an index at a time: the next one asks with the
	// validators this one gets.
	release, err := s.Recent.acquire(ctx, r.key)
	if err != nil {
		return nil, source.Failed(meta.FailedReason, "failed to fetch Helm repository index: %w", err)
	}
	defer release()
	v, known := s.Validators.get(r.key)
	header := http.Header{}
	if known {
		header = v.header()
	}
	if err := r.fetch(ctx, header); err != nil {
		return nil, err
	}
	if r.file == "" {
		r.revision = v.revision
	}
	return r, nil
}

// resolved is a requested index: downloaded to file, or known unchanged
// (a 304) with the remembered revision.
type resolved struct {
	src      *Source
	access   *Access
	specURL  string // spec.url without credentials, for messages
	key      string // of the validators
	revision string
	file     string // the downloaded index; empty after a 304
	size     int64
}

// Revision is Flux's "sha256:<hex>" of the index as served.
func (r *resolved) Revision() string { return r.revision }

// Close removes the downloaded index, if it was not handed to Download.
func (r *resolved) Close() error {
	if r.file == "" {
		return nil
	}
	err := os.Remove(r.file)
	r.file = ""
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// ContentIdentity is the index's URL (without credentials): an index is
// stored as served, so its revision (its digest) and its URL determine the
// artifact byte for byte, whatever the credentials.
func (r *resolved) ContentIdentity() ([]string, bool) {
	u := *r.access.URL
	u.User = nil
	return []string{"index", u.String()}, true
}

// ProveAccess has nothing to do: resolving requested the index with this
// source's credentials, and the server answered 200 or 304.
func (r *resolved) ProveAccess(context.Context) error { return nil }

// Download moves the downloaded index into dir. When resolving got a 304,
// it takes the index another source of this fetcher downloaded a moment
// ago (see Recent), or downloads it (unconditionally).
func (r *resolved) Download(ctx context.Context, dir string) (*source.Content, error) {
	if r.file == "" {
		if p, size, ok := r.src.Recent.take(r.key, r.revision, dir); ok {
			r.file, r.size = p, size
		} else if err := r.fetch(ctx, http.Header{}); err != nil {
			return nil, err
		}
	}
	dst := filepath.Join(dir, IndexFile)
	if err := os.Rename(r.file, dst); err != nil {
		return nil, &failure.Error{Condition: sourcev1.StorageOperationFailedCondition, Reason: sourcev1.ArchiveOperationFailedReason,
			Err: fmt.Errorf("failed to move index: %w", err)}
	}
	r.file = ""
	_, hexDigest, _ := strings.Cut(r.revision, ":")
	return &source.Content{
		Root:         dir,
		Revision:     r.revision,
		ArtifactName: "index-" + hexDigest + ".yaml",
		File:         dst,
		EventMessage: fmt.Sprintf("stored fetched index of size %s from '%s'", HumanSize(r.size), r.specURL),
	}, nil
}

// fetch requests the index with header. A 304 leaves r.file empty; a 200
// is downloaded into r.file, with r.revision and r.size, and its
// validators remembered.
func (r *resolved) fetch(ctx context.Context, header http.Header) error {
	indexURL := r.access.IndexURL()
	resp, err := r.access.Get(ctx, indexURL, header)
	if err != nil {
		return source.Failed(meta.FailedReason, "failed to fetch Helm repository index: %w", err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotModified && len(header) > 0:
		r.src.count(IndexNotModified)
		return nil
	case resp.StatusCode != http.StatusOK:
		r.src.Validators.forget(r.key)
		return source.Failed(meta.FailedReason, "failed to fetch Helm repository index: failed to fetch %s : %s",
			failure.RedactURL(indexURL), resp.Status)
	}
	r.src.count(IndexDownloaded)
	limit := r.src.maxIndexSize()
	tooLarge := source.FailedWith(failure.Final, meta.FailedReason,
		"failed to fetch Helm repository index: index from '%s' exceeds the maximum size of %s (-helm-index-max-size)",
		failure.RedactURL(indexURL), HumanSize(limit))
	if cl := resp.Header.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n > limit {
			return tooLarge
		}
	}
	f, err := os.CreateTemp(r.src.TempDir, "helm-index-")
	if err != nil {
		return &failure.Error{Condition: sourcev1.StorageOperationFailedCondition, Reason: sourcev1.DirCreationFailedReason,
			Err: fmt.Errorf("failed to create temporary file for the index: %w", err)}
	}
	keep := false
	defer func() {
		if !keep {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	counted := &countingReader{r: io.LimitReader(resp.Body, limit+1)}
	body := io.TeeReader(counted, io.MultiWriter(f, h))
	checkErr := helmindex.Check(body)
	// Check stops early on a bad index; the digest needs the rest only
	// if it is good.
	if counted.n > limit {
		return tooLarge
	}
	if checkErr != nil {
		if counted.err != nil {
			return source.Failed(meta.FailedReason, "failed to fetch Helm repository index: %w", counted.err)
		}
		return source.FailedWith(failure.Final, sourcev1.IndexationFailedReason,
			"failed to load Helm repository from index YAML: %w", checkErr)
	}
	if err := f.Close(); err != nil {
		return &failure.Error{Condition: sourcev1.StorageOperationFailedCondition, Reason: sourcev1.ArchiveOperationFailedReason,
			Err: fmt.Errorf("failed to write the index: %w", err)}
	}
	keep = true
	if r.file != "" {
		os.Remove(r.file)
	}
	r.file, r.size = f.Name(), counted.n
	r.revision = "sha256:" + hex.EncodeToString(h.Sum(nil))
	r.src.Validators.put(r.key, resp.Header, r.revision)
	r.src.Recent.keep(r.key, r.revision, r.file, r.size)
	return nil
}

func (s *Source) count(result string) {
	if s.requests != nil {
		s.requests.WithLabelValues(result).Inc()
	}
}

// countingReader counts the bytes read and keeps the read error.
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
}

// HumanSize formats a size as Flux's messages do (docker/go-units'
// HumanSize: decimal units, four significant digits): "444B", "1.234kB".
func HumanSize(size int64) string {
	units := []string{"B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"}
	f, i := float64(size), 0
	for f >= 1000 && i < len(units)-1 {
		f /= 1000
		i++
	}
	return strconv.FormatFloat(f, 'g', 4, 64) + units[i]
}

// FetchIndex downloads the index of the chart repository spec describes
// into a new file in dir, checked and within the size limit, as Resolve
// does but without validators: for a chart dependency whose repository is
// no HelmRepository (Flux fetches those anonymously). It returns the
// file's path.
func (s *Source) FetchIndex(ctx context.Context, namespace string, spec *sourcev1.HelmRepositorySpec, dir string) (string, error) {
	access, err := NewAccess(ctx, s.Secrets, &s.transports, namespace, spec)
	if err != nil {
		return "", err
	}
	r := &resolved{src: &Source{MaxIndexSize: s.MaxIndexSize, TempDir: dir}, access: access, specURL: failure.RedactURL(spec.URL)}
	if err := r.fetch(ctx, http.Header{}); err != nil {
		return "", err
	}
	return r.file, nil
}
