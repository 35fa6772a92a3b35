package helmchartfetch

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/Masterminds/semver/v3"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/registry"

	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/cosign"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/helmindex"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/notation"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/registrylogin"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// ReasonChartVerification is Flux's reason (chart.ErrChartVerification)
// for a chart whose signature does not verify.
const ReasonChartVerification = "ChartVerificationError"

// userAgent identifies the fetcher to registries.
const userAgent = "headwater-fetcher"

// ociResolved is a chart version of an OCI HelmRepository.
type ociResolved struct {
	src     *Source
	spec    *sourcev1.HelmChartSpec
	repo    name.Repository // <host>/<path>/<chart>
	tag     string          // the chart version, as tagged ('+' as '_')
	version string          // the revision
	// remote are the registry's options (credentials, TLS).
	remote []remote.Option
	// verifier checks the chart's cosign signature; nil without
	// spec.verify.
	verifier *cosign.Verifier
	// notation checks the chart's notation signatures; nil without
	// spec.verify with provider notation.
	notation *notation.Verifier
	// access is how the registry is reached, for notation's requests.
	access *ociAccess
}

// resolveOCI picks the chart version in an OCI HelmRepository, as Flux's
// OCI chart repository: a version that is no range is taken as it is;
// otherwise the registry's tags are listed and the highest match picked.
// With spec.verify, the cosign public keys are read first.
func (s *Source) resolveOCI(ctx context.Context, req *events.FetchRequested) (source.Resolved, error) {
	spec, repoSpec := req.HelmChart, req.ChartSource.HelmRepository
	if !strings.HasPrefix(repoSpec.URL, "oci://") {
		return nil, source.StalledError(sourcev1.URLInvalidReason, "invalid OCI registry URL: %s", failure.RedactURL(repoSpec.URL))
	}
	namespace := req.Job.Object.Namespace
	access, err := s.ociAccess(ctx, namespace, repoSpec)
	if err != nil {
		return nil, err
	}
	r := &ociResolved{src: s, spec: spec, remote: access.options(), access: access}
	// One puller for the fetch's tag listing, manifest and layer: it keeps
	// what the registry told the first request (its authentication scheme,
	// a token), where go-containerregistry would ping the registry before
	// each operation again. NewPuller fails only on invalid options.
	if p, err := remote.NewPuller(r.remote...); err == nil {
		r.remote = append(r.remote, remote.Reuse(p))
	}
	ref := strings.TrimSuffix(strings.TrimPrefix(repoSpec.URL, "oci://"), "/") + "/" + spec.Chart
	var nameOpts []name.Option
	if repoSpec.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	if r.repo, err = name.NewRepository(ref, nameOpts...); err != nil {
		return nil, buildFailure(failure.Stalling, sourcev1.FetchFailedCondition, ReasonChartReference, "invalid chart reference",
			fmt.Errorf("invalid OCI chart reference '%s': %w", "oci://"+ref, err))
	}
	if v := spec.Verify; v != nil && v.Provider == notation.Provider {
		if r.notation, err = s.notationVerifier(ctx, namespace, req.Job.Object.Name, v); err != nil {
			return nil, err
		}
	} else if v != nil && v.Provider != "" {
		if r.verifier, err = s.chartVerifier(ctx, namespace, v); err != nil {
			return nil, err
		}
	}
	if err := r.pickTag(ctx, spec.Version); err != nil {
		return nil, err
	}
	version := r.version
	if len(spec.ValuesFiles) > 0 {
		if r.version, err = withMetadata(version, strconv.FormatInt(req.Job.Object.Generation, 10)); err != nil {
			return nil, buildFailure(failure.Stalling, sourcev1.FetchFailedCondition, ReasonChartReference, "invalid chart reference", err)
		}
	}
	return r, nil
}

// pickTag sets the chart version (and its tag) of r.repo: a version that
// is no range is taken as it is; otherwise the registry's tags are
// listed and the highest match picked.
func (r *ociResolved) pickTag(ctx context.Context, want string) error {
	version := want
	if _, err := semver.StrictNewVersion(version); err != nil {
		// The tags are listed with the fetch's context (Helm's registry
		// client lists them with a background one), so the listing ends
		// with the fetch and the fetch learns of a hold the registry asks
		// for (see package hostlimit).
		tags, err := remote.List(r.repo, append([]remote.Option{remote.WithContext(ctx)}, r.remote...)...)
		if err != nil {
			return buildFailure(failure.Transient, sourcev1.FetchFailedCondition, ReasonChartReference, "invalid chart reference",
				fmt.Errorf("failed to get chart version for remote reference: could not fetch tags for '%s': %w", "oci://"+r.repo.Name(), err))
		}
		cvs := make(helmindex.ChartVersions, 0, len(tags))
		for _, t := range tags {
			cvs = append(cvs, &helmindex.ChartVersion{Metadata: &chart.Metadata{Name: r.spec.Chart, Version: strings.ReplaceAll(t, "_", "+")}})
		}
		cv, err := pickVersion(cvs, r.spec.Chart, want)
		if err != nil {
			return err
		}
		version = cv.Version
	}
	r.tag = strings.ReplaceAll(version, "+", "_")
	r.version = version
	return nil
}

// chartVerifier reads spec.verify's cosign public keys, or its keyless
// identities (verified with the public Sigstore trusted root: a
// HelmChart's spec.verify has no trustedRootSecretRef in Flux's API), as
// Flux's makeVerifiers; a failure sets SourceVerified=False only.
// Providers other than cosign stall with a clear message (notation is
// notationVerifier's).
func (s *Source) chartVerifier(ctx context.Context, namespace string, v *sourcev1.HelmChartVerification) (*cosign.Verifier, error) {
	fail := func(h failure.Handling, provider string, err error) error {
		return source.VerificationFailed(v.Provider, h, sourcev1.VerificationError,
			fmt.Errorf("failed to verify the signature using provider '%s': %w", provider, err))
	}
	switch {
	case v.Provider != cosign.Provider:
		return nil, fail(failure.Stalling, v.Provider, fmt.Errorf("verification with provider '%s' is not supported yet", v.Provider))
	case v.SecretRef == nil:
		mode := v.Provider + " keyless"
		trusted, err := s.publicRoot().TrustedMaterial()
		if err != nil {
			return nil, fail(failure.Transient, mode, err)
		}
		identities := make([]cosign.Identity, 0, len(v.MatchOIDCIdentity))
		for _, m := range v.MatchOIDCIdentity {
			identities = append(identities, cosign.Identity{Issuer: m.Issuer, Subject: m.Subject})
		}
		verifier, err := cosign.NewKeylessVerifier(trusted, identities)
		if err != nil {
			return nil, fail(failure.Stalling, mode, err)
		}
		return verifier, nil
	}
	if s.Secrets == nil {
		return nil, fail(failure.Transient, v.Provider, fmt.Errorf("failed to get secret '%s/%s': %w", namespace, v.SecretRef.Name, secrets.ErrNoCluster))
	}
	data, err := s.Secrets.Get(ctx, namespace, v.SecretRef.Name)
	if err != nil {
		return nil, fail(failure.Transient, v.Provider, fmt.Errorf("failed to get secret '%s/%s': %w", namespace, v.SecretRef.Name, err))
	}
	verifier, err := cosign.NewVerifier(data)
	if err != nil {
		return nil, fail(failure.Stalling, v.Provider, fmt.Errorf("%w in secret '%s/%s'", err, namespace, v.SecretRef.Name))
	}
	return verifier, nil
}

// publicRoot is the public Sigstore trusted root keyless signatures of
// charts are verified with.
func (s *Source) publicRoot() *cosign.PublicRoot {
	if s.Sigstore != nil {
		return s.Sigstore
	}
	return cosign.Public()
}

// Revision is the chart version.
func (r *ociResolved) Revision() string { return r.version }

// Download pulls the chart's manifest, verifies its signature (with
// spec.verify, before anything else is pulled, as Flux), streams the
// chart layer into dir within -helm-chart-max-size, checks it, and keeps
// it as it is or packages it with the merged values files.
func (r *ociResolved) Download(ctx context.Context, dir string) (*source.Content, error) {
	p := filepath.Join(dir, ChartFile)
	ch, verification, err := r.pull(ctx, p)
	if err != nil {
		return nil, err
	}
	var content *source.Content
	if len(r.spec.ValuesFiles) == 0 {
		content = &source.Content{Root: dir, File: p, Revision: r.version, ArtifactName: fmt.Sprintf("%s-%s.tgz", ch.Name(), r.version),
			EventMessage: fmt.Sprintf("pulled '%s' chart with version '%s'", ch.Name(), r.version)}
	} else if content, err = r.src.packageContent(ch, r.spec, r.version, dir); err != nil {
		return nil, err
	}
	content.Verification = verification
	return content, nil
}

// pull pulls the chart's manifest, verifies its signature (with
// spec.verify, before anything else is pulled, as Flux), streams the
// chart layer to p and loads it.
func (r *ociResolved) pull(ctx context.Context, p string) (*chart.Chart, *events.Verification, error) {
	pullErr := func(h failure.Handling, err error) error {
		return buildFailure(h, sourcev1.FetchFailedCondition, ReasonChartPull, "chart pull error",
			fmt.Errorf("failed to download chart for remote reference: %w", err))
	}
	opts := append([]remote.Option{remote.WithContext(ctx)}, r.remote...)
	desc, err := remote.Get(r.repo.Tag(r.tag), opts...)
	if err != nil {
		return nil, nil, pullErr(registryHandling(err), err)
	}
	verification, err := r.verify(ctx, desc.Digest, opts)
	if err != nil {
		return nil, nil, err
	}
	img, err := desc.Image()
	if err != nil {
		return nil, nil, pullErr(failure.Final, err)
	}
	if err := r.pullLayer(img, p); err != nil {
		return nil, nil, err
	}
	ch, err := load(p)
	if err != nil {
		return nil, nil, buildFailure(failure.Final, sourcev1.FetchFailedCondition, ReasonChartPull, "chart pull error", err)
	}
	return ch, verification, nil
}

// verify checks the cosign signature of the manifest digest, as Flux's
// OCI chart repository: nil without spec.verify; a chart that no key
// signed fails with BuildFailed (ChartVerificationError) and
// SourceVerified=False (VerificationError).
func (r *ociResolved) verify(ctx context.Context, digest v1.Hash, opts []remote.Option) (*events.Verification, error) {
	if r.notation != nil {
		return r.verifyNotation(ctx, digest)
	}
	if r.verifier == nil {
		return nil, nil
	}
	ref := r.repo.Tag(r.tag)
	fail := func(h failure.Handling, err error) error {
		f := source.VerificationFailed(cosign.Provider, h, sourcev1.VerificationError, fmt.Errorf("chart verification error: %w", err))
		f.Condition, f.Reason = sourcev1.BuildFailedCondition, ReasonChartVerification
		return f
	}
	err := r.verifier.Verify(ctx, r.repo, digest, opts...)
	var sigErr *cosign.SignaturesError
	var noMatch *cosign.NoMatchError
	switch {
	case err == nil:
		return &events.Verification{Mode: cosign.Provider, Verified: true, Reason: meta.SucceededReason,
			Message: fmt.Sprintf("verified signature of version %s", r.version)}, nil
	case errors.As(err, &noMatch):
		return nil, fail(failure.Final, fmt.Errorf("no matching signatures were found for '%s'%s", ref.Name(), noMatch.Detail()))
	case errors.Is(err, cosign.ErrNoMatch), errors.As(err, &sigErr) && registryHandling(err) == failure.Final:
		// A registry that has no signature image: nothing signed the chart.
		return nil, fail(failure.Final, fmt.Errorf("no matching signatures were found for '%s'", ref.Name()))
	case sigErr != nil:
		return nil, fail(failure.Transient, fmt.Errorf("failed to verify oci://%s: %w", ref.Name(), err))
	}
	return nil, fail(failure.Final, fmt.Errorf("failed to verify oci://%s: %w", ref.Name(), err))
}

// pullLayer streams the chart layer of img (Helm's chart media type, or
// the legacy one) to p, refusing a chart over -helm-chart-max-size from
// the manifest's size before downloading, and while it streams.
func (r *ociResolved) pullLayer(img v1.Image, p string) error {
	pullErr := func(h failure.Handling, err error) error {
		return buildFailure(h, sourcev1.FetchFailedCondition, ReasonChartPull, "chart pull error",
			fmt.Errorf("failed to download chart for remote reference: %w", err))
	}
	m, err := img.Manifest()
	if err != nil {
		return pullErr(failure.Final, err)
	}
	if m.Config.MediaType != registry.ConfigMediaType {
		return pullErr(failure.Final, fmt.Errorf("could not load config with mediatype %s", registry.ConfigMediaType))
	}
	var layer *v1.Descriptor
	for i, l := range m.Layers {
		if l.MediaType == registry.ChartLayerMediaType || l.MediaType == registry.LegacyChartLayerMediaType {
			layer = &m.Layers[i]
			break
		}
	}
	if layer == nil {
		return pullErr(failure.Final, fmt.Errorf("manifest does not contain a layer with mediatype %s", registry.ChartLayerMediaType))
	}
	limit := r.src.maxChartSize()
	tooLarge := buildFailure(failure.Final, sourcev1.FetchFailedCondition, ReasonChartPull, "chart pull error",
		fmt.Errorf("chart '%s' version '%s' is larger than the maximum chart size of %d bytes (-helm-chart-max-size)", r.spec.Chart, r.tag, limit))
	if layer.Size > limit {
		return tooLarge
	}
	l, err := img.LayerByDigest(layer.Digest)
	if err != nil {
		return pullErr(failure.Final, err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return pullErr(registryHandling(err), err)
	}
	defer rc.Close()
	f, err := os.Create(p)
	if err != nil {
		return &failure.Error{Condition: sourcev1.StorageOperationFailedCondition, Reason: sourcev1.DirCreationFailedReason,
			Err: fmt.Errorf("failed to create chart file: %w", err)}
	}
	n, err := io.Copy(f, io.LimitReader(rc, limit+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case n > limit:
		return tooLarge
	case err != nil:
		return pullErr(registryHandling(err), err)
	}
	return nil
}

// registryHandling is how to handle a failed registry request: final when
// the registry answered that it cannot succeed as it is (not found,
// unauthorized, forbidden) or served content that does not match its
// digest, transient otherwise.
func registryHandling(err error) failure.Handling {
	var terr *transport.Error
	if errors.As(err, &terr) && !terr.Temporary() {
		switch terr.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
			return failure.Final
		}
	}
	if msg := err.Error(); strings.Contains(msg, "error verifying") || strings.Contains(msg, "does not match") {
		return failure.Final
	}
	return failure.Transient
}

// ociAccess is how an OCI HelmRepository is reached: its credentials and
// TLS settings.
type ociAccess struct {
	username, password string
	// transport carries every request to the registry (tags, manifests,
	// layers, signatures), through the limits of its host.
	transport http.RoundTripper
}

// options are go-containerregistry's options for the access.
func (a *ociAccess) options() []remote.Option {
	return []remote.Option{remote.WithAuth(a.auth()), remote.WithTransport(a.transport), remote.WithUserAgent(userAgent)}
}

// auth are the access's credentials for go-containerregistry.
func (a *ociAccess) auth() authn.Authenticator {
	if a.username != "" || a.password != "" {
		return &authn.Basic{Username: a.username, Password: a.password}
	}
	return authn.Anonymous
}

// ociAccess reads an OCI HelmRepository's access with Flux's rules: basic
// auth from spec.secretRef (username and password, or a
// .dockerconfigjson entry for the registry's host), TLS from
// spec.certSecretRef; without a secretRef, spec.provider aws, azure or gcp
// logs in with the fetcher's cloud identity (see package registrylogin),
// or the default ServiceAccount's of the namespace (package
// workloadidentity).
func (s *Source) ociAccess(ctx context.Context, namespace string, spec *sourcev1.HelmRepositorySpec) (*ociAccess, error) {
	switch spec.Provider {
	case "", sourcev1.GenericOCIProvider, registrylogin.AWS, registrylogin.Azure, registrylogin.GCP:
	default:
		return nil, source.StalledError(source.UnsupportedProviderReason,
			"OCI provider '%s' is not supported: use 'generic', 'aws', 'azure' or 'gcp'", spec.Provider)
	}
	host := strings.SplitN(strings.TrimPrefix(spec.URL, "oci://"), "/", 2)[0]
	get := func(name string) (map[string][]byte, error) {
		if s.Secrets == nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason, "failed to get secret '%s/%s': %w", namespace, name, secrets.ErrNoCluster)
		}
		data, err := s.Secrets.Get(ctx, namespace, name)
		if err != nil {
			return nil, source.Failed(sourcev1.AuthenticationFailedReason, "failed to get secret '%s/%s': %w", namespace, name, err)
		}
		return data, nil
	}
	base := egress.Transport()
	a := &ociAccess{transport: hostlimit.Wrap(base, s.transports.Limiter)}
	if ref := spec.SecretRef; ref != nil {
		data, err := get(ref.Name)
		if err != nil {
			return nil, err
		}
		if a.username, a.password, err = registryCredentials(data, host); err != nil {
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason, "invalid '%s' secret data: %w", ref.Name, err)
		}
	}
	if ref := spec.CertSecretRef; ref != nil {
		data, err := get(ref.Name)
		if err != nil {
			return nil, err
		}
		if base.TLSClientConfig, err = secrets.TLSConfig(data, namespace+"/"+ref.Name); err != nil {
			return nil, source.StalledError(sourcev1.AuthenticationFailedReason, "failed to construct Helm client's TLS config: %w", err)
		}
	}
	if p := spec.Provider; spec.SecretRef == nil && p != "" && p != sourcev1.GenericOCIProvider {
		// As Flux: the provider's login only without a secretRef.
		login := s.Cloud
		if login == nil {
			login = &registrylogin.Login{}
		}
		// A HelmRepository names no ServiceAccount: only the default one
		// (-default-service-account, under the gate) applies, as in Flux.
		account, err := s.Accounts.Resolve(ctx, namespace, "")
		if err != nil {
			return nil, err
		}
		cfg, err := login.Credentials(ctx, p, namespace, host, nil, account)
		if err != nil {
			return nil, source.FailedWith(registrylogin.Handling(err), sourcev1.AuthenticationFailedReason,
				"failed to get credential from '%s': %w", p, err)
		}
		a.username, a.password = cfg.Username, cfg.Password
	}
	return a, nil
}

// registryCredentials reads basic auth from a Secret: username and
// password, or the .dockerconfigjson entry for host.
func registryCredentials(data map[string][]byte, host string) (string, string, error) {
	if u, ok := data["username"]; ok {
		return string(u), string(data["password"]), nil
	}
	raw, ok := data[".dockerconfigjson"]
	if !ok {
		return "", "", fmt.Errorf("required fields 'username' and 'password', or '.dockerconfigjson'")
	}
	var cfg struct {
		Auths map[string]struct {
			Username, Password, Auth string
		} `json:"auths"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return "", "", fmt.Errorf("'.dockerconfigjson' is not a Docker config: %w", err)
	}
	a, ok := cfg.Auths[host]
	if !ok {
		return "", "", nil // anonymous for this host
	}
	if a.Username == "" && a.Auth != "" {
		b, err := base64.StdEncoding.DecodeString(a.Auth)
		if err != nil {
			return "", "", fmt.Errorf("'.dockerconfigjson' auth for '%s' is not base64", host)
		}
		u, p, _ := strings.Cut(string(b), ":")
		return u, p, nil
	}
	return a.Username, a.Password, nil
}
