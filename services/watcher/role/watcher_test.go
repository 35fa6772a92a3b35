package role

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/headwater-gitops/headwater/pkg/buildinfo"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/kubeconfig"
	"github.com/headwater-gitops/headwater/services/watcher/internal/seal"
	"github.com/headwater-gitops/headwater/services/watcher/internal/sourcekind"
	"github.com/headwater-gitops/headwater/services/watcher/internal/status"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// env is a real API server with the Flux CRDs, a real NATS server and a
// running watcher; the test plays the other services through the bus.
type env struct {
	k8s  client.Client
	conn *bus.Conn
	pub  *bus.Publisher
	// fetchJobs and packageJobs read what the watcher publishes, as the
	// fetcher and packager would.
	fetchJobs, packageJobs jetstream.Consumer
	// seal is the watcher's job seal, for a test that makes up a job as
	// the watcher would.
	seal *seal.Key
}

func startEnv(t *testing.T) *env {
	t.Helper()
	cfg, kubeconfigPath := startControlPlane(t, filepath.Join("..", "..", "..", "deploy", "crds"))
	natsURL := startNATS(t)

	ctx, cancel := context.WithCancel(context.Background())
	o := options{kube: kubeconfig.Options{Path: kubeconfigPath}, healthAddr: "0", leaderElect: true,
		leaderElectionNamespace: "default", concurrency: 2, eventConcurrency: 2, requeueDependency: time.Second,
		sourceMetricsInterval: 100 * time.Millisecond}
	o.bus.URL = natsURL
	o.jobKeyFile = writeJobKey(t)
	key, err := seal.LoadKey(o.jobKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	o.telemetry.Addr = "0"
	o.telemetry.LogFormat = "text"
	done := make(chan error, 1)
	go func() { done <- run(logr.NewContext(ctx, o.telemetry.NewLogger(service)), o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watcher exited with %v", err)
		}
	})

	k8s := newClient(t, cfg)
	conn, fetchJobs := connectBus(ctx, t, natsURL)
	packageJobs, err := conn.EnsureConsumer(ctx, events.PackageStream, events.Consumer(events.PackageStream, events.PackagerConsumer, events.ConsumerOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	return &env{k8s: k8s, conn: conn, pub: conn.NewPublisher("test"), fetchJobs: fetchJobs, packageJobs: packageJobs, seal: key}
}

// startControlPlane starts a real API server with the CRDs of crdDir,
// stopped when the test ends, and returns its configuration and the path
// of a kubeconfig of an administrator for the watcher.
func startControlPlane(t *testing.T, crdDir string) (*rest.Config, string) {
	t.Helper()
	cfg, kubeconfigs := startControlPlaneFor(t, crdDir, nil, "watcher")
	return cfg, kubeconfigs["watcher"]
}

// startControlPlaneFor starts a real API server with the CRDs of crdDir,
// configured by configure (nil: as envtest does), stopped when the test
// ends, and returns its configuration and, for each of users (members of
// system:masters), the path of a kubeconfig.
func startControlPlaneFor(t *testing.T, crdDir string, configure func(*envtest.Environment), users ...string) (*rest.Config, map[string]string) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make kube-tools` (it builds kube-apiserver and etcd; `make test` runs it first)")
	}
	testEnv := &envtest.Environment{CRDDirectoryPaths: []string{crdDir}, ErrorIfCRDPathMissing: true}
	if configure != nil {
		configure(testEnv)
	}
	cfg, err := testEnv.Start()
	if err != nil {
		_ = testEnv.Stop() // what started before the failure (a CRD that did not install)
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() { _ = testEnv.Stop() })
	paths := map[string]string{}
	for _, name := range users {
		user, err := testEnv.AddUser(envtest.User{Name: name, Groups: []string{"system:masters"}}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		data, err := user.KubeConfig()
		if err != nil {
			t.Fatal(err)
		}
		paths[name] = filepath.Join(t.TempDir(), name+".kubeconfig")
		if err := os.WriteFile(paths[name], data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cfg, paths
}

// startNATS starts an embedded NATS server with JetStream, shut down when
// the test ends, and returns its client URL.
func startNATS(t *testing.T) string {
	t.Helper()
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir(), Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns.ClientURL()
}

// connectBus connects the test, which plays the other services, to the
// NATS server at url (closed when the test ends), declares the streams
// and returns the connection and the fetchers' consumer of the fetch
// jobs, which reads what the watcher publishes as a fetcher would.
func connectBus(ctx context.Context, t *testing.T, url string) (*bus.Conn, jetstream.Consumer) {
	t.Helper()
	conn, err := bus.Connect(ctx, bus.Options{URL: url}, "test", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if err := conn.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	fetchJobs, err := conn.EnsureConsumer(ctx, events.FetchStream, events.Consumer(events.FetchStream, events.FetcherConsumer, events.ConsumerOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	return conn, fetchJobs
}

// newClient is a client of the API server of cfg that knows the built-in
// kinds and Flux's source kinds.
func newClient(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = sourcev1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// writeJobKey writes a key file that seals the watcher's jobs (the bus
// has no identities in these tests) and returns its path.
func writeJobKey(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "job-key")
	if err := os.WriteFile(path, []byte(strings.Repeat("k", 32)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// next returns the next message on a consumer, decoded, failing after 30s.
func next(t *testing.T, c jetstream.Consumer) *events.Message {
	t.Helper()
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		_ = msg.Ack()
		m, err := events.Decode(msg.Data())
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	t.Fatal("no message within 30s")
	return nil
}

// eventually polls cond every 100ms until it holds or 30s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWatcher runs every case against one environment: a process can hold
// only one manager with a given controller name.
func TestWatcher(t *testing.T) {
	e := startEnv(t)
	t.Run("lifecycle", func(t *testing.T) { testLifecycle(t, e) })
	t.Run("suspend", func(t *testing.T) { testSuspend(t, e) })
	t.Run("rate limited", func(t *testing.T) { testRateLimited(t, e) })
	t.Run("late outcome", func(t *testing.T) { testLateOutcome(t, e) })
	t.Run("include", func(t *testing.T) { testInclude(t, e) })
	t.Run("status patch conflict", func(t *testing.T) { testStatusPatchConflict(t, e) })
	t.Run("helm repository", func(t *testing.T) { testHelmRepository(t, e) })
	t.Run("helm chart", func(t *testing.T) { testHelmChart(t, e) })
	t.Run("build info", testBuildInfo)
	t.Run("source metrics", func(t *testing.T) { testSourceMetrics(t, e) })
}

// testSourceMetrics follows a source's Ready condition in
// headwater_source_condition (Unknown, then False, then gone with the
// object) and finds its reconciles in headwater_reconcile_duration_seconds.
func testSourceMetrics(t *testing.T, e *env) {
	ctx := context.Background()
	repo := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics", Namespace: "default"},
		Spec: sourcev1.GitRepositorySpec{URL: "http://127.0.0.1:1/x.git", Suspend: true,
			Interval: metav1.Duration{Duration: time.Minute}},
	}
	if err := e.k8s.Create(ctx, repo); err != nil {
		t.Fatal(err)
	}
	// statuses returns the statuses of the source's Ready series.
	statuses := func() []string {
		families, err := crmetrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range families {
			if f.GetName() != "headwater_source_condition" {
				continue
			}
			for _, m := range f.GetMetric() {
				l := map[string]string{}
				for _, p := range m.GetLabel() {
					l[p.GetName()] = p.GetValue()
				}
				if l["kind"] == "GitRepository" && l["namespace"] == "default" && l["name"] == "metrics" && l["type"] == "Ready" &&
					m.GetGauge().GetValue() == 1 {
					out = append(out, l["status"])
				}
			}
		}
		return out
	}
	eventually(t, "Ready Unknown", func() bool { return slices.Equal(statuses(), []string{"Unknown"}) })

	var got sourcev1.GitRepository
	if err := e.k8s.Get(ctx, client.ObjectKeyFromObject(repo), &got); err != nil {
		t.Fatal(err)
	}
	base := client.MergeFrom(got.DeepCopy())
	got.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Failed", Message: "x",
		LastTransitionTime: metav1.Now()}}
	if err := e.k8s.Status().Patch(ctx, &got, base); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Ready False, and no Unknown left", func() bool { return slices.Equal(statuses(), []string{"False"}) })

	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var reconciles uint64
	for _, f := range families {
		if f.GetName() == "headwater_reconcile_duration_seconds" {
			for _, m := range f.GetMetric() {
				if m.GetLabel()[0].GetValue() == "GitRepository" {
					reconciles += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	if reconciles == 0 {
		t.Error("no GitRepository reconcile in headwater_reconcile_duration_seconds")
	}
	// fluxReconciles counts the source's reconciles in Flux's family, and
	// says whether it has a series.
	fluxReconciles := func() (uint64, bool) {
		families, err := crmetrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() != "gotk_reconcile_duration_seconds" {
				continue
			}
			for _, m := range f.GetMetric() {
				l := map[string]string{}
				for _, p := range m.GetLabel() {
					l[p.GetName()] = p.GetValue()
				}
				if l["kind"] == "GitRepository" && l["namespace"] == "default" && l["name"] == "metrics" {
					return m.GetHistogram().GetSampleCount(), true
				}
			}
		}
		return 0, false
	}
	if n, _ := fluxReconciles(); n == 0 {
		t.Error("no reconcile of GitRepository default/metrics in gotk_reconcile_duration_seconds")
	}

	if err := e.k8s.Delete(ctx, &got); err != nil {
		t.Fatal(err)
	}
	eventually(t, "series gone with the object", func() bool { return len(statuses()) == 0 })
	eventually(t, "Flux's series gone with the object", func() bool { _, ok := fluxReconciles(); return !ok })
}

// testBuildInfo finds the build information in the registry the watcher's
// manager serves on /metrics.
func testBuildInfo(t *testing.T) {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	build := buildinfo.Get()
	want := map[string]string{"service": "watcher", "version": build.Version, "revision": build.Revision, "goversion": build.GoVersion}
	for _, f := range families {
		if f.GetName() == "headwater_build_info" && len(f.GetMetric()) == 1 && f.GetMetric()[0].GetGauge().GetValue() == 1 {
			got := map[string]string{}
			for _, l := range f.GetMetric()[0].GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if !maps.Equal(got, want) {
				t.Errorf("headwater_build_info labels %v, want %v", got, want)
			}
			return
		}
	}
	t.Error("no headwater_build_info 1 on /metrics")
}

// testStatusPatchConflict writes status from a stale copy: the write must
// conflict, re-read the object and apply the change on top of the newer
// one, so neither change is lost.
func testStatusPatchConflict(t *testing.T, e *env) {
	ctx := context.Background()
	repo := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "conflict", Namespace: "default"},
		Spec:       sourcev1.GitRepositorySpec{URL: "http://127.0.0.1:1/x.git", Suspend: true, Interval: metav1.Duration{Duration: time.Hour}},
	}
	if err := e.k8s.Create(ctx, repo); err != nil {
		t.Fatal(err)
	}
	// The watcher adds its finalizer to a suspended object too: wait for
	// it, so the only writers below are the test's.
	eventually(t, "finalizer", func() bool {
		return e.k8s.Get(ctx, client.ObjectKeyFromObject(repo), repo) == nil && len(repo.Finalizers) == 1
	})
	stale := repo.DeepCopy()
	// Another writer changes status first.
	fresh := repo.DeepCopy()
	fresh.Status.LastHandledReconcileAt = "other-writer"
	if err := e.k8s.Status().Update(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	mutations := 0
	err := status.Patch(ctx, e.k8s, e.k8s, sourcekind.GitRepository(), stale, func(o sourcekind.Object) bool {
		mutations++
		conditions.MarkTrue(o, sourcev1.ArtifactInStorageCondition, meta.SucceededReason, "mine")
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if mutations != 2 {
		t.Errorf("mutate ran %d times, want 2 (the stale write conflicts once)", mutations)
	}
	var got sourcev1.GitRepository
	if err := e.k8s.Get(ctx, client.ObjectKeyFromObject(repo), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.LastHandledReconcileAt != "other-writer" || !conditions.IsReady(&got) {
		t.Errorf("status = %+v, want both writers' changes", got.Status)
	}
}

func testLifecycle(t *testing.T, e *env) {
	ctx := context.Background()
	key := client.ObjectKey{Namespace: "default", Name: "podinfo"}
	repo := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace},
		Spec: sourcev1.GitRepositorySpec{
			URL:       "http://127.0.0.1:1/podinfo.git",
			Interval:  metav1.Duration{Duration: 5 * time.Minute},
			Reference: &sourcev1.GitRepositoryRef{Branch: "master"},
		},
	}
	if err := e.k8s.Create(ctx, repo); err != nil {
		t.Fatal(err)
	}

	// The watcher publishes a fetch job carrying the spec, no credentials.
	m := next(t, e.fetchJobs)
	req, ok := m.Data.(*events.FetchRequested)
	if !ok || m.Event.Type() != events.TypeFetchRequested {
		t.Fatalf("got %s %T, want a fetch request", m.Event.Type(), m.Data)
	}
	if req.GitRepository == nil || req.GitRepository.URL != repo.Spec.URL || req.Previous != nil {
		t.Fatalf("fetch request = %+v", req)
	}
	if req.Job.Object.UID == "" || req.Job.Object.Generation != 1 {
		t.Fatalf("job object = %+v", req.Job.Object)
	}

	// The finalizer is in place; a brand-new object gets no status write
	// before its outcome (kstatus reads observedGeneration -1 as in
	// progress).
	var got sourcev1.GitRepository
	eventually(t, "finalizer", func() bool {
		_ = e.k8s.Get(ctx, key, &got)
		return len(got.Finalizers) == 1 && got.Finalizers[0] == sourcev1.SourceFinalizer
	})
	if got.Spec.Timeout == nil || got.Spec.Timeout.Duration != time.Minute {
		t.Errorf("spec.timeout = %v, want the CRD default 60s", got.Spec.Timeout)
	}
	if got.Status.ObservedGeneration != -1 || len(got.Status.Conditions) != 0 {
		t.Errorf("status of a new object = %+v, want untouched until the outcome", got.Status)
	}

	// A malformed message on the event stream is rejected without harm.
	if _, err := e.conn.JS.Publish(ctx, events.EventSubject("GitRepository", "default", "podinfo"), []byte("not a cloudevent")); err != nil {
		t.Fatal(err)
	}

	// Outcomes of jobs the watcher did not issue change nothing, however
	// close to a real one: no seal, the real job's seal on another job ID
	// or generation. (Each has an ID of its own: the bus would drop a
	// second message with the real job's ID as a duplicate.)
	rev := "master@sha1:0123456789abcdef0123456789abcdef01234567"
	evil := &meta.Artifact{Path: "x", URL: "http://attacker.example/x.tar.gz", Revision: rev, Digest: "sha256:evil", LastUpdateTime: metav1.Now()}
	unsealed, renamed, moved := req.Job, req.Job, req.Job
	unsealed.ID, unsealed.Seal = "unsealed", ""
	renamed.ID = "renamed"
	moved.ID, moved.Object.Generation = req.Job.ID+"-next", 2
	forgedBefore := counterValue(t, "headwater_forged_outcomes_total")
	for _, job := range []events.Job{unsealed, renamed, moved} {
		publishOutcome(t, e, events.TypeArtifactStored, &events.Outcome{Job: job, Revision: rev, Artifact: evil})
	}
	eventually(t, "three forged outcomes counted", func() bool {
		return counterValue(t, "headwater_forged_outcomes_total") == forgedBefore+3
	})
	if err := e.k8s.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Artifact != nil || len(got.Status.Conditions) != 0 {
		t.Fatalf("a forged outcome changed status: %+v", got.Status)
	}

	// The artifact-server announces a stored artifact: status and Event follow.
	size := int64(1234)
	stored := &events.Outcome{Job: req.Job, Revision: rev, EventMessage: "stored artifact for commit 'Initial'",
		Artifact: &meta.Artifact{Path: "gitrepository/default/podinfo/0123.tar.gz", URL: "http://a/gitrepository/default/podinfo/0123.tar.gz",
			Revision: rev, Digest: "sha256:abc", Size: &size, LastUpdateTime: metav1.Now()}}
	publishOutcome(t, e, events.TypeArtifactStored, stored)
	eventually(t, "Ready=True", func() bool {
		_ = e.k8s.Get(ctx, key, &got)
		return conditions.IsReady(&got)
	})
	if got.Status.Artifact == nil || got.Status.Artifact.Digest != "sha256:abc" || got.Status.ObservedGeneration != 1 {
		t.Fatalf("status = %+v", got.Status)
	}
	if c := conditions.Get(&got, meta.ReadyCondition); c.Message != "stored artifact for revision '"+rev+"'" || c.Reason != meta.SucceededReason {
		t.Errorf("Ready = %+v", c)
	}
	if conditions.IsReconciling(&got) {
		t.Error("Reconciling still set after the outcome")
	}
	waitEvent(t, e, "podinfo", corev1.EventTypeNormal, "NewArtifact", "stored artifact for commit 'Initial'")

	// A reconcile request makes a new job that carries the token and the
	// stored artifact, so the fetcher can answer "unchanged".
	patch := client.MergeFrom(got.DeepCopy())
	got.Annotations = map[string]string{meta.ReconcileRequestAnnotation: "now-1"}
	if err := e.k8s.Patch(ctx, &got, patch); err != nil {
		t.Fatal(err)
	}
	m = next(t, e.fetchJobs)
	req2 := m.Data.(*events.FetchRequested)
	if req2.Job.ReconcileToken != "now-1" || req2.Previous == nil || req2.Previous.Digest != "sha256:abc" || req2.Force {
		t.Fatalf("second fetch request = %+v", req2)
	}

	// A new generation of a reconciled object is marked in progress
	// before its job, as Flux does, and its job is a forced rebuild only
	// if content-affecting fields changed (the interval is not one). It
	// stays Ready with the artifact it has (Flux's ProgressiveStatus).
	patch = client.MergeFrom(got.DeepCopy())
	got.Spec.Interval = metav1.Duration{Duration: 10 * time.Minute}
	if err := e.k8s.Patch(ctx, &got, patch); err != nil {
		t.Fatal(err)
	}
	m = next(t, e.fetchJobs)
	if req3 := m.Data.(*events.FetchRequested); req3.Job.Object.Generation != 2 || req3.Force {
		t.Fatalf("job after an interval change = %+v, want generation 2, not forced", req3.Job)
	}
	if err := e.k8s.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	if c := conditions.Get(&got, meta.ReconcilingCondition); c == nil || c.Reason != meta.ProgressingReason ||
		c.Message != "processing object: new generation 1 -> 2" {
		t.Errorf("Reconciling = %+v", c)
	}
	if r := conditions.Get(&got, meta.ReadyCondition); r == nil || r.Status != metav1.ConditionTrue ||
		r.Message != "stored artifact for revision '"+rev+"'" {
		t.Errorf("Ready = %+v, want True with the stored artifact while progressing", r)
	}

	// A failure keeps the artifact and warns.
	failed := &events.Outcome{Job: req2.Job, Failure: &events.Failure{Condition: sourcev1.FetchFailedCondition,
		Reason: sourcev1.GitOperationFailedReason, Message: "failed to checkout and determine revision: boom"}}
	publishOutcome(t, e, events.TypeArtifactFailed, failed)
	eventually(t, "Ready=False", func() bool {
		_ = e.k8s.Get(ctx, key, &got)
		return conditions.IsFalse(&got, meta.ReadyCondition)
	})
	if got.Status.Artifact == nil || got.Status.Artifact.Digest != "sha256:abc" {
		t.Errorf("artifact lost on failure: %+v", got.Status.Artifact)
	}
	if !conditions.IsTrue(&got, sourcev1.FetchFailedCondition) || got.Status.LastHandledReconcileAt != "now-1" {
		t.Errorf("status after failure = %+v", got.Status)
	}
	waitEvent(t, e, "podinfo", corev1.EventTypeWarning, sourcev1.GitOperationFailedReason, "failed to checkout and determine revision: boom")

	// Deletion schedules the artifacts' removal and releases the object.
	if err := e.k8s.Delete(ctx, &got); err != nil {
		t.Fatal(err)
	}
	m = next(t, e.packageJobs)
	del, ok := m.Data.(*events.DeleteRequested)
	if !ok || del.Job.Object.Name != "podinfo" || del.Job.Object.UID != req.Job.Object.UID {
		t.Fatalf("got %s %+v, want a delete request for podinfo", m.Event.Type(), m.Data)
	}
	eventually(t, "object gone", func() bool {
		return apierrors.IsNotFound(e.k8s.Get(ctx, key, &got))
	})
}

func testSuspend(t *testing.T, e *env) {
	ctx := context.Background()
	repo := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "suspended", Namespace: "default"},
		Spec: sourcev1.GitRepositorySpec{URL: "http://127.0.0.1:1/x.git", Suspend: true,
			Interval: metav1.Duration{Duration: time.Minute}},
	}
	if err := e.k8s.Create(ctx, repo); err != nil {
		t.Fatal(err)
	}
	var got sourcev1.GitRepository
	eventually(t, "finalizer", func() bool {
		_ = e.k8s.Get(ctx, client.ObjectKeyFromObject(repo), &got)
		return len(got.Finalizers) == 1
	})
	// Resuming makes the first job; none was made while suspended, so the
	// first message on the queue must be the resumed generation's.
	patch := client.MergeFrom(got.DeepCopy())
	got.Spec.Suspend = false
	if err := e.k8s.Patch(ctx, &got, patch); err != nil {
		t.Fatal(err)
	}
	m := next(t, e.fetchJobs)
	req := m.Data.(*events.FetchRequested)
	if req.Job.Object.Name != "suspended" || req.Job.Object.Generation != got.Generation {
		t.Fatalf("first job = %+v, want one for the resumed generation %d", req.Job.Object, got.Generation)
	}
}

// testRateLimited answers a source's jobs RateLimited with a hold far
// shorter than a second, several times in a row, as a fetcher does when
// the host's hold ends a moment after the job was taken: each outcome
// must bring a new job (one the bus does not drop as a duplicate of the
// last, made in the same second from the same inputs), and the source
// shows it is retrying until a job succeeds.
func testRateLimited(t *testing.T, e *env) {
	ctx := context.Background()
	key := createHourly(t, e, "throttled")
	retriedBefore := retriedCount(t, "GitRepository", "rate_limited")
	job := next(t, e.fetchJobs).Data.(*events.FetchRequested).Job
	seen := map[string]bool{job.ID: true}
	const rounds = 5
	for i := range rounds {
		publishOutcome(t, e, events.TypeArtifactFailed, &events.Outcome{Job: job, Failure: &events.Failure{
			Condition: sourcev1.FetchFailedCondition, Reason: "RateLimited",
			Message: "rate limited by 127.0.0.1:1, next attempt in 1s", RetryAfterMilliseconds: 20}})
		m := next(t, e.fetchJobs)
		req, ok := m.Data.(*events.FetchRequested)
		if !ok || req.Job.Object.Name != key.Name {
			t.Fatalf("after rate limited outcome %d: got %s %+v, want a job for %s", i+1, m.Event.Type(), m.Data, key.Name)
		}
		if seen[req.Job.ID] {
			t.Fatalf("after rate limited outcome %d: job %s again", i+1, req.Job.ID)
		}
		seen[req.Job.ID] = true
		job = req.Job
	}
	if n := retriedCount(t, "GitRepository", "rate_limited") - retriedBefore; n != rounds {
		t.Errorf("headwater_fetch_retried_total{after=rate_limited} grew by %v, want %d", n, rounds)
	}
	var got sourcev1.GitRepository
	if err := e.k8s.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	if c := conditions.Get(&got, meta.ReconcilingCondition); c == nil || c.Reason != meta.ProgressingWithRetryReason {
		t.Errorf("Reconciling = %+v, want ProgressingWithRetry while rate limited", c)
	}
	rev := "master@sha1:0123456789abcdef0123456789abcdef01234567"
	publishOutcome(t, e, events.TypeArtifactStored, &events.Outcome{Job: job, Revision: rev,
		Artifact: &meta.Artifact{Path: "gitrepository/default/throttled/0123.tar.gz", URL: "http://a/gitrepository/default/throttled/0123.tar.gz",
			Revision: rev, Digest: "sha256:throttled", LastUpdateTime: metav1.Now()}})
	eventually(t, "Ready=True", func() bool {
		_ = e.k8s.Get(ctx, key, &got)
		return conditions.IsReady(&got) && !conditions.IsReconciling(&got)
	})
	if err := e.k8s.Delete(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if m := next(t, e.packageJobs); m.Event.Type() != events.TypeDeleteRequested {
		t.Fatalf("got %s, want the deletion job", m.Event.Type())
	}
}

// testLateOutcome publishes the outcomes of a source's older jobs after
// its newest job's, as a fetcher or packager cut off from the bus would
// once it is back: the older revision, stored later (so with the later
// lastUpdateTime), and a failure. Neither moves the source back, and
// neither records an Event.
func testLateOutcome(t *testing.T, e *env) {
	ctx := context.Background()
	key := createHourly(t, e, "late")
	// Three jobs, each asked for by a reconcile request.
	var jobs []events.Job
	var got sourcev1.GitRepository
	for i := range 3 {
		if i > 0 {
			requestReconcile(t, e, key, fmt.Sprintf("late-%d", i))
		}
		m := next(t, e.fetchJobs)
		req, ok := m.Data.(*events.FetchRequested)
		if !ok || req.Job.Object.Name != key.Name {
			t.Fatalf("got %s %+v, want a job for %s", m.Event.Type(), m.Data, key.Name)
		}
		jobs = append(jobs, req.Job)
	}
	if !jobs[0].RequestedAt.Before(jobs[2].RequestedAt) || !jobs[1].RequestedAt.Before(jobs[2].RequestedAt) {
		t.Fatalf("jobs not requested in order: %+v", jobs)
	}
	publishOutcome(t, e, events.TypeArtifactStored, storedOutcome(jobs[2], "c", "sha256:newest"))
	eventually(t, "the newest job's artifact", func() bool {
		_ = e.k8s.Get(ctx, key, &got)
		return conditions.IsReady(&got) && got.Status.Artifact != nil && got.Status.Artifact.Digest == "sha256:newest"
	})
	before := counterValue(t, "headwater_superseded_outcomes_total")
	// A second later, so the late artifact's lastUpdateTime is the newer.
	time.Sleep(time.Second)
	publishOutcome(t, e, events.TypeArtifactStored, storedOutcome(jobs[0], "a", "sha256:oldest"))
	publishOutcome(t, e, events.TypeArtifactFailed, &events.Outcome{Job: jobs[1], Failure: &events.Failure{
		Condition: sourcev1.FetchFailedCondition, Reason: sourcev1.GitOperationFailedReason, Message: "late failure"}})
	eventually(t, "two superseded outcomes counted", func() bool {
		return counterValue(t, "headwater_superseded_outcomes_total") == before+2
	})
	checkNotMovedBack(t, e, key, "sha256:newest", "late-2", "stored artifact for commit 'a'", "late failure")
	if err := e.k8s.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	if err := e.k8s.Delete(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if m := next(t, e.packageJobs); m.Event.Type() != events.TypeDeleteRequested {
		t.Fatalf("got %s, want the deletion job", m.Event.Type())
	}
}

// createHourly creates a GitRepository name in default, of branch master
// at an unreachable URL, reconciled every hour: its jobs come from what the
// test does, not from its interval.
func createHourly(t *testing.T, e *env, name string) client.ObjectKey {
	t.Helper()
	repo := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: sourcev1.GitRepositorySpec{URL: "http://127.0.0.1:1/" + name + ".git",
			Interval: metav1.Duration{Duration: time.Hour}, Reference: &sourcev1.GitRepositoryRef{Branch: "master"}},
	}
	if err := e.k8s.Create(context.Background(), repo); err != nil {
		t.Fatal(err)
	}
	return client.ObjectKeyFromObject(repo)
}

func publishOutcome(t *testing.T, e *env, eventType string, o *events.Outcome) {
	t.Helper()
	subject := events.EventSubject(o.Job.Object.Kind, o.Job.Object.Namespace, o.Job.Object.Name)
	if err := e.pub.Publish(context.Background(), subject, eventType, o.Job, o); err != nil {
		t.Fatal(err)
	}
}

func waitEvent(t *testing.T, e *env, name, typ, reason, message string) {
	t.Helper()
	eventually(t, "event "+reason, func() bool {
		var list corev1.EventList
		if err := e.k8s.List(context.Background(), &list, client.InNamespace("default")); err != nil {
			return false
		}
		for _, ev := range list.Items {
			if ev.InvolvedObject.Name == name && ev.Type == typ && ev.Reason == reason && ev.Message == message {
				return true
			}
		}
		return false
	})
}

// counterValue reads a counter without labels from the registry the
// watcher's manager serves on /metrics; 0 when it has not been registered.
func counterValue(t *testing.T, name string) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// retriedCount reads headwater_fetch_retried_total for kind and after.
func retriedCount(t *testing.T, kind, after string) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "headwater_fetch_retried_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["kind"] == kind && labels["after"] == after {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func testLogger(t *testing.T) logr.Logger {
	return testr.New(t)
}

// testInclude: a source including one that does not exist waits with
// IncludeUnavailable; once the included source has an artifact, the
// includer's job carries it; a changed included artifact makes a forced
// rebuild; a cycle stalls.
func testInclude(t *testing.T, e *env) {
	ctx := context.Background()
	parent := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "parent", Namespace: "default"},
		Spec: sourcev1.GitRepositorySpec{URL: "http://127.0.0.1:1/parent.git", Interval: metav1.Duration{Duration: time.Hour},
			Include: []sourcev1.GitRepositoryInclude{{GitRepositoryRef: meta.LocalObjectReference{Name: "child"}, ToPath: "deps/child"}}},
	}
	if err := e.k8s.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	var got sourcev1.GitRepository
	eventually(t, "IncludeUnavailable NotFound", func() bool {
		_ = e.k8s.Get(ctx, client.ObjectKeyFromObject(parent), &got)
		c := conditions.Get(&got, sourcev1.IncludeUnavailableCondition)
		return c != nil && c.Reason == "NotFound" && conditions.IsFalse(&got, meta.ReadyCondition)
	})
	waitEvent(t, e, "parent", corev1.EventTypeNormal, "NotFound", // Flux's trace
		conditions.Get(&got, sourcev1.IncludeUnavailableCondition).Message)

	child := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "child", Namespace: "default"},
		Spec:       sourcev1.GitRepositorySpec{URL: "http://127.0.0.1:1/child.git", Interval: metav1.Duration{Duration: time.Hour}},
	}
	if err := e.k8s.Create(ctx, child); err != nil {
		t.Fatal(err)
	}
	// The child's job; the parent keeps waiting (NoArtifact) meanwhile.
	m := next(t, e.fetchJobs)
	childReq := m.Data.(*events.FetchRequested)
	if childReq.Job.Object.Name != "child" {
		t.Fatalf("job for %s, want child", childReq.Job.Object.Name)
	}
	eventually(t, "IncludeUnavailable NoArtifact", func() bool {
		_ = e.k8s.Get(ctx, client.ObjectKeyFromObject(parent), &got)
		c := conditions.Get(&got, sourcev1.IncludeUnavailableCondition)
		return c != nil && c.Reason == "NoArtifact" && c.Message == "no artifact available for include 'child'"
	})

	// The child gets an artifact: the parent is reconciled at once and its
	// job carries the child's artifact at the include's paths.
	storeArtifact(t, e, childReq.Job, "sha256:c1")
	m = next(t, e.fetchJobs)
	parentReq := m.Data.(*events.FetchRequested)
	if parentReq.Job.Object.Name != "parent" || len(parentReq.Includes) != 1 {
		t.Fatalf("job = %+v, want the parent's with one include", parentReq)
	}
	if inc := parentReq.Includes[0]; inc.Name != "child" || inc.ToPath != "deps/child" || inc.FromPath != "" || inc.Artifact.Digest != "sha256:c1" {
		t.Errorf("include = %+v", inc)
	}
	eventually(t, "IncludeUnavailable cleared", func() bool {
		_ = e.k8s.Get(ctx, client.ObjectKeyFromObject(parent), &got)
		return !conditions.Has(&got, sourcev1.IncludeUnavailableCondition)
	})

	// The parent's artifact is built with child's c1; a new child artifact
	// rebuilds the parent, forced, although its own commit is the same.
	storeArtifact(t, e, parentReq.Job, "sha256:p1", &parentReq.Includes[0].Artifact)
	eventually(t, "includedArtifacts recorded", func() bool {
		_ = e.k8s.Get(ctx, client.ObjectKeyFromObject(parent), &got)
		return len(got.Status.IncludedArtifacts) == 1 && got.Status.IncludedArtifacts[0].Digest == "sha256:c1"
	})
	childJob := childReq.Job
	childJob.ID += "/2"
	e.seal.Seal(&childJob)
	storeArtifact(t, e, childJob, "sha256:c2")
	m = next(t, e.fetchJobs)
	rebuild := m.Data.(*events.FetchRequested)
	if rebuild.Job.Object.Name != "parent" || !rebuild.Force || rebuild.Includes[0].Artifact.Digest != "sha256:c2" {
		t.Fatalf("rebuild job = %+v, want a forced parent job with child's c2", rebuild)
	}

	// A cycle (child now includes parent) stalls both ends clearly.
	if err := e.k8s.Get(ctx, client.ObjectKeyFromObject(child), &got); err != nil {
		t.Fatal(err)
	}
	p := client.MergeFrom(got.DeepCopy())
	got.Spec.Include = []sourcev1.GitRepositoryInclude{{GitRepositoryRef: meta.LocalObjectReference{Name: "parent"}}}
	if err := e.k8s.Patch(ctx, &got, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "cycle stalled", func() bool {
		_ = e.k8s.Get(ctx, client.ObjectKeyFromObject(child), &got)
		c := conditions.Get(&got, sourcev1.IncludeUnavailableCondition)
		return c != nil && c.Reason == "IncludeCycle" && c.Message == "include cycle detected: child -> parent -> child" &&
			conditions.IsStalled(&got)
	})
}

// storeArtifact announces a stored artifact with the given digest for job,
// built with the included artifacts.
func storeArtifact(t *testing.T, e *env, job events.Job, digest string, included ...*meta.Artifact) {
	t.Helper()
	rev := "master@sha1:" + strings.Repeat("a", 40)
	path := "gitrepository/default/" + job.Object.Name + "/" + strings.TrimPrefix(digest, "sha256:") + ".tar.gz"
	o := &events.Outcome{Job: job, Revision: rev, EventMessage: "stored",
		Artifact:          &meta.Artifact{Path: path, URL: "http://a/" + path, Revision: rev, Digest: digest, LastUpdateTime: metav1.Now()},
		IncludedArtifacts: included}
	publishOutcome(t, e, events.TypeArtifactStored, o)
}
