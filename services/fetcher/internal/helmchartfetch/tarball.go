package helmchartfetch

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"sigs.k8s.io/yaml"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/helmfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/helmindex"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// ReasonDependencyBuild is Flux's reason for a dependency that cannot be
// resolved or built.
const ReasonDependencyBuild = "DependencyBuildError"

// tarballResolved is a chart inside a GitRepository's or Bucket's
// artifact (a tar.gz), at spec.chart.
type tarballResolved struct {
	src       *Source
	namespace string
	spec      *sourcev1.HelmChartSpec
	cs        *events.ChartSource
	dir       string // the chart's directory in the artifact
	version   string // the revision
}

// resolveTarball reads the chart's Chart.yaml from the source artifact:
// the revision is its version, with the first 12 characters of the
// source revision's hash as build metadata for reconcileStrategy Revision
// (Flux's rule).
func (s *Source) resolveTarball(ctx context.Context, req *events.FetchRequested) (source.Resolved, error) {
	spec, cs := req.HelmChart, req.ChartSource
	dir := path.Clean(strings.TrimPrefix(spec.Chart, "./"))
	if path.IsAbs(spec.Chart) || dir == ".." || strings.HasPrefix(dir, "../") {
		return nil, buildFailure(failure.Stalling, sourcev1.FetchFailedCondition, ReasonChartReference, "invalid chart reference",
			fmt.Errorf("path '%s' must be relative to the source and stay inside it", spec.Chart))
	}
	files, err := s.readDir(ctx, cs.Artifact.Path, dir, func(rel string) bool { return rel == "Chart.yaml" })
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, buildFailure(failure.Stalling, sourcev1.FetchFailedCondition, ReasonChartReference, "invalid chart reference",
			fmt.Errorf("no chart found at path '%s' in %s '%s'", spec.Chart, cs.Kind, cs.Name))
	}
	var md chart.Metadata
	if err := yaml.Unmarshal(files[0].Data, &md); err != nil || md.Version == "" || md.Name == "" {
		return nil, buildFailure(failure.Final, sourcev1.FetchFailedCondition, ReasonChartReference, "invalid chart reference",
			fmt.Errorf("invalid Chart.yaml at path '%s': %v", spec.Chart, err))
	}
	version := md.Version
	if spec.ReconcileStrategy == sourcev1.ReconcileStrategyRevision {
		rev := cs.Artifact.Revision
		if i := strings.LastIndex(rev, ":"); i >= 0 {
			rev = rev[i+1:]
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if version, err = withMetadata(md.Version, rev); err != nil {
			return nil, buildFailure(failure.Final, sourcev1.FetchFailedCondition, ReasonChartReference, "invalid chart reference", err)
		}
	}
	return &tarballResolved{src: s, namespace: req.Job.Object.Namespace, spec: spec, cs: cs, dir: dir, version: version}, nil
}

// Revision is the chart's version (with the source's revision for
// reconcileStrategy Revision).
func (r *tarballResolved) Revision() string { return r.version }

// Download loads the chart from the source artifact, builds its
// dependencies (file:// ones from the same artifact, repository ones
// through the namespace's HelmRepositories), merges the values files and
// packages it (ChartPackageSucceeded).
func (r *tarballResolved) Download(ctx context.Context, dir string) (*source.Content, error) {
	ch, err := r.src.loadDir(ctx, r.cs.Artifact.Path, r.dir)
	if err != nil {
		return nil, err
	}
	b := &depBuilder{r: r, work: dir, visiting: map[string]bool{r.dir: true}, trail: []string{r.dir}}
	if err := b.build(ctx, ch, r.dir); err != nil {
		return nil, err
	}
	return r.src.packageContent(ch, r.spec, r.version, dir)
}

// loadDir loads the chart in directory dir of the artifact.
func (s *Source) loadDir(ctx context.Context, artifact, dir string) (*chart.Chart, error) {
	files, err := s.readDir(ctx, artifact, dir, nil)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, buildFailure(failure.Stalling, sourcev1.FetchFailedCondition, ReasonChartReference, "invalid chart reference",
			fmt.Errorf("no chart found at path '%s'", dir))
	}
	ch, err := loader.LoadFiles(files)
	if err != nil {
		return nil, buildFailure(failure.Final, sourcev1.BuildFailedCondition, ReasonChartPackage, "chart package error",
			fmt.Errorf("failed to load chart at path '%s': %w", dir, err))
	}
	return ch, nil
}

// readDir reads the regular files under dir in the tar.gz artifact
// (those keep accepts, all when nil), with paths relative to dir, within
// the Helm loader's limits. Nothing is written to disk, so no entry name
// can reach outside.
func (s *Source) readDir(ctx context.Context, artifact, dir string, keep func(rel string) bool) ([]*loader.BufferedFile, error) {
	obj, err := s.Storage.Open(ctx, artifact)
	if err != nil {
		return nil, &failure.Error{Condition: sourcev1.StorageOperationFailedCondition, Reason: sourcev1.ReadOperationFailedReason,
			Err: fmt.Errorf("failed to open source artifact: %w", err)}
	}
	defer obj.Close()
	zr, err := gzip.NewReader(obj)
	if err != nil {
		return nil, buildFailure(failure.Final, sourcev1.FetchFailedCondition, meta.FailedReason, "artifact untar error", err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	prefix := dir + "/"
	if dir == "." {
		prefix = ""
	}
	var files []*loader.BufferedFile
	remaining := loader.MaxDecompressedChartSize
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files, nil
		}
		if err != nil {
			return nil, buildFailure(failure.Final, sourcev1.FetchFailedCondition, meta.FailedReason, "artifact untar error", err)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if hdr.Typeflag != tar.TypeReg || !strings.HasPrefix(name, prefix) {
			continue
		}
		rel := strings.TrimPrefix(name, prefix)
		if keep != nil && !keep(rel) {
			continue
		}
		if hdr.Size > loader.MaxDecompressedFileSize || hdr.Size > remaining {
			return nil, buildFailure(failure.Final, sourcev1.BuildFailedCondition, ReasonChartPackage, "chart package error",
				fmt.Errorf("chart file '%s' is larger than the maximum file size %d", name, loader.MaxDecompressedFileSize))
		}
		remaining -= hdr.Size
		data, err := io.ReadAll(io.LimitReader(tr, hdr.Size))
		if err != nil {
			return nil, buildFailure(failure.Final, sourcev1.FetchFailedCondition, meta.FailedReason, "artifact untar error", err)
		}
		files = append(files, &loader.BufferedFile{Name: rel, Data: data})
	}
}

// depBuilder builds a chart's missing dependencies, recursively, as
// Flux's DependencyManager: the lock file's dependencies when there is
// one, else Chart.yaml's; a dependency already in charts/ (by its alias,
// or its name) is kept; a file:// one (or one without repository) is
// loaded from the same source; an http(s) one is pulled from the
// HelmRepository of the namespace with that URL, with its credentials
// (anonymously from the URL when there is none); an oci:// one from the
// registry, with the credentials of the namespace's OCI HelmRepository of
// that URL when there is one, anonymously otherwise. A dependency with an
// alias is added under its alias. A repository given as an alias ("@name",
// "alias:name") is refused in Flux's words (aliased repository dependency
// is not supported; invalid dependency repository URL): Flux has no list
// of named repositories to look it up in.
type depBuilder struct {
	r        *tarballResolved
	work     string
	visiting map[string]bool
	trail    []string
	n        int
}

func (b *depBuilder) fail(h failure.Handling, err error) error {
	return buildFailure(h, sourcev1.BuildFailedCondition, ReasonDependencyBuild, "dependency build error", err)
}

// byURL is what to do about a dependency whose repository is no URL.
const byURL = " (refer to the repository by its http(s):// or oci:// URL, as a HelmRepository of the namespace has it)"

// missing returns the dependencies ch requests (its lock file's, when it
// has one) that it does not hold, by alias or name, in their order.
func missing(ch *chart.Chart) []*chart.Dependency {
	reqs := ch.Metadata.Dependencies
	if ch.Lock != nil {
		reqs = ch.Lock.Dependencies
	}
	if len(ch.Dependencies()) == len(reqs) {
		return nil
	}
	present := map[string]bool{}
	for _, d := range ch.Dependencies() {
		present[d.Name()] = true
	}
	var out []*chart.Dependency
	for _, dep := range reqs {
		if !present[depName(dep)] {
			out = append(out, dep)
		}
	}
	return out
}

// depName is the name a dependency has in its parent: its alias, or its
// chart's name.
func depName(dep *chart.Dependency) string {
	if dep.Alias != "" {
		return dep.Alias
	}
	return dep.Name
}

func (b *depBuilder) build(ctx context.Context, ch *chart.Chart, dir string) error {
	for _, dep := range missing(ch) {
		var sub *chart.Chart
		var err error
		switch repoURL := dep.Repository; {
		case repoURL == "" || strings.HasPrefix(repoURL, "file://"):
			sub, err = b.local(ctx, dir, dep)
		case strings.HasPrefix(repoURL, "http://") || strings.HasPrefix(repoURL, "https://"):
			sub, err = b.remote(ctx, dep)
		case strings.HasPrefix(repoURL, "oci://"):
			sub, err = b.oci(ctx, dep)
		case strings.HasPrefix(repoURL, "@"):
			err = b.fail(failure.Final, fmt.Errorf("failed to add remote dependency '%s': aliased repository dependency is not supported: %s%s",
				depName(dep), repoURL, byURL))
		default:
			// "alias:name" is Helm's other alias form; Flux takes it for
			// a URL of an unknown scheme, and so does Headwater.
			err = b.fail(failure.Final, fmt.Errorf("failed to add remote dependency '%s': invalid dependency repository URL: %s%s",
				depName(dep), failure.RedactURL(repoURL), byURL))
		}
		if err != nil {
			return err
		}
		if dep.Alias != "" {
			sub.Metadata.Name = dep.Alias
		}
		ch.AddDependency(sub)
	}
	return nil
}

// local loads a file:// dependency from the source, relative to the
// chart's directory, and builds its own dependencies; a cycle fails.
func (b *depBuilder) local(ctx context.Context, dir string, dep *chart.Dependency) (*chart.Chart, error) {
	rel := strings.TrimPrefix(dep.Repository, "file://")
	if rel == "" {
		rel = "charts/" + dep.Name
	}
	target := path.Clean(path.Join(dir, rel))
	if path.IsAbs(rel) || target == ".." || strings.HasPrefix(target, "../") {
		return nil, b.fail(failure.Stalling, fmt.Errorf("dependency '%s': path '%s' leaves the source", dep.Name, dep.Repository))
	}
	if b.visiting[target] {
		return nil, b.fail(failure.Stalling, fmt.Errorf("dependency cycle: %s -> %s", strings.Join(b.trail, " -> "), target))
	}
	b.visiting[target] = true
	b.trail = append(b.trail, target)
	defer func() {
		delete(b.visiting, target)
		b.trail = b.trail[:len(b.trail)-1]
	}()
	sub, err := b.r.src.loadDir(ctx, b.r.cs.Artifact.Path, target)
	if err != nil {
		var f *failure.Error
		if errors.As(err, &f) && f.Reason == ReasonChartReference {
			return nil, b.fail(failure.Stalling, fmt.Errorf("dependency '%s': no chart at '%s'", dep.Name, target))
		}
		return nil, err
	}
	if err := b.build(ctx, sub, target); err != nil {
		return nil, err
	}
	return sub, nil
}

// remote pulls a repository dependency through the namespace's
// HelmRepository with its URL.
func (b *depBuilder) remote(ctx context.Context, dep *chart.Dependency) (*chart.Chart, error) {
	want, err := helmfetch.NormalizeURL(dep.Repository)
	if err != nil {
		return nil, b.fail(failure.Stalling, fmt.Errorf("dependency '%s': %w", dep.Name, err))
	}
	var found *events.ChartRepository
	for i := range b.r.cs.Repositories {
		if b.r.cs.Repositories[i].Spec.Type == sourcev1.HelmRepositoryTypeOCI {
			continue
		}
		u, err := helmfetch.NormalizeURL(b.r.cs.Repositories[i].Spec.URL)
		if err == nil && u.String() == want.String() {
			found = &b.r.cs.Repositories[i]
			break
		}
	}
	if found == nil {
		return b.anonymous(ctx, dep)
	}
	access, err := helmfetch.NewAccess(ctx, b.r.src.Secrets, &b.r.src.transports, b.r.namespace, &found.Spec)
	if err != nil {
		return nil, err
	}
	cv, err := b.r.src.version(ctx, found.Artifact.Path, dep.Name, dep.Version)
	if err != nil {
		return nil, b.fail(failure.Final, fmt.Errorf("dependency '%s': %w", dep.Name, err))
	}
	return b.pull(ctx, access, cv)
}

// anonymous pulls a dependency from a repository that is no HelmRepository
// of the namespace, without credentials, as Flux does: its index is
// downloaded (checked, within the size limit) for the job.
func (b *depBuilder) anonymous(ctx context.Context, dep *chart.Dependency) (*chart.Chart, error) {
	if b.r.src.Indexes == nil {
		return nil, b.fail(failure.Final, fmt.Errorf("dependency '%s': no HelmRepository with an index in namespace '%s' has the URL '%s'",
			dep.Name, b.r.namespace, failure.RedactURL(dep.Repository)))
	}
	spec := &sourcev1.HelmRepositorySpec{URL: dep.Repository}
	access, err := helmfetch.NewAccess(ctx, nil, &b.r.src.transports, b.r.namespace, spec)
	if err != nil {
		return nil, err
	}
	p, err := b.r.src.Indexes.FetchIndex(ctx, b.r.namespace, spec, b.work)
	if err != nil {
		return nil, b.fail(failure.Transient, fmt.Errorf("dependency '%s': %w", dep.Name, err))
	}
	defer os.Remove(p)
	f, err := os.Open(p)
	if err != nil {
		return nil, b.fail(failure.Transient, err)
	}
	defer f.Close()
	cvs, err := helmindex.Versions(f, dep.Name)
	if err != nil {
		return nil, b.fail(failure.Final, fmt.Errorf("dependency '%s': %w", dep.Name, err))
	}
	cv, err := pickVersion(cvs, dep.Name, dep.Version)
	if err != nil {
		return nil, b.fail(failure.Final, fmt.Errorf("dependency '%s': %w", dep.Name, err))
	}
	return b.pull(ctx, access, cv)
}

// pull downloads a dependency's chart with access.
func (b *depBuilder) pull(ctx context.Context, access *helmfetch.Access, cv *helmindex.ChartVersion) (*chart.Chart, error) {
	b.n++
	p := filepath.Join(b.work, fmt.Sprintf("dependency-%d.tgz", b.n))
	defer os.Remove(p)
	sub, err := b.r.src.pull(ctx, access, cv, p)
	if err != nil {
		return nil, err
	}
	return sub, nil
}

// oci pulls an oci:// dependency, as Flux: with the access (credentials,
// TLS, insecure) of the namespace's OCI HelmRepository whose URL is the
// dependency's (trailing slashes aside), anonymously over TLS otherwise;
// a version that is no range is the tag, a range picks the highest
// matching tag.
func (b *depBuilder) oci(ctx context.Context, dep *chart.Dependency) (*chart.Chart, error) {
	want := strings.TrimRight(dep.Repository, "/")
	spec := &sourcev1.HelmRepositorySpec{URL: want, Type: sourcev1.HelmRepositoryTypeOCI}
	for i := range b.r.cs.Repositories {
		r := &b.r.cs.Repositories[i]
		if r.Spec.Type == sourcev1.HelmRepositoryTypeOCI && strings.TrimRight(r.Spec.URL, "/") == want {
			spec = &r.Spec
			break
		}
	}
	depErr := func(err error) error {
		var f *failure.Error
		h := failure.Final
		if errors.As(err, &f) && f.Handling != failure.Stalling {
			// A version no tag has is the chart's to fix, in a new
			// revision of its source, not the HelmChart's.
			h = f.Handling
		}
		return b.fail(h, fmt.Errorf("failed to add remote dependency '%s': %w", depName(dep), err))
	}
	access, err := b.r.src.ociAccess(ctx, b.r.namespace, spec)
	if err != nil {
		return nil, err
	}
	r := &ociResolved{src: b.r.src, spec: &sourcev1.HelmChartSpec{Chart: dep.Name, Version: dep.Version}, remote: access.options(), access: access}
	if p, err := remote.NewPuller(r.remote...); err == nil {
		r.remote = append(r.remote, remote.Reuse(p))
	}
	var nameOpts []name.Option
	if spec.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	ref := strings.TrimPrefix(want, "oci://") + "/" + dep.Name
	if r.repo, err = name.NewRepository(ref, nameOpts...); err != nil {
		return nil, b.fail(failure.Final, fmt.Errorf("failed to add remote dependency '%s': invalid OCI chart reference 'oci://%s': %w",
			depName(dep), ref, err))
	}
	version := dep.Version
	if version == "" {
		version = "*"
	}
	if err := r.pickTag(ctx, version); err != nil {
		return nil, depErr(fmt.Errorf("failed to get chart '%s' version '%s' from '%s': %w", dep.Name, dep.Version, failure.RedactURL(dep.Repository), err))
	}
	b.n++
	p := filepath.Join(b.work, fmt.Sprintf("dependency-%d.tgz", b.n))
	defer os.Remove(p)
	sub, _, err := r.pull(ctx, p)
	if err != nil {
		return nil, depErr(fmt.Errorf("chart download of version '%s' failed: %w", r.version, err))
	}
	return sub, nil
}
