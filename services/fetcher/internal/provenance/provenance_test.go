package provenance

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
)

// TestCheck runs the check against a real API server: a job made from the
// live object passes; one for a deleted, re-created or newer object is
// stale; one whose spec, UID-bound generation or kind the object never had
// is forged.
func TestCheck(t *testing.T) {
	c := startAPIServer(t)
	ctx := context.Background()
	repo := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default"},
		Spec: sourcev1.GitRepositorySpec{URL: "https://example.com/podinfo.git", Interval: metav1.Duration{Duration: time.Minute},
			SecretRef: &meta.LocalObjectReference{Name: "podinfo-auth"}, Include: []sourcev1.GitRepositoryInclude{}},
	}
	job := createGitRepository(t, c, repo)
	checker := New(c)

	if err := checker.Check(ctx, job()); err != nil {
		t.Fatalf("the job of the live object: %v", err)
	}
	forged := map[string]func(*events.FetchRequested){
		"another Secret": func(r *events.FetchRequested) {
			r.GitRepository.SecretRef = &meta.LocalObjectReference{Name: "someone-elses-credentials"}
		},
		"another URL":            func(r *events.FetchRequested) { r.GitRepository.URL = "https://attacker.example/x.git" },
		"another namespace":      func(r *events.FetchRequested) { r.Job.Object.Namespace = "kube-system" },
		"a future generation":    func(r *events.FetchRequested) { r.Job.Object.Generation++ },
		"no spec":                func(r *events.FetchRequested) { r.GitRepository = nil },
		"a spec of another kind": func(r *events.FetchRequested) { r.Bucket, r.GitRepository = &sourcev1.BucketSpec{}, nil },
	}
	for name, mutate := range forged {
		r := job()
		mutate(r)
		err := checker.Check(ctx, r)
		if name == "another namespace" {
			// The object does not exist there: stale, and never read.
			if !errors.Is(err, ErrStale) {
				t.Errorf("%s: %v, want a stale job", name, err)
			}
			continue
		}
		if !errors.Is(err, ErrForged) {
			t.Errorf("%s: %v, want a forged job", name, err)
		}
	}

	old := job()
	repo.Spec.Interval = metav1.Duration{Duration: 2 * time.Minute}
	if err := c.Update(ctx, repo); err != nil {
		t.Fatal(err)
	}
	if err := checker.Check(ctx, old); !errors.Is(err, ErrStale) {
		t.Errorf("the job of an older generation: %v, want stale", err)
	}
	if err := checker.Check(ctx, job()); err != nil {
		t.Errorf("the job of the new generation: %v", err)
	}
	// An OCIRepository's job is checked the same way.
	oci := &sourcev1.OCIRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default"},
		Spec: sourcev1.OCIRepositorySpec{URL: "oci://registry.example/podinfo", Interval: metav1.Duration{Duration: time.Minute},
			SecretRef: &meta.LocalObjectReference{Name: "podinfo-pull"}},
	}
	if err := c.Create(ctx, oci); err != nil {
		t.Fatal(err)
	}
	liveOCI := &sourcev1.OCIRepository{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(oci), liveOCI); err != nil {
		t.Fatal(err)
	}
	ociJob := &events.FetchRequested{
		Job: events.Job{ID: "job", Object: events.ObjectRef{Kind: sourcev1.OCIRepositoryKind, Namespace: liveOCI.Namespace,
			Name: liveOCI.Name, UID: string(liveOCI.UID), Generation: liveOCI.Generation}},
		OCIRepository: liveOCI.Spec.DeepCopy(),
	}
	if err := checker.Check(ctx, ociJob); err != nil {
		t.Errorf("the job of a live OCIRepository: %v", err)
	}
	ociJob.OCIRepository.URL = "oci://attacker.example/x"
	if err := checker.Check(ctx, ociJob); !errors.Is(err, ErrForged) {
		t.Errorf("an OCIRepository job with another URL: %v, want a forged job", err)
	}

	current := job()
	if err := c.Delete(ctx, repo); err != nil {
		t.Fatal(err)
	}
	if err := checker.Check(ctx, current); !errors.Is(err, ErrStale) {
		t.Errorf("the job of a deleted object: %v, want stale", err)
	}
	testChartSource(t, c, checker)
}

// startAPIServer starts a real API server with Headwater's CRDs and
// returns a client of it.
func startAPIServer(t *testing.T) client.Client {
	t.Helper()
	return sourcetest.StartAPIServer(t, sourcetest.CRDs{Dir: filepath.Join("..", "..", "..", "..", "deploy", "crds"),
		AddToScheme: sourcev1.AddToScheme})
}

// createGitRepository creates repo and returns a function making the job
// the watcher makes for it at each call: the spec as the API server
// returns it then.
func createGitRepository(t *testing.T, c client.Client, repo *sourcev1.GitRepository) func() *events.FetchRequested {
	t.Helper()
	ctx := context.Background()
	if err := c.Create(ctx, repo); err != nil {
		t.Fatal(err)
	}
	return func() *events.FetchRequested {
		t.Helper()
		live := &sourcev1.GitRepository{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(repo), live); err != nil {
			t.Fatal(err)
		}
		return &events.FetchRequested{
			Job: events.Job{ID: "job", Object: events.ObjectRef{Kind: sourcev1.GitRepositoryKind, Namespace: live.Namespace,
				Name: live.Name, UID: string(live.UID), Generation: live.Generation}},
			GitRepository: live.Spec.DeepCopy(),
		}
	}
}

// countingReader counts the reads made through it.
type countingReader struct {
	client.Reader
	gets atomic.Int64
}

func (r *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	r.gets.Add(1)
	return r.Reader.Get(ctx, key, obj, opts...)
}

// TestCheckCached runs the cached check against a real API server: the
// jobs of an unchanged source cost one read per TTL; a forged job is
// refused as without the cache; a job older than the generation last read
// is stale without a read; and a source deleted or changed is noticed once
// the TTL has passed, as documented.
func TestCheckCached(t *testing.T) {
	c := startAPIServer(t)
	ctx := context.Background()
	repo := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "cached", Namespace: "default"},
		Spec: sourcev1.GitRepositorySpec{URL: "https://example.com/podinfo.git", Interval: metav1.Duration{Duration: time.Minute},
			SecretRef: &meta.LocalObjectReference{Name: "podinfo-auth"}},
	}
	job := createGitRepository(t, c, repo)
	reader := &countingReader{Reader: c}
	checker := NewCached(reader, time.Minute)
	now := time.Now()
	checker.now = func() time.Time { return now }
	check := func(step string, r *events.FetchRequested, wantErr error, wantGets int64) {
		t.Helper()
		err := checker.Check(ctx, r)
		switch {
		case wantErr == nil && err != nil:
			t.Fatalf("%s: %v", step, err)
		case wantErr != nil && !errors.Is(err, wantErr):
			t.Fatalf("%s: %v, want %v", step, err, wantErr)
		}
		if got := reader.gets.Load(); got != wantGets {
			t.Fatalf("%s: %d reads of the source so far, want %d", step, got, wantGets)
		}
	}

	first := job()
	check("first job", first, nil, 1)
	now = now.Add(30 * time.Second)
	check("the same job within the TTL", job(), nil, 1)
	forged := job()
	forged.GitRepository.URL = "https://attacker.example/x.git"
	check("another URL at the remembered generation", forged, ErrForged, 2)
	forged = job()
	forged.Job.Object.UID = "another-uid"
	check("another UID", forged, ErrStale, 3)
	now = now.Add(31 * time.Second)
	check("the same job after the TTL", job(), nil, 4)

	repo.Spec.Interval = metav1.Duration{Duration: 2 * time.Minute}
	if err := c.Update(ctx, repo); err != nil {
		t.Fatal(err)
	}
	check("an older generation within the TTL of its read", first, nil, 4)
	check("the new generation", job(), nil, 5)
	check("an older generation once a newer one was read", first, ErrStale, 5)

	current := job()
	if err := c.Delete(ctx, repo); err != nil {
		t.Fatal(err)
	}
	check("a deleted source within the TTL", current, nil, 5)
	now = now.Add(time.Minute)
	check("a deleted source after the TTL", current, ErrStale, 6)
	check("a deleted source, read again", current, ErrStale, 7)

	uncached := &countingReader{Reader: c}
	strict := New(uncached)
	for range 2 {
		if err := strict.Check(ctx, current); !errors.Is(err, ErrStale) {
			t.Fatalf("uncached check of a deleted source: %v, want stale", err)
		}
	}
	if got := uncached.gets.Load(); got != 2 {
		t.Errorf("uncached checker read the source %d times for 2 jobs, want 2", got)
	}
}

// testChartSource checks a HelmChart's job against its live source: the
// HelmRepository specs it carries (whose Secrets the fetcher reads) must
// be the live ones, and its source the chart's sourceRef.
func testChartSource(t *testing.T, c client.Client, checker *Checker) {
	ctx := context.Background()
	hr := &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "charts", Namespace: "default"},
		Spec: sourcev1.HelmRepositorySpec{URL: "https://charts.example.com", Interval: metav1.Duration{Duration: time.Minute},
			SecretRef: &meta.LocalObjectReference{Name: "charts-auth"}},
	}
	hc := &sourcev1.HelmChart{
		ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default"},
		Spec: sourcev1.HelmChartSpec{Chart: "podinfo", Interval: metav1.Duration{Duration: time.Minute},
			SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: "charts"}},
	}
	for _, o := range []client.Object{hr, hc} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	job := func() *events.FetchRequested {
		var liveRepo sourcev1.HelmRepository
		var liveChart sourcev1.HelmChart
		if err := c.Get(ctx, client.ObjectKeyFromObject(hr), &liveRepo); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(hc), &liveChart); err != nil {
			t.Fatal(err)
		}
		return &events.FetchRequested{
			Job: events.Job{ID: "job", Object: events.ObjectRef{Kind: sourcev1.HelmChartKind, Namespace: "default",
				Name: liveChart.Name, UID: string(liveChart.UID), Generation: liveChart.Generation}},
			HelmChart:   liveChart.Spec.DeepCopy(),
			ChartSource: &events.ChartSource{Kind: sourcev1.HelmRepositoryKind, Name: "charts", HelmRepository: liveRepo.Spec.DeepCopy()},
		}
	}
	if err := checker.Check(ctx, job()); err != nil {
		t.Fatalf("the job of the live chart and repository: %v", err)
	}
	r := job()
	r.ChartSource.HelmRepository.SecretRef = &meta.LocalObjectReference{Name: "someone-elses-credentials"}
	if err := checker.Check(ctx, r); err == nil {
		t.Error("a job with another repository Secret passed")
	}
	r = job()
	r.ChartSource.Name = "other"
	if err := checker.Check(ctx, r); !errors.Is(err, ErrForged) {
		t.Errorf("a job with another source: %v, want forged", err)
	}
	r = job()
	live := *r.ChartSource.HelmRepository
	r.ChartSource.Repositories = []events.ChartRepository{
		{Name: "charts", Spec: sourcev1.HelmRepositorySpec{URL: "https://attacker.example"}},
		{Name: "charts", Spec: live},
	}
	if err := checker.Check(ctx, r); err != nil || len(r.ChartSource.Repositories) != 1 || r.ChartSource.Repositories[0].Spec.URL != live.URL {
		t.Errorf("dependency repositories %+v (%v), want only the live one kept", r.ChartSource.Repositories, err)
	}
}

// TestCheckCacheBounded: a full cache drops expired entries first, then
// others, and never holds more than its bound.
func TestCheckCacheBounded(t *testing.T) {
	checker := NewCached(nil, time.Minute)
	checker.max = 2
	now := time.Now()
	checker.now = func() time.Time { return now }
	key := func(name string) objectKey {
		return objectKey{kind: "GitRepository", namespace: "default", name: name, uid: name}
	}
	checker.remember(key("a"), seenSpec{gen: 1})
	now = now.Add(2 * time.Minute)
	checker.remember(key("b"), seenSpec{gen: 1})
	checker.remember(key("c"), seenSpec{gen: 1})
	if _, ok := checker.seen[key("a")]; ok {
		t.Error("the expired entry outlived a full cache")
	}
	for _, k := range []string{"b", "c"} {
		if _, ok := checker.recall(key(k)); !ok {
			t.Errorf("entry %s was dropped while an expired one could go", k)
		}
	}
	checker.remember(key("d"), seenSpec{gen: 1})
	if n := len(checker.seen); n != 2 {
		t.Errorf("cache holds %d entries, want its bound 2", n)
	}
	if _, ok := checker.recall(key("d")); !ok {
		t.Error("the newest entry is not remembered")
	}
}
