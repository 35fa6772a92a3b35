package helmchartfetch

import (
	"context"
	"encoding/base64"
	"encoding/json"
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
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/registry"
	"helm.sh/helm/v3/pkg/repo"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// ociResolved is a chart version of an OCI HelmRepository.
type ociResolved struct {
	src     *Source
	client  *registry.Client
	spec    *sourcev1.HelmChartSpec
	ref     string // <host>/<path>/<chart>, without the scheme
	tag     string // the chart version, as tagged ('+' as '_')
	version string // the revision
	cleanup func()
}

// resolveOCI picks the chart version in an OCI HelmRepository, as Flux's
// OCI chart repository: a version that is no range is taken as it is;
// otherwise the registry's tags are listed and the highest match picked.
func (s *Source) resolveOCI(ctx context.Context, req *events.FetchRequested) (source.Resolved, error) {
	spec, repoSpec := req.HelmChart, req.ChartSource.HelmRepository
	if v := spec.Verify; v != nil && v.Provider != "" {
		// Flux verifies OCI charts' signatures; a chart must not be served
		// as if it had been.
		return nil, source.StalledError(sourcev1.VerificationError,
			"verifying charts' signatures (spec.verify, provider '%s') is not supported yet: remove spec.verify to pull without verification",
			v.Provider)
	}
	if !strings.HasPrefix(repoSpec.URL, "oci://") {
		return nil, source.StalledError(sourcev1.URLInvalidReason, "invalid OCI registry URL: %s", failure.RedactURL(repoSpec.URL))
	}
	client, cleanup, err := s.registryClient(ctx, req.Job.Object.Namespace, repoSpec)
	if err != nil {
		return nil, err
	}
	r := &ociResolved{src: s, client: client, spec: spec, cleanup: cleanup,
		ref: strings.TrimSuffix(strings.TrimPrefix(repoSpec.URL, "oci://"), "/") + "/" + spec.Chart}
	version := spec.Version
	if _, err := semver.StrictNewVersion(version); err != nil {
		tags, err := client.Tags(r.ref)
		if err != nil {
			cleanup()
			return nil, buildFailure(failure.Transient, sourcev1.FetchFailedCondition, ReasonChartReference, "invalid chart reference",
				fmt.Errorf("failed to get chart version for remote reference: could not fetch tags for '%s': %w", "oci://"+r.ref, err))
		}
		cvs := make(repo.ChartVersions, 0, len(tags))
		for _, t := range tags {
			cvs = append(cvs, &repo.ChartVersion{Metadata: &chart.Metadata{Name: spec.Chart, Version: strings.ReplaceAll(t, "_", "+")}})
		}
		cv, err := pickVersion(cvs, spec.Chart, spec.Version)
		if err != nil {
			cleanup()
			return nil, err
		}
		version = cv.Version
	}
	r.tag = strings.ReplaceAll(version, "+", "_")
	r.version = version
	if len(spec.ValuesFiles) > 0 {
		if r.version, err = withMetadata(version, strconv.FormatInt(req.Job.Object.Generation, 10)); err != nil {
			cleanup()
			return nil, buildFailure(failure.Stalling, sourcev1.FetchFailedCondition, ReasonChartReference, "invalid chart reference", err)
		}
	}
	return r, nil
}

// Revision is the chart version.
func (r *ociResolved) Revision() string { return r.version }

// Close removes the registry client's credentials file.
func (r *ociResolved) Close() error {
	r.cleanup()
	return nil
}

// Download pulls the chart with Helm's registry client, checks it, and
// keeps it as it is or packages it with the merged values files.
func (r *ociResolved) Download(_ context.Context, dir string) (*source.Content, error) {
	pullErr := func(h failure.Handling, err error) error {
		return buildFailure(h, sourcev1.FetchFailedCondition, ReasonChartPull, "chart pull error", err)
	}
	res, err := r.client.Pull(r.ref+":"+r.tag, registry.PullOptWithChart(true))
	if err != nil {
		return nil, pullErr(failure.Transient, fmt.Errorf("failed to download chart for remote reference: %w", err))
	}
	if int64(len(res.Chart.Data)) > r.src.maxChartSize() {
		return nil, pullErr(failure.Final, fmt.Errorf("chart '%s' version '%s' is larger than the maximum chart size of %d bytes (-helm-chart-max-size)",
			r.spec.Chart, r.tag, r.src.maxChartSize()))
	}
	p := filepath.Join(dir, ChartFile)
	if err := os.WriteFile(p, res.Chart.Data, 0o600); err != nil {
		return nil, &failure.Error{Condition: sourcev1.StorageOperationFailedCondition, Reason: sourcev1.DirCreationFailedReason,
			Err: fmt.Errorf("failed to write chart file: %w", err)}
	}
	ch, err := load(p)
	if err != nil {
		return nil, pullErr(failure.Final, err)
	}
	if len(r.spec.ValuesFiles) == 0 {
		return &source.Content{Root: dir, File: p, Revision: r.version, ArtifactName: fmt.Sprintf("%s-%s.tgz", ch.Name(), r.version),
			EventMessage: fmt.Sprintf("pulled '%s' chart with version '%s'", ch.Name(), r.version)}, nil
	}
	return packageContent(ch, r.spec, r.version, dir)
}

// registryClient is Helm's registry client for an OCI HelmRepository, with
// Flux's rules: basic auth from spec.secretRef (username and password, or
// a .dockerconfigjson entry for the registry's host), TLS from
// spec.certSecretRef, plain HTTP with spec.insecure. Credentials go to a
// temporary credentials file that cleanup removes, never to the user's.
func (s *Source) registryClient(ctx context.Context, namespace string, spec *sourcev1.HelmRepositorySpec) (*registry.Client, func(), error) {
	switch spec.Provider {
	case "", sourcev1.GenericOCIProvider:
	default:
		return nil, nil, source.StalledError(source.UnsupportedProviderReason,
			"OCI provider '%s' is not supported yet: use provider 'generic' with a secretRef", spec.Provider)
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
	var username, password string
	if ref := spec.SecretRef; ref != nil {
		data, err := get(ref.Name)
		if err != nil {
			return nil, nil, err
		}
		if username, password, err = registryCredentials(data, host); err != nil {
			return nil, nil, source.StalledError(sourcev1.AuthenticationFailedReason, "invalid '%s' secret data: %w", ref.Name, err)
		}
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	if ref := spec.CertSecretRef; ref != nil {
		data, err := get(ref.Name)
		if err != nil {
			return nil, nil, err
		}
		if transport.TLSClientConfig, err = secrets.TLSConfig(data, namespace+"/"+ref.Name); err != nil {
			return nil, nil, source.StalledError(sourcev1.AuthenticationFailedReason, "failed to construct Helm client's TLS config: %w", err)
		}
	}
	f, err := os.CreateTemp("", "helm-registry-credentials-")
	if err != nil {
		return nil, nil, fmt.Errorf("registry credentials file: %w", err)
	}
	f.Close()
	os.Remove(f.Name())
	cleanup := func() { os.Remove(f.Name()) }
	opts := []registry.ClientOption{registry.ClientOptWriter(io.Discard), registry.ClientOptCredentialsFile(f.Name()),
		registry.ClientOptHTTPClient(&http.Client{Transport: transport})}
	if spec.Insecure {
		opts = append(opts, registry.ClientOptPlainHTTP())
	}
	if username != "" || password != "" {
		opts = append(opts, registry.ClientOptBasicAuth(username, password))
	}
	client, err := registry.NewClient(opts...)
	if err != nil {
		cleanup()
		return nil, nil, source.StalledError(meta.FailedReason, "failed to construct Helm client: %w", err)
	}
	return client, cleanup, nil
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
