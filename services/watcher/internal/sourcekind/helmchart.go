package sourcekind

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// chartSourceIndex indexes HelmCharts by "<kind>/<name>" of their source.
const chartSourceIndex = ".spec.sourceRef"

// Flux's HelmChart reasons the API module does not define.
const (
	// SourceUnavailableReason: the source object cannot be read.
	SourceUnavailableReason = "SourceUnavailable"
	// NoSourceArtifactReason: the source has no artifact yet.
	NoSourceArtifactReason = "NoSourceArtifact"
	// UnsupportedSourceKindReason: a sourceRef kind Flux does not know, or
	// one Headwater cannot build from yet.
	UnsupportedSourceKindReason = "UnsupportedSourceKind"
)

// HelmChart adapts sourcev1.HelmChart. Its artifact is the chart archive
// (helmchart/<ns>/<name>/<chart>-<version>.tgz), its revision the chart
// version; it follows its source (a HelmRepository, GitRepository or
// Bucket): a new artifact of the source reconciles it at once.
func HelmChart() Kind {
	return Kind{
		Name:           sourcev1.HelmChartKind,
		ReadyFormat:    "stored chart with version '%s'",
		UpToDateReason: sourcev1.ArtifactUpToDateReason,
		// Flux's order (helmChartReadyCondition).
		Conditions: []string{
			sourcev1.StorageOperationFailedCondition,
			sourcev1.FetchFailedCondition,
			sourcev1.BuildFailedCondition,
			sourcev1.ArtifactOutdatedCondition,
			sourcev1.SourceVerifiedCondition,
		},
		Adapter: Adapt(Funcs[*sourcev1.HelmChart]{
			New: func() *sourcev1.HelmChart { return &sourcev1.HelmChart{} },
			Status: func(c *sourcev1.HelmChart) Status {
				return Status{&c.Status.ObservedGeneration, &c.Status.Artifact, &c.Status.LastHandledReconcileAt}
			},
			Suspended: func(c *sourcev1.HelmChart) bool { return c.Spec.Suspend },
			Remote: func(c *sourcev1.HelmChart) string {
				// The charts of one source share its artifact (a
				// HelmRepository's index): its namespace is part of it.
				ref := c.Spec.SourceRef
				return c.GetNamespace() + "/" + ref.Kind + "/" + ref.Name
			},
			Request: chartRequest,
			Progress: func(c *sourcev1.HelmChart, req *events.FetchRequested) {
				if cs := req.ChartSource; cs != nil {
					c.Status.ObservedSourceArtifactRevision = cs.Artifact.Revision
				}
			},
			Setup: chartSetup,
			Observe: func(c *sourcev1.HelmChart) {
				c.Status.ObservedChartName = c.Spec.Chart
				c.Status.ObservedValuesFiles = c.Spec.ValuesFiles
				if a := c.Status.Artifact; a != nil {
					// The chart's URL on the artifact server (Flux points at a
					// <chart>-latest.tgz symlink to it; see docs/design.md).
					c.Status.URL = a.URL
				}
			},
			Record:          chartRecord,
			StoredCondition: chartStored,
			Outdated:        chartOutdated,
		}),
	}
}

// chartStored is Flux's ArtifactInStorage for a chart: ChartPullSucceeded
// or ChartPackageSucceeded with the build's summary ("pulled 'podinfo'
// chart with version '6.1.0'"). An unchanged outcome keeps the summary of
// the build that made the artifact.
func chartStored(c *sourcev1.HelmChart, out *events.Outcome) (string, string) {
	msg := out.EventMessage
	if msg == "" {
		if old := conditions.Get(c, sourcev1.ArtifactInStorageCondition); old != nil && out.Artifact != nil &&
			strings.Contains(old.Message, "'"+out.Artifact.Revision+"'") {
			return old.Reason, old.Message
		}
		rev := ""
		if out.Artifact != nil {
			rev = out.Artifact.Revision
		}
		msg = fmt.Sprintf("pulled '%s' chart with version '%s'", c.Spec.Chart, rev)
	}
	if strings.HasPrefix(msg, "packaged ") {
		return sourcev1.ChartPackageSucceededReason, msg
	}
	return sourcev1.ChartPullSucceededReason, msg
}

// NewChartReason is Flux's ArtifactOutdated reason for a HelmChart whose
// new chart version (or name) could not be built.
const NewChartReason = "NewChart"

// chartOutdated is Flux's ArtifactOutdated for a HelmChart (its
// observeChartBuild): once an artifact exists, a failed build of another
// version, or of another chart, sets NewChart with the build's summary,
// "new '<chart>' chart with version '<version>'". The chart's name is
// spec.chart, or for a chart path in a GitRepository or Bucket its last
// element (the chart's directory, which Helm names after the chart).
func chartOutdated(c *sourcev1.HelmChart, prev *meta.Artifact, revision string) (string, string, bool) {
	if prev == nil || revision == "" || (prev.Revision == revision && c.Status.ObservedChartName == c.Spec.Chart) {
		return "", "", false
	}
	return NewChartReason, fmt.Sprintf("new '%s' chart with version '%s'", path.Base(c.Spec.Chart), revision), true
}

// chartRecord writes SourceVerified from an outcome.
//
// SourceVerified (normal polarity) is True with Flux's message ("verified
// signature of version <version>") once the signature of the chart pulled
// from an OCI HelmRepository verified, False with reason VerificationError
// when it did not, and absent when spec.verify is unset.
func chartRecord(c *sourcev1.HelmChart, _ string, out *events.Outcome) {
	if c.Spec.Verify == nil {
		conditions.Delete(c, sourcev1.SourceVerifiedCondition)
		return
	}
	switch v := out.Verification; {
	case v == nil:
	case v.Verified:
		conditions.MarkTrue(c, sourcev1.SourceVerifiedCondition, v.Reason, "%s", v.Message)
	default:
		conditions.MarkFalse(c, sourcev1.SourceVerifiedCondition, v.Reason, "%s", v.Message)
	}
}

// chartRequest copies the spec, resolves spec.sourceRef to the source's
// artifact (waiting while the source is missing or has none, as Flux's
// SourceUnavailable and NoSourceArtifact), and forces a rebuild when the
// spec fields the artifact was built with changed.
func chartRequest(ctx context.Context, r client.Reader, c *sourcev1.HelmChart, req *events.FetchRequested) (bool, error) {
	req.HelmChart = c.Spec.DeepCopy()
	ref := c.Spec.SourceRef
	var src Object
	switch ref.Kind {
	case sourcev1.HelmRepositoryKind:
		src = &sourcev1.HelmRepository{}
	case sourcev1.GitRepositoryKind:
		src = &sourcev1.GitRepository{}
	case sourcev1.BucketKind:
		src = &sourcev1.Bucket{}
	default:
		return false, waiting(sourcev1.FetchFailedCondition, UnsupportedSourceKindReason, true,
			"failed to get source: unsupported source kind '%s', must be one of: %s, %s, %s",
			ref.Kind, sourcev1.HelmRepositoryKind, sourcev1.GitRepositoryKind, sourcev1.BucketKind)
	}
	if err := r.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: ref.Name}, src); err != nil {
		if !apierrors.IsNotFound(err) {
			return false, err
		}
		return false, waiting(sourcev1.FetchFailedCondition, SourceUnavailableReason, false, "failed to get source: %s", err.Error())
	}
	if repo, ok := src.(*sourcev1.HelmRepository); ok && repo.Spec.Type == sourcev1.HelmRepositoryTypeOCI {
		// An OCI repository has no artifact: the fetcher pulls from the
		// registry itself.
		if err := refuseCredentials("the URL of HelmRepository '"+repo.Name+"'", repo.Spec.URL); err != nil {
			return false, err
		}
		req.ChartSource = &events.ChartSource{Kind: ref.Kind, Name: ref.Name, HelmRepository: repo.Spec.DeepCopy()}
		// A chart not verified as spec.verify asks is pulled and verified
		// again, as Flux verifies at every reconcile.
		unverified := c.Spec.Verify != nil && c.Spec.Verify.Provider != "" && !conditions.IsTrue(c, sourcev1.SourceVerifiedCondition)
		return chartForce(c) || (c.Status.Artifact != nil && unverified), nil
	}
	a := src.GetArtifact()
	if a == nil {
		return false, waiting(sourcev1.FetchFailedCondition, NoSourceArtifactReason, false,
			"no artifact available for %s source '%s'", ref.Kind, ref.Name)
	}
	req.ChartSource = &events.ChartSource{Kind: ref.Kind, Name: ref.Name, Artifact: *a.DeepCopy()}
	if repo, ok := src.(*sourcev1.HelmRepository); ok {
		if refuseCredentials("the URL of HelmRepository '"+repo.Name+"'", repo.Spec.URL) != nil {
			// The repository stalls saying so; the chart waits for it.
			return false, waiting(sourcev1.FetchFailedCondition, NoSourceArtifactReason, false,
				"HelmRepository '%s' carries credentials in its URL", repo.Name)
		}
		req.ChartSource.HelmRepository = repo.Spec.DeepCopy()
	} else {
		// A chart from a tarball may depend on charts of the namespace's
		// HelmRepositories.
		repos, err := chartRepositories(ctx, r, c.Namespace)
		if err != nil {
			return false, err
		}
		req.ChartSource.Repositories = repos
	}
	return chartForce(c), nil
}

// chartForce reports whether the stored chart was built with other spec
// fields than the current ones (Flux's observed chart name and values
// files), so it is rebuilt even if its version is unchanged.
func chartForce(c *sourcev1.HelmChart) bool {
	if c.Status.Artifact == nil {
		return false
	}
	return c.Status.ObservedChartName != c.Spec.Chart || !equalOrEmpty(c.Status.ObservedValuesFiles, c.Spec.ValuesFiles)
}

// chartRepositories lists the HelmRepositories of namespace that have an
// index, and the OCI ones (static, without an artifact), for a chart's
// dependencies: an http(s) dependency is pulled with the index and
// credentials of the repository of its URL, an oci:// one with the
// credentials of the OCI repository of its URL.
func chartRepositories(ctx context.Context, r client.Reader, namespace string) ([]events.ChartRepository, error) {
	var list sourcev1.HelmRepositoryList
	if err := r.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("list helm repositories: %w", err)
	}
	var out []events.ChartRepository
	for i := range list.Items {
		h := &list.Items[i]
		if refuseCredentials("", h.Spec.URL) != nil {
			continue
		}
		if h.Spec.Type == sourcev1.HelmRepositoryTypeOCI {
			out = append(out, events.ChartRepository{Name: h.Name, Spec: *h.Spec.DeepCopy()})
			continue
		}
		if h.Status.Artifact == nil {
			continue
		}
		out = append(out, events.ChartRepository{Name: h.Name, Spec: *h.Spec.DeepCopy(), Artifact: *h.Status.Artifact.DeepCopy()})
	}
	return out, nil
}

// chartSetup indexes HelmCharts by their source, and reconciles the
// HelmCharts of a source whose artifact changed (a new index): they pick
// a new version at once, or stop waiting for the source.
func chartSetup(ctx context.Context, mgr ctrl.Manager, b *builder.Builder) error {
	err := mgr.GetFieldIndexer().IndexField(ctx, &sourcev1.HelmChart{}, chartSourceIndex, func(o client.Object) []string {
		ref := o.(*sourcev1.HelmChart).Spec.SourceRef
		return []string{ref.Kind + "/" + ref.Name}
	})
	if err != nil {
		return fmt.Errorf("index %s: %w", chartSourceIndex, err)
	}
	c := mgr.GetClient()
	charts := func(kind string) handler.EventHandler {
		return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			var list sourcev1.HelmChartList
			if err := c.List(ctx, &list, client.InNamespace(o.GetNamespace()),
				client.MatchingFields{chartSourceIndex: kind + "/" + o.GetName()}); err != nil {
				ctrl.LoggerFrom(ctx).Error(err, "listing helm charts", "source", kind+"/"+o.GetName())
				return nil
			}
			reqs := make([]reconcile.Request, 0, len(list.Items))
			for i := range list.Items {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
			}
			return reqs
		})
	}
	b.Watches(&sourcev1.HelmRepository{}, charts(sourcev1.HelmRepositoryKind), builder.WithPredicates(ArtifactChanged{}))
	b.Watches(&sourcev1.GitRepository{}, charts(sourcev1.GitRepositoryKind), builder.WithPredicates(ArtifactChanged{}))
	b.Watches(&sourcev1.Bucket{}, charts(sourcev1.BucketKind), builder.WithPredicates(ArtifactChanged{}))
	return nil
}
