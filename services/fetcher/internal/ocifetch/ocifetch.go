// Package ocifetch fetches OCIRepository sources from OCI registries with
// go-containerregistry, as Flux's OCIRepository controller does: resolving
// turns spec.ref into a manifest digest (a HEAD request for a tag, a tag
// listing for a semver range, nothing for a digest), so an unchanged
// artifact costs one request and no download; a download pulls the
// manifest by that digest, picks the layer spec.layerSelector names and
// extracts it safely into the download directory. Revisions, reasons and
// messages are Flux's.
package ocifetch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/cosign"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/ignore"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/registrylogin"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
)

// Kind is the source kind this package fetches.
const Kind = sourcev1.OCIRepositoryKind

// DefaultMaxExtractSize bounds the bytes extracted from one layer when
// Source.MaxExtractSize is not set: a decompression bomb stops there.
const DefaultMaxExtractSize int64 = 1 << 30

// Flux's annotations of an artifact's origin (flux push artifact --source
// --revision), quoted in the NewArtifact message.
const (
	sourceAnnotation   = "org.opencontainers.image.source"
	revisionAnnotation = "org.opencontainers.image.revision"
)

// platform is the platform picked from a multi-platform image index, as
// Flux (go-containerregistry's default) picks it.
var platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// userAgent identifies the fetcher to registries.
const userAgent = "headwater-fetcher"

// Source fetches OCIRepository sources.
type Source struct {
	// Secrets reads the Secrets and ServiceAccounts the spec names; nil
	// means none can be read.
	Secrets secrets.Reader
	// Limiter, when set, passes every request to the registry through
	// the limits of its host (see package hostlimit).
	Limiter *hostlimit.Limiter
	// MaxFileSize, when positive, fails a download with a larger file in
	// the layer (or, for operation copy, a larger layer).
	MaxFileSize int64
	// MaxExtractSize bounds the bytes extracted from one layer;
	// DefaultMaxExtractSize when not positive.
	MaxExtractSize int64
	// Cloud logs in to the registries of spec.provider aws, azure and
	// gcp with the fetcher's own identity; nil logs in with the process's
	// environment and caches nothing.
	Cloud *registrylogin.Login
	// Accounts give cloud logins the identity of a source's
	// ServiceAccount under the ObjectLevelWorkloadIdentity gate (package
	// workloadidentity); nil: the gate is off.
	Accounts *workloadidentity.Accounts
	// Sigstore is the public Sigstore trusted root of keyless
	// verification without spec.verify.trustedRootSecretRef;
	// cosign.Public() when nil.
	Sigstore *cosign.PublicRoot

	mu     sync.Mutex
	shared http.RoundTripper // the transport of sources without TLS settings or proxy
}

var (
	_ source.Source    = (*Source)(nil)
	_ source.Shareable = (*resolved)(nil)
)

// Timeout is spec.timeout, 60s when unset.
func (s *Source) Timeout(req *events.FetchRequested) time.Duration {
	if spec := req.OCIRepository; spec != nil {
		return source.TimeoutOf(spec.Timeout)
	}
	return source.DefaultTimeout
}

// Resolve validates the spec, reads its Secrets and resolves spec.ref to a
// manifest digest without downloading the manifest or any layer.
func (s *Source) Resolve(ctx context.Context, req *events.FetchRequested) (source.Resolved, error) {
	spec := req.OCIRepository
	if spec == nil {
		return nil, source.MissingSpec(req, "OCIRepository spec")
	}
	if err := checkSpec(spec); err != nil {
		return nil, err
	}
	repo, err := parseRepository(spec)
	if err != nil {
		return nil, source.StalledError(sourcev1.URLInvalidReason, "URL validation failed for '%s': %w", spec.URL, err)
	}
	access, err := s.access(ctx, req.Job.Object.Namespace, spec, repo)
	if err != nil {
		return nil, err
	}
	r := &resolved{
		src:      s,
		url:      spec.URL,
		repo:     repo,
		insecure: spec.Insecure,
		ignore:   spec.Ignore,
		access:   access,
	}
	if ls := spec.LayerSelector; ls != nil {
		r.mediaType, r.operation = ls.MediaType, ls.Operation
	}
	if v := spec.Verify; v != nil {
		if r.verifyCfg, err = s.verification(ctx, req.Job.Object.Namespace, v); err != nil {
			return nil, err
		}
	}
	if r.operation == "" {
		r.operation = sourcev1.OCILayerExtract
	}
	if err := r.resolve(ctx, spec.Reference); err != nil {
		return nil, err
	}
	return r, nil
}

// checkSpec refuses, as stalled failures, the specs this fetcher cannot
// serve whatever the registry holds.
func checkSpec(spec *sourcev1.OCIRepositorySpec) error {
	switch spec.Provider {
	case "", sourcev1.GenericOCIProvider, registrylogin.AWS, registrylogin.Azure, registrylogin.GCP:
	default:
		return source.StalledError(source.UnsupportedProviderReason, "OCI provider '%s' is not supported: use 'generic', 'aws', 'azure' or 'gcp'", spec.Provider)
	}
	if ls := spec.LayerSelector; ls != nil {
		switch ls.Operation {
		case "", sourcev1.OCILayerExtract, sourcev1.OCILayerCopy:
		default:
			return source.StalledError(sourcev1.OCILayerOperationFailedReason, "unsupported layer operation: %s", ls.Operation)
		}
	}
	return nil
}

// parseRepository validates spec.url with Flux's rules: oci://, a valid
// repository, no tag.
func parseRepository(spec *sourcev1.OCIRepositorySpec) (name.Repository, error) {
	if !strings.HasPrefix(spec.URL, sourcev1.OCIRepositoryPrefix) {
		return name.Repository{}, errors.New("URL must be in format 'oci://<domain>/<org>/<repo>'")
	}
	u := strings.TrimPrefix(spec.URL, sourcev1.OCIRepositoryPrefix)
	var opts []name.Option
	if spec.Insecure {
		opts = append(opts, name.Insecure)
	}
	repo, err := name.NewRepository(u, opts...)
	if err != nil {
		return name.Repository{}, err
	}
	image := strings.TrimPrefix(u, repo.RegistryStr())
	if s := strings.Split(image, ":"); len(s) > 1 {
		return name.Repository{}, fmt.Errorf("URL must not contain a tag; remove ':%s'", s[1])
	}
	return repo, nil
}

// resolved is a spec.ref resolved to a manifest digest.
type resolved struct {
	src      *Source
	url      string
	repo     name.Repository
	insecure bool
	ignore   *string
	access   *access
	// mediaType and operation are spec.layerSelector's, operation
	// defaulted.
	mediaType, operation string

	// tag is the tag resolved (empty for a digest in the spec), digest
	// the manifest's.
	tag    string
	digest v1.Hash
	// checked is true once the registry answered for the manifest with
	// this source's credentials.
	checked bool
	// verifyCfg is spec.verify, nil when unset.
	verifyCfg *verifyConfig
	// puller keeps, for the fetch, what the registry told its first
	// request (its authentication scheme, a token), so the fetch's later
	// requests do not ask again (see options).
	puller *remote.Puller
}

// Revision is Flux's revision: "<tag>@sha256:<hex>", or the digest alone
// when the spec names it.
func (r *resolved) Revision() string {
	if r.tag == "" {
		return r.digest.String()
	}
	return r.tag + "@" + r.digest.String()
}

// options are the go-containerregistry options of every request of the
// fetch. They share one puller: go-containerregistry otherwise pings the
// registry (GET /v2/) and fetches a token before each operation, which
// made a fetch's resolve, manifest and layer cost three pings more than
// the requests it needs.
func (r *resolved) options(ctx context.Context) []remote.Option {
	opts := []remote.Option{
		remote.WithAuth(r.access.auth),
		remote.WithTransport(r.access.transport),
		remote.WithUserAgent(userAgent),
		remote.WithPlatform(platform),
	}
	if r.puller == nil {
		// NewPuller fails only on invalid options, which these are not;
		// without it every operation pings, as before.
		r.puller, _ = remote.NewPuller(opts...)
	}
	if r.puller != nil {
		opts = append(opts, remote.Reuse(r.puller))
	}
	return append(opts, remote.WithContext(ctx))
}

// ContentIdentity is what, besides the revision (tag and manifest
// digest), determines the artifact: the repository (without credentials)
// and how it is reached, the layer selector, the ignore rules and the
// extraction bound. A manifest that a source may read is readable with
// all its blobs (one pull permission), so content is shared between
// sources whatever their credentials; ProveAccess checks them. A source
// with spec.verify never shares: it verifies what it fetched itself.
func (r *resolved) ContentIdentity() ([]string, bool) {
	if r.verifyCfg != nil {
		return nil, false
	}
	ignore := "-"
	if r.ignore != nil {
		ignore = "+" + *r.ignore
	}
	return []string{r.repo.Name(), fmt.Sprint(r.insecure), platform.String(), r.mediaType, r.operation, ignore,
		fmt.Sprint(r.src.maxExtractSize())}, true
}

// ProveAccess asks the registry for the manifest with this source's
// credentials, unless resolving already did (a tag or a semver range).
func (r *resolved) ProveAccess(ctx context.Context) error {
	if r.checked {
		return nil
	}
	if _, err := remote.Head(r.repo.Digest(r.digest.String()), r.options(ctx)...); err != nil {
		return pullError(err, "failed to determine artifact digest: %w", err)
	}
	r.checked = true
	return nil
}

func (s *Source) maxExtractSize() int64 {
	if s.MaxExtractSize > 0 {
		return s.MaxExtractSize
	}
	return DefaultMaxExtractSize
}

// Download pulls the manifest by the resolved digest (for an image index,
// the linux/amd64 manifest), selects the layer and extracts it into dir,
// or, for layer operation copy, writes it into dir as it is. With
// spec.verify, a signature of the digest is verified first.
func (r *resolved) Download(ctx context.Context, dir string) (*source.Content, error) {
	var verification *events.Verification
	if r.verifyCfg != nil {
		// As Flux: the signature is checked before anything is pulled.
		v, err := r.verify(ctx)
		if err != nil {
			return nil, err
		}
		verification = v
	}
	ref := r.repo.Digest(r.digest.String())
	img, err := r.image(ctx, ref)
	if err != nil {
		return nil, err
	}
	manifest, err := img.Manifest()
	if err != nil {
		return nil, source.FailedWith(failure.Final, sourcev1.OCILayerOperationFailedReason, "failed to parse artifact manifest: %w", err)
	}
	layer, err := selectLayer(img, r.mediaType)
	if err != nil {
		return nil, err
	}
	revision := r.Revision()
	content := &source.Content{
		Root:         dir,
		Revision:     revision,
		ArtifactName: r.digest.String() + ".tar.gz",
		EventMessage: newArtifactMessage(revision, r.url, manifest.Annotations),
		Metadata:     manifest.Annotations,
		Verification: verification,
	}
	if r.operation == sourcev1.OCILayerCopy {
		if content.File, err = r.copyLayer(layer, dir); err != nil {
			return nil, err
		}
		return content, nil
	}
	if err := r.extract(ctx, layer, dir); err != nil {
		return nil, err
	}
	filter, err := ignore.Load(dir, r.ignore)
	if err != nil {
		return nil, source.Failed("SourceIgnoreError", "%w", err)
	}
	content.Exclude = filter.Exclude
	return content, nil
}

// newArtifactMessage is Flux's NewArtifact message, with the artifact's
// origin when its annotations say where it was built from.
func newArtifactMessage(revision, url string, annotations map[string]string) string {
	msg := fmt.Sprintf("stored artifact with revision '%s' from '%s'", revision, url)
	if src, rev := annotations[sourceAnnotation], annotations[revisionAnnotation]; src != "" && rev != "" {
		msg = fmt.Sprintf("%s, origin source '%s', origin revision '%s'", msg, src, rev)
	}
	return msg
}

// image pulls the manifest ref names; for an image index, the manifest of
// the platform Flux picks. A registry that serves other content than the
// digest names fails the pull.
func (r *resolved) image(ctx context.Context, ref name.Digest) (v1.Image, error) {
	desc, err := remote.Get(ref, r.options(ctx)...)
	if err != nil {
		return nil, pullError(err, "failed to pull artifact from '%s': %w", r.url, err)
	}
	r.checked = true
	if !desc.MediaType.IsIndex() {
		img, err := desc.Image()
		if err != nil {
			return nil, source.FailedWith(failure.Final, sourcev1.OCIPullFailedReason, "failed to pull artifact from '%s': %w", r.url, err)
		}
		return img, nil
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		return nil, source.FailedWith(failure.Final, sourcev1.OCIPullFailedReason, "failed to pull artifact from '%s': %w", r.url, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, source.FailedWith(failure.Final, sourcev1.OCIPullFailedReason,
			"failed to pull artifact from '%s': failed to parse image index: %w", r.url, err)
	}
	var seen []string
	for _, m := range im.Manifests {
		if m.Platform == nil {
			continue
		}
		if m.Platform.Satisfies(platform) && m.MediaType.IsImage() {
			img, err := idx.Image(m.Digest)
			if err != nil {
				return nil, pullError(err, "failed to pull artifact from '%s': %w", r.url, err)
			}
			return img, nil
		}
		seen = append(seen, m.Platform.String())
	}
	return nil, source.FailedWith(failure.Final, sourcev1.OCIPullFailedReason,
		"failed to pull artifact from '%s': the image index '%s' has no manifest for platform '%s' (it has: %s)",
		r.url, r.digest, platform.String(), strings.Join(seen, ", "))
}

// selectLayer finds the layer with mediaType, or the first layer when
// mediaType is empty, as Flux does.
func selectLayer(img v1.Image, mediaType string) (v1.Layer, error) {
	layerError := func(format string, args ...any) error {
		return source.FailedWith(failure.Final, sourcev1.OCILayerOperationFailedReason, format, args...)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, layerError("failed to parse artifact layers: %w", err)
	}
	if len(layers) < 1 {
		return nil, layerError("no layers found in artifact")
	}
	if mediaType == "" {
		return layers[0], nil
	}
	for i, l := range layers {
		mt, err := l.MediaType()
		if err != nil {
			return nil, layerError("failed to determine the media type of layer[%v] from artifact: %w", i, err)
		}
		if string(mt) == mediaType {
			return l, nil
		}
	}
	return nil, layerError("failed to find layer with media type '%s' in artifact", mediaType)
}

// pullError is a failed registry request in Flux's words, with reason
// OCIArtifactPullFailed: transient, but final when the registry answers
// that the request cannot succeed as it is (not found, unauthorized,
// forbidden, content that does not match its digest, a manifest over the
// size limit).
func pullError(err error, format string, args ...any) *failure.Error {
	handling := failure.Transient
	var terr *transport.Error
	if errors.As(err, &terr) && !terr.Temporary() {
		switch terr.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
			handling = failure.Final
		}
	}
	if digestMismatch(err) || errors.Is(err, errManifestTooLarge) {
		handling = failure.Final
	}
	return source.FailedWith(handling, sourcev1.OCIPullFailedReason, format, args...)
}

// digestMismatch reports whether err says the registry served content
// that does not match its digest or size (go-containerregistry's
// verification, whose error type is internal).
func digestMismatch(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "error verifying") || strings.Contains(msg, "does not match requested digest") ||
		strings.Contains(msg, "does not match expected size")
}
