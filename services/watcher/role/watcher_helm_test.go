package role

import (
	"context"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// testHelmRepository follows a HelmRepository: its fetch job, its status
// from a stored index (status.url the latest index), and, turned into
// type oci, what Flux makes of it: artifacts deleted, no finalizer, no
// status.
func testHelmRepository(t *testing.T, e *env) {
	ctx := context.Background()
	key := client.ObjectKey{Namespace: "default", Name: "charts"}
	repo := &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace},
		Spec:       sourcev1.HelmRepositorySpec{URL: "https://charts.example.com", Interval: metav1.Duration{Duration: 5 * time.Minute}},
	}
	if err := e.k8s.Create(ctx, repo); err != nil {
		t.Fatal(err)
	}
	m := next(t, e.fetchJobs)
	req, ok := m.Data.(*events.FetchRequested)
	if !ok || req.HelmRepository == nil || req.HelmRepository.URL != repo.Spec.URL || req.Job.Object.Kind != sourcev1.HelmRepositoryKind {
		t.Fatalf("fetch request = %+v", m.Data)
	}

	rev := "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	size := int64(444)
	path := "helmrepository/default/charts/index-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.yaml"
	publishOutcome(t, e, events.TypeArtifactStored, &events.Outcome{Job: req.Job, Revision: rev,
		EventMessage: "stored fetched index of size 444B from 'https://charts.example.com'",
		Artifact:     &meta.Artifact{Path: path, URL: "http://a/" + path, Revision: rev, Digest: rev, Size: &size, LastUpdateTime: metav1.Now()}})
	var got sourcev1.HelmRepository
	eventually(t, "Ready=True", func() bool {
		_ = e.k8s.Get(ctx, key, &got)
		return conditions.IsReady(&got)
	})
	if c := conditions.Get(&got, meta.ReadyCondition); c.Message != "stored artifact: revision '"+rev+"'" {
		t.Errorf("Ready = %+v", c)
	}
	if got.Status.URL != "http://a/"+path {
		t.Errorf("status.url = %q, want the index's URL", got.Status.URL)
	}
	waitEvent(t, e, key.Name, corev1.EventTypeNormal, "NewArtifact", "stored fetched index of size 444B from 'https://charts.example.com'")

	// Type oci: static, as in Flux.
	patch := client.MergeFrom(got.DeepCopy())
	got.Spec.Type = sourcev1.HelmRepositoryTypeOCI
	got.Spec.URL = "oci://ghcr.io/charts"
	if err := e.k8s.Patch(ctx, &got, patch); err != nil {
		t.Fatal(err)
	}
	m = next(t, e.packageJobs)
	if m.Event.Type() != events.TypeDeleteRequested || m.Event.Subject() != "helmrepository/default/charts" {
		t.Fatalf("got %s for %s, want the deletion of the index artifacts", m.Event.Type(), m.Event.Subject())
	}
	eventually(t, "an empty status and no finalizer", func() bool {
		_ = e.k8s.Get(ctx, key, &got)
		return len(got.Finalizers) == 0 && got.Status.Artifact == nil && len(got.Status.Conditions) == 0 && got.Status.URL == ""
	})
	if err := e.k8s.Delete(ctx, &got); err != nil {
		t.Fatal(err)
	}
}

// testHelmChart follows a HelmChart from a HelmRepository: it waits for
// the repository's index (NoSourceArtifact), gets a job the moment the
// index is stored, and reads as Flux's from the stored chart.
func testHelmChart(t *testing.T, e *env) {
	ctx := context.Background()
	repo := &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "podinfo-charts", Namespace: "default"},
		Spec:       sourcev1.HelmRepositorySpec{URL: "https://charts.example.com", Interval: metav1.Duration{Duration: time.Hour}, Suspend: true},
	}
	if err := e.k8s.Create(ctx, repo); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: "default", Name: "podinfo"}
	chart := &sourcev1.HelmChart{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace},
		Spec: sourcev1.HelmChartSpec{Chart: "podinfo", Version: "6.x", Interval: metav1.Duration{Duration: time.Hour},
			SourceRef:   sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: repo.Name},
			ValuesFiles: []string{"values.yaml", "values-prod.yaml"}},
	}
	if err := e.k8s.Create(ctx, chart); err != nil {
		t.Fatal(err)
	}
	var got sourcev1.HelmChart
	eventually(t, "NoSourceArtifact", func() bool {
		_ = e.k8s.Get(ctx, key, &got)
		c := conditions.Get(&got, meta.ReadyCondition)
		return c != nil && c.Reason == "NoSourceArtifact" && c.Message == "no artifact available for HelmRepository source 'podinfo-charts'"
	})

	// The repository's index is stored: the chart's job follows at once.
	rev := "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	size := int64(444)
	ipath := "helmrepository/default/podinfo-charts/index-0123.yaml"
	var r sourcev1.HelmRepository
	if err := e.k8s.Get(ctx, client.ObjectKeyFromObject(repo), &r); err != nil {
		t.Fatal(err)
	}
	r.Status.Artifact = &meta.Artifact{Path: ipath, URL: "http://a/" + ipath, Revision: rev, Digest: rev, Size: &size, LastUpdateTime: metav1.Now()}
	if err := e.k8s.Status().Update(ctx, &r); err != nil {
		t.Fatal(err)
	}
	m := next(t, e.fetchJobs)
	req, ok := m.Data.(*events.FetchRequested)
	if !ok || req.HelmChart == nil || req.ChartSource == nil || req.ChartSource.Artifact.Path != ipath ||
		req.ChartSource.HelmRepository == nil || req.ChartSource.HelmRepository.URL != repo.Spec.URL {
		t.Fatalf("fetch request = %+v", m.Data)
	}
	eventually(t, "observedSourceArtifactRevision", func() bool {
		_ = e.k8s.Get(ctx, key, &got)
		return got.Status.ObservedSourceArtifactRevision == rev
	})

	cpath := "helmchart/default/podinfo/podinfo-6.1.0+1.tgz"
	msg := "packaged 'podinfo' chart with version '6.1.0+1' and merged values files [values.yaml values-prod.yaml]"
	publishOutcome(t, e, events.TypeArtifactStored, &events.Outcome{Job: req.Job, Revision: "6.1.0+1", EventMessage: msg,
		Artifact: &meta.Artifact{Path: cpath, URL: "http://a/" + cpath, Revision: "6.1.0+1", Digest: "sha256:c", Size: &size, LastUpdateTime: metav1.Now()}})
	eventually(t, "Ready=True", func() bool {
		_ = e.k8s.Get(ctx, key, &got)
		return conditions.IsReady(&got)
	})
	if c := conditions.Get(&got, meta.ReadyCondition); c.Reason != sourcev1.ChartPackageSucceededReason || c.Message != msg {
		t.Errorf("Ready = %+v", c)
	}
	if got.Status.URL != "http://a/"+cpath || got.Status.ObservedChartName != "podinfo" ||
		len(got.Status.ObservedValuesFiles) != 2 {
		t.Errorf("status = %+v", got.Status)
	}
	waitEvent(t, e, key.Name, corev1.EventTypeNormal, sourcev1.ChartPackageSucceededReason, msg)
}
