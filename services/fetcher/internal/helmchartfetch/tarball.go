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
// Flux's DependencyManager: a dependency already in charts/ is kept; a
// file:// one (or one without repository) is loaded from the same source;
// a repository one is pulled from the HelmRepository of the namespace with
// that URL, with its credentials.
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

func (b *depBuilder) build(ctx context.Context, ch *chart.Chart, dir string) error {
	present := map[string]bool{}
	for _, d := range ch.Dependencies() {
		present[d.Name()] = true
	}
	for _, dep := range ch.Metadata.Dependencies {
		if present[dep.Name] {
			continue
		}
		var sub *chart.Chart
		var err error
		switch repoURL := dep.Repository; {
		case repoURL == "" || strings.HasPrefix(repoURL, "file://"):
			sub, err = b.local(ctx, dir, dep)
		case strings.HasPrefix(repoURL, "http://") || strings.HasPrefix(repoURL, "https://"):
			sub, err = b.remote(ctx, dep)
		default:
			err = b.fail(failure.Stalling, fmt.Errorf("dependency '%s': repository '%s' is not supported yet: use file:// or an http(s) URL",
				dep.Name, repoURL))
		}
		if err != nil {
			return err
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
