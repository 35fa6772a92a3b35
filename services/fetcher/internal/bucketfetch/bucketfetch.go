// Package bucketfetch fetches Bucket sources as Flux's Bucket controller
// does, from S3-compatible object storage (providers generic and aws, with
// minio-go), Google Cloud Storage (provider gcp, through its JSON API) and
// Azure Blob Storage (provider azure, with azblob): resolving lists the objects under spec.prefix, filters
// them with the ignore rules and digests their keys and ETags into the
// revision, so an unchanged bucket costs a listing and no download; a
// download fetches the listed objects concurrently, with a bound, each
// streamed to its file, and never writes outside the download directory.
// Revisions, reasons and messages are Flux's.
//
// Each provider is a store (list, get, exists); what they share lives in
// resolved, so a bucket holding the same keys and ETags has the same
// revision whatever serves it.
package bucketfetch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/sourceignore"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
)

// Kind is the source kind this package fetches.
const Kind = sourcev1.BucketKind

// DefaultConcurrency is the number of objects downloaded at once when
// Source.Concurrency is not set.
const DefaultConcurrency = 8

// ignoreFile is the object with ignore rules, at the root of the bucket
// whatever the prefix, as in Flux.
const ignoreFile = sourceignore.IgnoreFile

// maxIgnoreFileSize bounds the ignore rules read into memory.
const maxIgnoreFileSize = 1 << 20

// Source fetches Bucket sources.
type Source struct {
	// Secrets reads the Secrets named by the spec; nil means none can be
	// read.
	Secrets secrets.Reader
	// Limiter, when set, passes every request to the object store through
	// the limits of its host (see package hostlimit).
	Limiter *hostlimit.Limiter
	// Concurrency bounds the objects downloaded at once; DefaultConcurrency
	// when not positive.
	Concurrency int
	// MaxFileSize, when positive, fails a download with a larger object
	// before fetching it.
	MaxFileSize int64
	// MaxRetries bounds the attempts of one request to the bucket's
	// server; when zero, each client's default: 10 for S3 (minio-go), 4
	// for Azure (azcore), and for Google Cloud Storage retries until the
	// job's timeout, as its SDK does.
	MaxRetries int

	// listPageSize, when positive, bounds the objects of one listing
	// page of Google Cloud Storage and Azure (tests make listings of
	// several pages with it).
	listPageSize int
	// gcsBackoff, when positive, replaces the first wait between the
	// attempts of a Google Cloud Storage request (gcsInitialBackoff;
	// tests shorten it).
	gcsBackoff time.Duration

	// Accounts give providers aws, gcp and azure the identity of the
	// Bucket's ServiceAccount under the ObjectLevelWorkloadIdentity gate
	// (package workloadidentity); nil: the gate is off.
	Accounts *workloadidentity.Accounts
	// Tokens keeps the credentials of ServiceAccounts' roles until
	// shortly before they expire; nil assumes the role for every fetch.
	Tokens *providertoken.Cache
	// Getenv looks up the STS endpoint override (AWS_ENDPOINT_URL_STS);
	// nil reads the process's environment.
	Getenv func(string) (string, bool)

	// stsRoundTripper, when set, carries the requests to STS endpoints
	// (tests reach a test STS server by AWS's host name with it).
	stsRoundTripper http.RoundTripper
	// rootCAs, when set, replace the system's certificate authorities in
	// the Google Cloud Storage and Azure transports (tests trust their
	// Entra ID and blob fronts with it).
	rootCAs *x509.CertPool

	mu         sync.Mutex
	transports map[bool]http.RoundTripper // shared S3 transports, by secure
	cloud      http.RoundTripper          // shared GCS and Azure transport
}

var (
	_ source.Source    = (*Source)(nil)
	_ source.Shareable = (*resolved)(nil)
)

// Timeout is spec.timeout, 60s when unset.
func (s *Source) Timeout(req *events.FetchRequested) time.Duration {
	if spec := req.Bucket; spec != nil {
		return source.TimeoutOf(spec.Timeout)
	}
	return source.DefaultTimeout
}

// Resolve validates the spec, reads its Secrets and lists the bucket: the
// revision is the digest of the listing. Only the ignore rules object is
// downloaded, when there is one.
func (s *Source) Resolve(ctx context.Context, req *events.FetchRequested) (source.Resolved, error) {
	spec := req.Bucket
	if spec == nil {
		return nil, source.MissingSpec(req, "Bucket spec")
	}
	if err := checkSpec(spec); err != nil {
		return nil, err
	}
	var account *workloadidentity.Account
	if usesAccount(spec) {
		var err error
		if account, err = s.Accounts.Resolve(ctx, req.Job.Object.Namespace, spec.ServiceAccountName); err != nil {
			return nil, err
		}
	}
	st, access, err := s.open(ctx, req.Job.Object.Namespace, spec, account)
	if err != nil {
		return nil, err
	}
	r := &resolved{src: s, store: st, bucket: spec.BucketName, prefix: spec.Prefix, ignore: spec.Ignore,
		identity: identity(req.Job.Object.Namespace, spec, access, account)}
	if err := r.list(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// resolved is a bucket listing, filtered by the ignore rules.
type resolved struct {
	src    *Source
	store  store
	bucket string
	prefix string
	ignore *string

	// rules is the content of the ignore rules object; nil without one.
	rules []byte
	// identity is what names the bucket and the access to it (see
	// ContentIdentity).
	identity []string

	mu      sync.Mutex
	objects map[string]object // by key
}

// Revision is the digest of the listing, Flux's "sha256:<hex>".
func (r *resolved) Revision() string {
	return Revision(r.etags())
}

// ContentIdentity is what, besides the revision (the listing's keys and
// ETags), determines the downloaded content: the bucket (provider,
// endpoint, scheme, name), the prefix, the ignore rules of the spec and of
// the bucket's rules object, and the access to it. Listing a bucket needs
// another permission than reading its objects, so content is shared only
// between sources that authenticate the same way: with the same Secret in
// the same namespace, or the same service account, or with none.
func (r *resolved) ContentIdentity() ([]string, bool) {
	rules := "-"
	if r.rules != nil {
		sum := sha256.Sum256(r.rules)
		rules = "+" + hex.EncodeToString(sum[:])
	}
	ignore := "-"
	if r.ignore != nil {
		ignore = "+" + *r.ignore
	}
	return append(slices.Clone(r.identity), r.bucket, r.prefix, ignore, rules), true
}

// ProveAccess has nothing to do: resolving listed the bucket with this
// source's credentials.
func (r *resolved) ProveAccess(context.Context) error { return nil }

// identity names a Bucket spec's bucket and the credentials it is read
// with: everything ContentIdentity needs besides the listing. access is
// the fingerprint of the data of the Secrets the client was built from, so
// a rotated key is another identity while the same keys in two Secrets are
// the same.
func identity(namespace string, spec *sourcev1.BucketSpec, access string, account *workloadidentity.Account) []string {
	ref := func(r *meta.LocalObjectReference) string {
		if r == nil {
			return "-"
		}
		return "+" + namespace + "/" + r.Name
	}
	sts := "-"
	if spec.STS != nil {
		sts = "+" + spec.STS.Provider + "\x00" + spec.STS.Endpoint + "\x00" + ref(spec.STS.SecretRef) + "\x00" + ref(spec.STS.CertSecretRef)
	}
	// The ServiceAccount authenticated as, named or the default one: its
	// content is its namespace's alone.
	sa := "-"
	if account != nil {
		sa = "+" + account.String()
	} else if spec.ServiceAccountName != "" {
		sa = "+" + namespace + "/" + spec.ServiceAccountName
	}
	return []string{spec.Provider, spec.Endpoint, fmt.Sprint(spec.Insecure), spec.Region, access, sts, sa}
}

// etags returns the ETag of every listed object, by key.
func (r *resolved) etags() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[string]string, len(r.objects))
	for k, o := range r.objects {
		m[k] = o.etag
	}
	return m
}

// list checks that the bucket exists, lists the objects under the prefix
// and keeps those the ignore rules (the .sourceignore object at the root of
// the bucket, then spec.ignore) do not exclude. Like Flux, it skips
// directory markers (keys ending in "/") and the ignore rules object, and
// does not apply the default exclusions of Git sources.
func (r *resolved) list(ctx context.Context) error {
	exists, err := r.store.exists(ctx)
	if err != nil {
		return source.FailedWith(handlingOf(err), sourcev1.BucketOperationFailedReason, "failed to confirm existence of '%s' bucket: %w", r.bucket, err)
	}
	if !exists {
		return source.Failed(sourcev1.BucketOperationFailedReason, "bucket '%s' not found", r.bucket)
	}

	listed := map[string]object{}
	hasRules := false
	err = r.store.list(ctx, r.prefix, func(key string, o object) error {
		switch {
		case key == ignoreFile:
			hasRules = true
		case strings.HasSuffix(key, "/"):
		default:
			listed[key] = o
		}
		return nil
	})
	if err != nil {
		return source.FailedWith(handlingOf(err), sourcev1.BucketOperationFailedReason,
			"indexation of objects from bucket '%s' failed: listing objects from bucket '%s' failed: %w", r.bucket, r.bucket, err)
	}
	// The listing tells whether the rules object exists unless a prefix
	// kept it out.
	if hasRules || r.prefix != "" {
		if err := r.getRules(ctx); err != nil {
			return err
		}
	}
	patterns := sourceignore.ReadPatterns(bytes.NewReader(r.rules), nil)
	if r.ignore != nil {
		patterns = append(patterns, sourceignore.ReadPatterns(strings.NewReader(*r.ignore), nil)...)
	}
	matcher := sourceignore.NewMatcher(patterns)
	for key := range listed {
		if matcher.Match(strings.Split(key, "/"), false) {
			delete(listed, key)
		}
	}
	r.objects = listed
	return nil
}

// getRules reads the ignore rules object, if there is one.
func (r *resolved) getRules(ctx context.Context) error {
	body, _, err := r.store.get(ctx, ignoreFile)
	if errors.Is(err, errNoSuchObject) {
		return nil
	}
	if err != nil {
		return source.FailedWith(handlingOf(err), sourcev1.BucketOperationFailedReason, "failed to get Etag for '%s' object: %w", ignoreFile, err)
	}
	defer body.Close()
	data, err := io.ReadAll(io.LimitReader(body, maxIgnoreFileSize+1))
	switch {
	case err != nil:
		return source.Failed(sourcev1.BucketOperationFailedReason, "failed to get Etag for '%s' object: %w", ignoreFile, err)
	case len(data) > maxIgnoreFileSize:
		return &failure.Error{Condition: sourcev1.FetchFailedCondition, Reason: sourcev1.BucketOperationFailedReason, Handling: failure.Final,
			Err: fmt.Errorf("'%s' object is larger than %d bytes", ignoreFile, maxIgnoreFileSize)}
	}
	r.rules = data
	return nil
}

// Download writes the listed objects into dir, each at its key, and the
// ignore rules object at the root as Flux does. It checks every key and
// listed size before fetching anything. An object that changed since the
// listing is fetched as it is now and the revision follows it; one that
// disappeared is left out, as in Flux.
func (r *resolved) Download(ctx context.Context, dir string) (*source.Content, error) {
	paths, err := r.check()
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, source.Failed(sourcev1.DirCreationFailedReason, "failed to open temporary working directory: %w", err)
	}
	defer root.Close()
	if r.rules != nil {
		if err := root.WriteFile(ignoreFile, r.rules, 0o644); err != nil {
			return nil, source.Failed(sourcev1.BucketOperationFailedReason, "failed to write '%s' object: %w", ignoreFile, err)
		}
	}
	if err := r.fetchAll(ctx, root, paths); err != nil {
		return nil, err
	}
	etags := r.etags()
	hex := digestHex(etags)
	return &source.Content{
		Root:         dir,
		Revision:     "sha256:" + hex,
		ArtifactName: hex + ".tar.gz",
		EventMessage: fmt.Sprintf("stored artifact with %d fetched files from '%s' bucket", len(etags), r.bucket),
	}, nil
}

// check returns the path of every listed object, by key, or the failure of
// the first (in key order) that is unsafe or over the size limit.
func (r *resolved) check() (map[string]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(r.objects))
	for k := range r.objects {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	paths := make(map[string]string, len(keys))
	for _, key := range keys {
		p, err := objectPath(key)
		if err != nil {
			return nil, r.fetchError(err)
		}
		if limit := r.src.MaxFileSize; limit > 0 && r.objects[key].size > limit {
			return nil, r.fetchError(tooLarge(key, r.objects[key].size, limit))
		}
		paths[key] = p
	}
	return paths, nil
}

// fetchAll downloads the objects with a bounded number of workers; the
// first failure stops the others.
func (r *resolved) fetchAll(ctx context.Context, root *os.Root, paths map[string]string) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	keys := make([]string, 0, len(paths))
	for k := range paths {
		keys = append(keys, k)
	}
	slices.Sort(keys)

	workers := r.src.Concurrency
	if workers <= 0 {
		workers = DefaultConcurrency
	}
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(workers, len(keys)) {
		wg.Go(func() {
			for key := range work {
				if err := r.fetch(ctx, root, key, paths[key]); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for _, key := range keys {
		select {
		case work <- key:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		var ferr *failure.Error
		if errors.As(err, &ferr) {
			return ferr
		}
		// The job's own context ended: its deadline or a shutdown.
		return r.fetchError(err)
	}
	return nil
}

// fetch streams one object to its file. A missing object is left out of
// the listing; a changed one is recorded with its new ETag.
func (r *resolved) fetch(ctx context.Context, root *os.Root, key, rel string) error {
	body, info, err := r.store.get(ctx, key)
	if errors.Is(err, errNoSuchObject) {
		logr.FromContextOrDiscard(ctx).Info("indexed object disappeared from the bucket", "bucket", r.bucket, "key", key)
		r.mu.Lock()
		delete(r.objects, key)
		r.mu.Unlock()
		return nil
	}
	if err != nil {
		return r.fetchError(fmt.Errorf("failed to get '%s' object: %w", key, err))
	}
	defer body.Close()
	limit := r.src.MaxFileSize
	if limit > 0 && info.size > limit {
		return r.fetchError(tooLarge(key, info.size, limit))
	}
	if dir := filepath.Dir(rel); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return r.fileError(key, err)
		}
	}
	f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return r.fileError(key, err)
	}
	var src io.Reader = body
	if limit > 0 {
		src = io.LimitReader(body, limit+1)
	}
	n, err := io.Copy(f, src)
	if cerr := f.Close(); err == nil && cerr != nil {
		return r.fileError(key, cerr)
	}
	if err != nil {
		return r.fetchError(fmt.Errorf("failed to get '%s' object: %w", key, err))
	}
	if limit > 0 && n > limit {
		return r.fetchError(tooLarge(key, n, limit))
	}
	r.mu.Lock()
	if o := r.objects[key]; o.etag != info.etag {
		r.objects[key] = object{etag: info.etag, size: n}
	}
	r.mu.Unlock()
	return nil
}

// fetchError is a download failure in Flux's words. The bucket's content
// fails the same way again (until it changes) when a key is unsafe or an
// object too large, and so do refused credentials (until the Secret
// changes): such failures are final.
func (r *resolved) fetchError(err error) *failure.Error {
	handling := handlingOf(err)
	if errors.Is(err, errUnsafeKey) || errors.Is(err, archive.ErrTooLarge) {
		handling = failure.Final
	}
	return &failure.Error{Condition: sourcev1.FetchFailedCondition, Reason: sourcev1.BucketOperationFailedReason, Handling: handling,
		Err: fmt.Errorf("fetch from bucket '%s' failed: %w", r.bucket, err)}
}

// fileError is a failure to write an object's file. Keys that clash (one
// is a directory of the other, or two clean to the same path) are final.
func (r *resolved) fileError(key string, err error) *failure.Error {
	e := r.fetchError(fmt.Errorf("failed to write '%s' object: %w", key, err))
	if errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EISDIR) {
		e.Handling = failure.Final
	}
	return e
}

// tooLarge is the error of an object over the size limit.
func tooLarge(key string, size, limit int64) error {
	return fmt.Errorf("%w: object '%s' is %d bytes, over the limit of %d", archive.ErrTooLarge, key, size, limit)
}

// handlingOf is the handling of a store's error: final when the server
// refused the credentials (trying again in this job fails the same way;
// the next interval tries again), transient otherwise.
func handlingOf(err error) failure.Handling {
	if errors.Is(err, errDenied) {
		return failure.Final
	}
	return failure.Transient
}
