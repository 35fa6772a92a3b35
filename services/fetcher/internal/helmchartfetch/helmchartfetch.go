// Package helmchartfetch fetches HelmCharts as Flux's chart builders do.
// From a HelmRepository (type default), as Flux's remote builder:
// resolving reads only the chart's entry from the stored index (package
// helmindex), picks the highest version matching spec.version, and is
// unchanged when the stored artifact holds it; downloading fetches the
// chart archive from the repository with its Secrets, within
// -helm-chart-max-size, checks it with the Helm loader (paths, file sizes,
// decompressed size) and either keeps it as it is (ChartPullSucceeded) or,
// with spec.valuesFiles, merges them into its default values and packages
// it again (ChartPackageSucceeded). From a GitRepository or a Bucket, as
// Flux's local builder: the chart is read from the source's artifact at
// spec.chart, its dependencies are built (file:// ones from the same
// artifact, repository ones through the namespace's HelmRepositories) and
// it is packaged. Revisions, names, reasons and messages are Flux's.
package helmchartfetch

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/Masterminds/semver/v3"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"sigs.k8s.io/yaml"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/compose"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/cosign"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/helmfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/helmindex"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/registrylogin"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
)

// Kind is the source kind this package fetches.
const Kind = sourcev1.HelmChartKind

// Defaults of the limits, as Flux's -helm-chart-max-size and
// -helm-chart-file-max-size.
const (
	DefaultMaxChartSize     = 10 << 20
	DefaultMaxChartFileSize = 5 << 20
)

// ChartFile is the name of the chart archive in the download directory.
const ChartFile = "chart.tgz"

// Flux's build failure reasons (internal/helm/chart.BuildErrorReason), and
// the summaries its messages start with.
const (
	ReasonChartReference = "InvalidChartReference"
	ReasonChartPull      = "ChartPullError"
	ReasonValuesFiles    = "ValuesFilesError"
	ReasonChartPackage   = "ChartPackageError"
)

// Source fetches HelmCharts from HelmRepositories.
type Source struct {
	// Secrets reads the HelmRepository's Secrets.
	Secrets secrets.Reader
	// Storage holds the HelmRepository's stored index.
	Storage storage.Storage
	// MaxChartSize bounds a chart archive; DefaultMaxChartSize when not
	// positive.
	MaxChartSize int64
	// Indexes fetch the index of a dependency's repository that is no
	// HelmRepository of the namespace; nil refuses such dependencies.
	Indexes *helmfetch.Source
	// Cloud logs in to the registries of an OCI HelmRepository's
	// spec.provider aws, azure and gcp with the fetcher's own identity;
	// nil logs in with the process's environment and caches nothing.
	Cloud *registrylogin.Login
	// Accounts give cloud logins the identity of a source's
	// ServiceAccount under the ObjectLevelWorkloadIdentity gate (package
	// workloadidentity); nil: the gate is off.
	Accounts *workloadidentity.Accounts
	// Sigstore is the public Sigstore trusted root of keyless chart
	// verification; cosign.Public() when nil.
	Sigstore *cosign.PublicRoot

	transports helmfetch.Transports
}

// Limit passes every request of the charts' downloads (chart
// repositories, dependencies' indexes, OCI registries) through l, the
// limits of its host (see package hostlimit). Call it before the first
// fetch.
func (s *Source) Limit(l *hostlimit.Limiter) { s.transports.Limiter = l }

// SetMaxChartFileSize bounds every file of a chart, decompressed (the Helm
// loader's limit, which is process-wide).
func SetMaxChartFileSize(n int64) {
	if n > 0 {
		loader.MaxDecompressedFileSize = n
	}
}

var (
	_ source.Source    = (*Source)(nil)
	_ source.Shareable = (*resolved)(nil)
)

// Timeout is the HelmRepository's spec.timeout, 60s when unset, as Flux.
func (s *Source) Timeout(req *events.FetchRequested) time.Duration {
	if cs := req.ChartSource; cs != nil && cs.HelmRepository != nil {
		return source.TimeoutOf(cs.HelmRepository.Timeout)
	}
	return source.DefaultTimeout
}

func (s *Source) maxChartSize() int64 {
	if s.MaxChartSize > 0 {
		return s.MaxChartSize
	}
	return DefaultMaxChartSize
}

// buildFailure is a failure in Flux's words: "<summary>: <cause>".
func buildFailure(h failure.Handling, condition, reason, summary string, err error) *failure.Error {
	return &failure.Error{Handling: h, Condition: condition, Reason: reason, Err: fmt.Errorf("%s: %w", summary, err)}
}

// Resolve reads the chart's entry from the HelmRepository's stored index
// and picks the version: the revision is that version, with the
// HelmChart's generation as build metadata when values files are merged
// (Flux's rule, so a change of them is a new revision).
func (s *Source) Resolve(ctx context.Context, req *events.FetchRequested) (source.Resolved, error) {
	spec, cs := req.HelmChart, req.ChartSource
	if spec == nil || cs == nil {
		return nil, source.MissingSpec(req, "HelmChart spec or source")
	}
	switch {
	case cs.Kind == sourcev1.GitRepositoryKind || cs.Kind == sourcev1.BucketKind:
		return s.resolveTarball(ctx, req)
	case cs.Kind == sourcev1.HelmRepositoryKind && cs.HelmRepository != nil && cs.HelmRepository.Type == sourcev1.HelmRepositoryTypeOCI:
		return s.resolveOCI(ctx, req)
	case cs.Kind != sourcev1.HelmRepositoryKind || cs.HelmRepository == nil:
		return nil, source.StalledError("UnsupportedSourceKind", "charts from %s sources are not supported", cs.Kind)
	}
	access, err := helmfetch.NewAccess(ctx, s.Secrets, &s.transports, req.Job.Object.Namespace, cs.HelmRepository)
	if err != nil {
		return nil, err
	}
	cv, err := s.version(ctx, cs.Artifact.Path, spec.Chart, spec.Version)
	if err != nil {
		return nil, err
	}
	r := &resolved{src: s, access: access, spec: spec, entry: cv, version: cv.Version}
	if len(spec.ValuesFiles) > 0 {
		v, err := withMetadata(cv.Version, strconv.FormatInt(req.Job.Object.Generation, 10))
		if err != nil {
			return nil, buildFailure(failure.Stalling, sourcev1.FetchFailedCondition, ReasonChartReference, "invalid chart reference", err)
		}
		r.version = v
	}
	return r, nil
}

// version finds the chart's entry in the stored index and picks the
// version as Flux's ChartRepository.GetChartVersion: an exact match
// first, else the highest that satisfies the constraint (default "*":
// the latest stable), ties broken by creation time.
func (s *Source) version(ctx context.Context, indexPath, name, want string) (*helmindex.ChartVersion, error) {
	obj, err := s.Storage.Open(ctx, indexPath)
	if err != nil {
		return nil, &failure.Error{Condition: sourcev1.StorageOperationFailedCondition, Reason: sourcev1.ReadOperationFailedReason,
			Err: fmt.Errorf("failed to read the HelmRepository index '%s': %w", indexPath, err)}
	}
	defer obj.Close()
	cvs, err := helmindex.Versions(obj, name)
	if err != nil {
		return nil, buildFailure(failure.Transient, sourcev1.FetchFailedCondition, ReasonChartReference, "invalid chart reference",
			fmt.Errorf("failed to load the stored index: %w", err))
	}
	return pickVersion(cvs, name, want)
}

// pickVersion picks a version among a chart's entries (see version).
func pickVersion(cvs helmindex.ChartVersions, name, want string) (*helmindex.ChartVersion, error) {
	fail := func(err error) error {
		return buildFailure(failure.Stalling, sourcev1.FetchFailedCondition, ReasonChartReference, "invalid chart reference",
			fmt.Errorf("failed to get chart version for remote reference: %w", err))
	}
	if len(cvs) == 0 {
		return nil, fail(fmt.Errorf("no chart name found: no chart '%s' in the repository index", name))
	}
	if want != "" {
		for _, cv := range cvs {
			if cv.Version == want {
				return cv, nil
			}
		}
	}
	constraint := "*"
	if want != "" {
		constraint = want
	}
	c, err := semver.NewConstraint(constraint)
	if err != nil {
		return nil, fail(err)
	}
	type match struct {
		v  *semver.Version
		cv *helmindex.ChartVersion
	}
	var matches []match
	for _, cv := range cvs {
		v, err := semver.NewVersion(cv.Version)
		if err != nil || !c.Check(v) {
			continue
		}
		matches = append(matches, match{v, cv})
	}
	if len(matches) == 0 {
		return nil, fail(fmt.Errorf("no '%s' chart with version matching '%s' found", name, constraint))
	}
	sort.SliceStable(matches, func(i, j int) bool {
		if !matches[i].v.Equal(matches[j].v) {
			return matches[j].v.LessThan(matches[i].v)
		}
		return matches[j].cv.Created.Before(matches[i].cv.Created)
	})
	return matches[0].cv, nil
}

// withMetadata appends build metadata to a version, after any it has.
func withMetadata(version, metadata string) (string, error) {
	v, err := semver.NewVersion(version)
	if err != nil {
		return "", err
	}
	if m := v.Metadata(); m != "" {
		metadata = m + "." + metadata
	}
	nv, err := v.SetMetadata(metadata)
	if err != nil {
		return "", err
	}
	return nv.Original(), nil
}

// resolved is a chart version picked from the index.
type resolved struct {
	src     *Source
	access  *helmfetch.Access
	spec    *sourcev1.HelmChartSpec
	entry   *helmindex.ChartVersion
	version string // the revision: the entry's version, maybe with metadata
}

// Revision is the chart version (Flux's HelmChart revision).
func (r *resolved) Revision() string { return r.version }

// ContentIdentity is the chart archive (its URL and digest in the index)
// and what is done to it (values files), and the credentials it is read
// with: charts are shared only between HelmCharts whose HelmRepositories
// authenticate the same way.
func (r *resolved) ContentIdentity() ([]string, bool) {
	u, err := r.chartURL()
	if err != nil {
		return nil, false
	}
	return append([]string{"chart", u, r.entry.Digest, r.access.Fingerprint, strconv.FormatBool(r.spec.IgnoreMissingValuesFiles)},
		r.spec.ValuesFiles...), true
}

// ProveAccess has nothing to do: the content is shared only between
// sources with the same credentials (see ContentIdentity).
func (r *resolved) ProveAccess(context.Context) error { return nil }

// chartURL is the entry's first URL, resolved against the repository's.
func chartURL(a *helmfetch.Access, cv *helmindex.ChartVersion) (string, error) {
	if len(cv.URLs) == 0 {
		return "", fmt.Errorf("chart '%s' version '%s' has no downloadable URLs", cv.Name, cv.Version)
	}
	ref, err := url.Parse(cv.URLs[0])
	if err != nil {
		return "", fmt.Errorf("invalid chart URL format '%s': %w", cv.URLs[0], err)
	}
	return a.URL.ResolveReference(ref).String(), nil
}

func (r *resolved) chartURL() (string, error) { return chartURL(r.access, r.entry) }

// Download fetches the chart archive into dir and checks it; with values
// files, merges them and packages the chart again.
func (r *resolved) Download(ctx context.Context, dir string) (*source.Content, error) {
	p := filepath.Join(dir, ChartFile)
	ch, err := r.src.pull(ctx, r.access, r.entry, p)
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("%s-%s.tgz", ch.Name(), r.version)
	if len(r.spec.ValuesFiles) == 0 {
		return &source.Content{Root: dir, File: p, Revision: r.version, ArtifactName: name,
			EventMessage: fmt.Sprintf("pulled '%s' chart with version '%s'", ch.Name(), r.version)}, nil
	}
	return r.src.packageContent(ch, r.spec, r.version, dir)
}

// packageContent merges the spec's values files into ch and packages it
// with version into dir. A package over -helm-chart-max-size fails, as a
// pulled chart does: the limit bounds every chart stored, whatever its
// source.
func (s *Source) packageContent(ch *chart.Chart, spec *sourcev1.HelmChartSpec, version, dir string) (*source.Content, error) {
	merged, err := MergeValues(ch, spec.ValuesFiles, spec.IgnoreMissingValuesFiles)
	if err != nil {
		return nil, buildFailure(failure.Stalling, sourcev1.BuildFailedCondition, ReasonValuesFiles, "values files merge error", err)
	}
	values := merged.Values
	if len(spec.ValuesFiles) == 0 {
		// Nothing to merge: the chart keeps its own values.yaml.
		values = nil
	}
	p := filepath.Join(dir, ChartFile)
	if err := Package(ch, version, values, p); err != nil {
		return nil, buildFailure(failure.Final, sourcev1.BuildFailedCondition, ReasonChartPackage, "chart package error", err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, buildFailure(failure.Final, sourcev1.BuildFailedCondition, ReasonChartPackage, "chart package error", err)
	}
	if limit := s.maxChartSize(); fi.Size() > limit {
		return nil, buildFailure(failure.Final, sourcev1.BuildFailedCondition, ReasonChartPackage, "chart package error",
			fmt.Errorf("packaged chart '%s' version '%s' is %d bytes, larger than the maximum chart size of %d bytes (-helm-chart-max-size)",
				ch.Name(), version, fi.Size(), limit))
	}
	msg := fmt.Sprintf("packaged '%s' chart with version '%s'", ch.Name(), version)
	if len(merged.Files) > 0 {
		msg += fmt.Sprintf(" and merged values files %v", merged.Files)
	}
	return &source.Content{Root: dir, File: p, Revision: version, ArtifactName: fmt.Sprintf("%s-%s.tgz", ch.Name(), version),
		EventMessage: msg}, nil
}

// pull downloads the chart archive of cv from the repository of a to p,
// within the chart size limit, and loads it (checking it).
func (s *Source) pull(ctx context.Context, a *helmfetch.Access, cv *helmindex.ChartVersion, p string) (*chart.Chart, error) {
	pullErr := func(h failure.Handling, err error) error {
		return buildFailure(h, sourcev1.FetchFailedCondition, ReasonChartPull, "chart pull error", err)
	}
	u, err := chartURL(a, cv)
	if err != nil {
		return nil, pullErr(failure.Final, err)
	}
	resp, err := a.Get(ctx, u, nil)
	if err != nil {
		return nil, pullErr(failure.Transient, fmt.Errorf("failed to download chart for remote reference: %w", err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, pullErr(failure.Transient, fmt.Errorf("failed to download chart for remote reference: failed to fetch %s : %s",
			failure.RedactURL(u), resp.Status))
	}
	limit := s.maxChartSize()
	tooLarge := pullErr(failure.Final, fmt.Errorf("chart '%s' version '%s' is larger than the maximum chart size of %d bytes (-helm-chart-max-size)",
		cv.Name, cv.Version, limit))
	if resp.ContentLength > limit {
		return nil, tooLarge
	}
	f, err := os.Create(p)
	if err != nil {
		return nil, &failure.Error{Condition: sourcev1.StorageOperationFailedCondition, Reason: sourcev1.DirCreationFailedReason,
			Err: fmt.Errorf("failed to create chart file: %w", err)}
	}
	n, err := io.Copy(f, io.LimitReader(resp.Body, limit+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, pullErr(failure.Transient, fmt.Errorf("failed to download chart for remote reference: %w", err))
	}
	if n > limit {
		return nil, tooLarge
	}
	ch, err := load(p)
	if err != nil {
		return nil, pullErr(failure.Final, err)
	}
	if ch.Metadata.Name != cv.Name || ch.Metadata.Version != cv.Version {
		return nil, pullErr(failure.Final, fmt.Errorf("downloaded chart is '%s' version '%s', the index says '%s' version '%s'",
			ch.Metadata.Name, ch.Metadata.Version, cv.Name, cv.Version))
	}
	return ch, nil
}

// load loads a chart archive with the Helm loader, which refuses files or
// archives over its limits, after checkEntryNames has refused absolute and
// climbing paths.
func load(p string) (*chart.Chart, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := checkEntryNames(f); err != nil {
		return nil, fmt.Errorf("failed to load chart: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	ch, err := loader.LoadArchive(f)
	if err != nil {
		return nil, fmt.Errorf("failed to load chart: %w", err)
	}
	if err := ch.Validate(); err != nil {
		return nil, fmt.Errorf("invalid chart: %w", err)
	}
	return ch, nil
}

// checkEntryNames refuses a chart archive holding an entry whose name is
// absolute or climbs out of the chart ('..'). The Helm loader drops the
// first element of every name, so it loads "/etc/passwd" as the chart's
// "etc/passwd"; but a pulled chart is stored as served, and every consumer
// of the artifact would get the entry as it is. It reads headers only, and
// stops where the archive goes over the loader's limits (which the loader
// then refuses) or is no tar+gzip (which the loader reports).
func checkEntryNames(r io.Reader) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	remaining := loader.MaxDecompressedChartSize
	for {
		hdr, err := tr.Next()
		if err != nil {
			return nil
		}
		if _, err := archive.SafeName(hdr.Name); err != nil {
			return fmt.Errorf("chart illegally contains an entry outside the chart: %w", err)
		}
		remaining -= hdr.Size
		if hdr.Size > loader.MaxDecompressedFileSize || remaining < 0 {
			return nil
		}
	}
}

// Merged is the result of merging values files.
type Merged struct {
	// Values are the merged values.
	Values map[string]any
	// Files are the values files merged, in order (missing ones that were
	// ignored left out).
	Files []string
}

// MergeValues merges the chart's values files in order, later ones
// winning key by key (Flux's mergeChartValues). A file that does not
// exist fails unless ignoreMissing.
func MergeValues(ch *chart.Chart, files []string, ignoreMissing bool) (*Merged, error) {
	out := &Merged{Values: map[string]any{}}
	for _, p := range files {
		var raw []byte
		if p == chartutil.ValuesfileName {
			for _, f := range ch.Raw {
				if f.Name == chartutil.ValuesfileName {
					raw = f.Data
				}
			}
			if raw == nil {
				b, err := yaml.Marshal(ch.Values)
				if err != nil {
					return nil, err
				}
				raw = b
			}
		} else {
			i := slices.IndexFunc(ch.Files, func(f *chart.File) bool { return f.Name == p })
			if i < 0 {
				if ignoreMissing {
					continue
				}
				return nil, fmt.Errorf("no values file found at path '%s' (reference '%s')", p, p)
			}
			raw = ch.Files[i].Data
		}
		values := map[string]any{}
		if err := yaml.Unmarshal(raw, &values); err != nil {
			return nil, fmt.Errorf("unmarshaling values from '%s' failed: %w", p, err)
		}
		out.Values = compose.MergeValues(out.Values, values)
		out.Files = append(out.Files, p)
	}
	return out, nil
}

// Package writes ch with values as its default values (nil: its own,
// unchanged) and version as its version to path, as `helm package` does.
func Package(ch *chart.Chart, version string, values map[string]any, path string) error {
	if values != nil {
		b, err := yaml.Marshal(values)
		if err != nil {
			return err
		}
		ch.Values = values
		replaced := false
		for _, f := range ch.Raw {
			if f.Name == chartutil.ValuesfileName {
				f.Data, replaced = b, true
			}
		}
		if !replaced {
			ch.Raw = append(ch.Raw, &chart.File{Name: chartutil.ValuesfileName, Data: b})
		}
	}
	ch.Metadata.Version = version
	tmp, err := os.MkdirTemp(filepath.Dir(path), "package-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	p, err := chartutil.Save(ch, tmp)
	if err != nil {
		return err
	}
	return os.Rename(p, path)
}
