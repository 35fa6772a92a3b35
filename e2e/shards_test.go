package e2e

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// shardKey is the label of Flux's sharding docs.
const shardKey = "sharding.fluxcd.io/key"

// TestWatcherShards runs two watcher shards as Flux's sharding docs run
// source-controllers: the main one (!sharding.fluxcd.io/key, which also
// reports unowned sources) and shard1. Each leads its own lease; a source
// goes Ready through its shard only; a source whose label moves to the
// main shard keeps its artifact and is Ready in every version written
// (watched, not sampled), the move costs one fetch job, the main shard's,
// and its next revision is written by the main shard alone; a source
// whose label has a typo is reported and left alone.
func TestWatcherShards(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	e := startPrivateEnv(t, "shards", func(cfg *harness.Config) {
		cfg.WatcherReplicas = 2
		// -receivers serves every source: a shard refuses it.
		cfg.Receivers = false
		cfg.ExtraArgs[harness.Watcher] = append(cfg.ExtraArgs[harness.Watcher], "-leader-elect=true")
		cfg.WatcherArgs = [][]string{
			{"-watch-label-selector", "!" + shardKey, "-fleet-selectors", "!" + shardKey + ";" + shardKey + " in (shard1)"},
			{"-watch-label-selector", shardKey + " in (shard1)"},
		}
	})
	mainShard, shard1 := e.Watchers()[0], e.Watchers()[1]

	// Each shard leads, with a lease of its own.
	eventually(t, "each shard leads its own lease", func() error {
		var leases coordinationv1.LeaseList
		if err := e.Client.List(t.Context(), &leases, client.InNamespace(namespace)); err != nil {
			return err
		}
		holders := map[string]string{}
		for _, l := range leases.Items {
			if strings.HasPrefix(l.Name, "headwater-watcher") {
				holders[l.Name] = holder(&l)
			}
		}
		if len(holders) != 2 {
			return fmt.Errorf("watcher leases %v, want two", holders)
		}
		if _, ok := holders[watcherLease]; ok {
			return fmt.Errorf("a shard holds the unsharded lease %s: %v", watcherLease, holders)
		}
		for _, s := range []*harness.Service{mainShard, shard1} {
			if v, err := metricSum(s.TelemetryAddr, "leader_election_master_status"); err != nil || v != 1 {
				return fmt.Errorf("%s leads %v leases (%v)", s.Name, v, err)
			}
		}
		return nil
	})

	files := func(name, v string) map[string]string {
		return map[string]string{"deploy/app.yaml": "kind: App\nname: " + name + "\nversion: " + v + "\n"}
	}
	_, m1 := e.newRepo(t, "shards-main", files("main", "1"))
	repoMoved, s1 := e.newRepo(t, "shards-moved", files("moved", "1"))
	e.createLabelledSource(t, "shards-main", e.Git.RepoURL("shards-main"), nil)
	e.createLabelledSource(t, "shards-moved", e.Git.RepoURL("shards-moved"), map[string]string{shardKey: "shard1"})
	e.waitArtifact(t, "shards-main", revision(m1))
	before := e.waitArtifact(t, "shards-moved", revision(s1))

	// Each source went Ready through its own shard.
	for _, c := range []struct {
		svc         *harness.Service
		name        string
		stored, not int
	}{
		{mainShard, "shards-main", 1, 0}, {shard1, "shards-moved", 1, 0},
		{mainShard, "shards-moved", 0, 0}, {shard1, "shards-main", 0, 0},
	} {
		if n := storedLines(t, c.svc, c.name); n != c.stored {
			t.Errorf("%s stored %d artifacts of %s, want %d", c.svc.Name, n, c.name, c.stored)
		}
	}

	// The label moves to the main shard: shard1's cache drops the source,
	// which must not read as a deletion (no garbage collection, the
	// finalizer kept); the main shard takes it over. The object is written
	// back whole by a typed client, as a tool relabelling sources would:
	// that is a new generation too (the CRD defaults spec.timeout to "60s",
	// the Go type writes it back as "1m0s"), which the main shard marks
	// in progress while the stored artifact keeps the source Ready.
	moved := e.get(t, "shards-moved")
	// Every write of the source from here on, through the move and the
	// main shard's next revision, as the API server serves them: a
	// consumer watching it must never see it not Ready.
	writes := watchSource(t, e.RESTConfig, e.Scheme, moved)
	delete(moved.Labels, shardKey)
	if err := e.Client.Update(t.Context(), moved); err != nil {
		t.Fatalf("move shards-moved to the main shard: %v", err)
	}
	// The artifact and the finalizer never go.
	consistently(t, "shards-moved keeps its artifact and finalizer after the move", 3*time.Second, func() error {
		obj := e.get(t, "shards-moved")
		if obj.Status.Artifact == nil || obj.Status.Artifact.Digest != before.Status.Artifact.Digest {
			return fmt.Errorf("artifact %v, want %s", obj.Status.Artifact, before.Status.Artifact.Digest)
		}
		if !slices.Contains(obj.Finalizers, sourcev1.SourceFinalizer) {
			return fmt.Errorf("finalizers %v", obj.Finalizers)
		}
		return nil
	})
	// The main shard's job settles the move: one fetch more than if
	// nothing had moved (the public outcomes name one job besides the
	// first), made by the main shard (the job's labels are the moved
	// ones), and none by shard1.
	eventually(t, "the main shard's job of shards-moved settled the move", func() error {
		obj := e.get(t, "shards-moved")
		if c := sourceReady(obj); c != metav1.ConditionTrue || obj.Status.ObservedGeneration != obj.Generation {
			return fmt.Errorf("Ready %s, observedGeneration %d of %d", c, obj.Status.ObservedGeneration, obj.Generation)
		}
		if jobs := movedJobs(e.recorder, "shards-moved"); len(jobs) < 2 {
			return fmt.Errorf("outcomes of jobs %v, want the first and the takeover's", jobs)
		}
		return nil
	})
	jobs := movedJobs(e.recorder, "shards-moved")
	if len(jobs) != 2 {
		t.Errorf("the move made %d fetch jobs (%v), want one", len(jobs)-1, jobs)
	}
	if byShard1 := slices.DeleteFunc(slices.Clone(jobs), func(j events.Job) bool { return j.Object.Labels[shardKey] != "shard1" }); len(byShard1) != 1 {
		t.Errorf("jobs of shard1 %v, want the first alone", byShard1)
	}
	if code, _ := httpGet(t, before.Status.Artifact.URL); code != 200 {
		t.Errorf("the moved source's artifact answers %d after the move, want 200", code)
	}
	s2 := commit(t, repoMoved, files("moved", "2"), "Second commit of shards-moved")
	token := e.requestReconcile(t, "shards-moved")
	e.waitArtifact(t, "shards-moved", revision(s2))
	e.checkHandled(t, "shards-moved", token)
	if n := storedLines(t, mainShard, "shards-moved"); n != 1 {
		t.Errorf("the main shard stored %d artifacts of shards-moved after the move, want 1", n)
	}
	if n := storedLines(t, shard1, "shards-moved"); n != 1 {
		t.Errorf("shard1 stored %d artifacts of shards-moved, want the 1 before the move", n)
	}
	// Ready was True in every write of the move and of the next
	// revision: the takeover is no blip for a consumer.
	for _, w := range writes.stop(t) {
		if w.ready.Status != metav1.ConditionTrue {
			t.Errorf("shards-moved written with Ready %s (%s: %s) at resourceVersion %s (generation %d, observed %d, labels %v, Reconciling %v)",
				w.ready.Status, w.ready.Reason, w.ready.Message, w.resourceVersion, w.generation, w.observed, w.labels, w.reconciling)
		}
	}

	// A typo in the label: no shard owns the source; the main shard
	// reports it, and nothing reconciles it.
	e.createLabelledSource(t, "shards-typo", e.Git.RepoURL("shards-main"), map[string]string{shardKey: "shard-1"})
	eventually(t, "the main shard reports shards-typo as unowned", func() error {
		v, err := metricSum(mainShard.TelemetryAddr, "headwater_watcher_unowned_sources", `kind="GitRepository"`)
		if err != nil || v != 1 {
			return fmt.Errorf("headwater_watcher_unowned_sources %v (%v), want 1", v, err)
		}
		logs, err := mainShard.Logs()
		if err != nil {
			return err
		}
		if !regexp.MustCompile(`source matches no watcher shard.* name=shards-typo`).MatchString(logs) {
			return fmt.Errorf("no log line names shards-typo")
		}
		return nil
	})
	consistently(t, "nothing reconciles shards-typo", 3*time.Second, func() error {
		if obj := e.get(t, "shards-typo"); len(obj.Status.Conditions) > 0 || len(obj.Finalizers) > 0 {
			return fmt.Errorf("conditions %v, finalizers %v", obj.Status.Conditions, obj.Finalizers)
		}
		return nil
	})
}

// createLabelledSource creates a GitRepository of the private Env with
// labels.
func (e *privateEnv) createLabelledSource(t *testing.T, name, url string, labels map[string]string) {
	t.Helper()
	obj := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec: sourcev1.GitRepositorySpec{
			URL:       url,
			Interval:  metav1.Duration{Duration: 5 * time.Minute},
			Reference: &sourcev1.GitRepositoryRef{Branch: branch},
		},
	}
	if err := e.Client.Create(t.Context(), obj); err != nil {
		t.Fatalf("create gitrepository %s: %v", name, err)
	}
}

// storedLines counts the new artifacts a watcher says it wrote into a
// source's status (its "stored artifact" log lines naming it).
func storedLines(t *testing.T, s *harness.Service, name string) int {
	t.Helper()
	logs, err := s.Logs()
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(^|\s)name=` + regexp.QuoteMeta(name) + `(\s|$)`)
	n := 0
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, `msg="stored artifact"`) && re.MatchString(line) {
			n++
		}
	}
	return n
}

// sourceReady is the status of obj's Ready condition, Unknown without one.
func sourceReady(obj *sourcev1.GitRepository) metav1.ConditionStatus {
	for _, c := range obj.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status
		}
	}
	return metav1.ConditionUnknown
}

// sourceWrite is one version of a GitRepository as a watch served it.
type sourceWrite struct {
	resourceVersion      string
	generation, observed int64
	labels               map[string]string
	ready                metav1.Condition
	reconciling          *metav1.Condition
}

// sourceWrites records every version of one GitRepository a watch serves,
// from a resourceVersion on, until stopped.
type sourceWrites struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	seen   []sourceWrite
	err    error
}

// watchSource watches obj from its resourceVersion on: every version the
// API server serves after it is recorded, none sampled.
func watchSource(t *testing.T, cfg *rest.Config, scheme *runtime.Scheme, obj *sourcev1.GitRepository) *sourceWrites {
	t.Helper()
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	w, err := c.Watch(ctx, &sourcev1.GitRepositoryList{}, client.InNamespace(obj.Namespace),
		client.MatchingFields{"metadata.name": obj.Name},
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: obj.ResourceVersion}})
	if err != nil {
		cancel()
		t.Fatalf("watch gitrepository %s: %v", obj.Name, err)
	}
	ws := &sourceWrites{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(ws.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			o, ok := ev.Object.(*sourcev1.GitRepository)
			if !ok || ev.Type == watch.Error {
				if ctx.Err() == nil {
					ws.mu.Lock()
					ws.err = fmt.Errorf("watch of %s ended: %v", obj.Name, ev.Object)
					ws.mu.Unlock()
				}
				return
			}
			sw := sourceWrite{resourceVersion: o.ResourceVersion, generation: o.Generation, observed: o.Status.ObservedGeneration,
				labels: o.Labels, ready: metav1.Condition{Type: meta.ReadyCondition, Status: metav1.ConditionUnknown, Reason: "NoReadyCondition"}}
			if c := apimeta.FindStatusCondition(o.Status.Conditions, meta.ReadyCondition); c != nil {
				sw.ready = *c
			}
			sw.reconciling = apimeta.FindStatusCondition(o.Status.Conditions, meta.ReconcilingCondition)
			ws.mu.Lock()
			ws.seen = append(ws.seen, sw)
			ws.mu.Unlock()
		}
		if ctx.Err() == nil {
			ws.mu.Lock()
			ws.err = fmt.Errorf("watch of %s closed by the API server", obj.Name)
			ws.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-ws.done })
	return ws
}

// stop ends the watch and returns every version it served; a watch that
// ended early fails the test, since versions may then be missing.
func (ws *sourceWrites) stop(t *testing.T) []sourceWrite {
	t.Helper()
	ws.cancel()
	<-ws.done
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.err != nil {
		t.Fatal(ws.err)
	}
	if len(ws.seen) == 0 {
		t.Fatal("the watch served no version of the source")
	}
	return ws.seen
}

// movedJobs are the distinct jobs whose public outcomes about the
// GitRepository name were recorded, in order.
func movedJobs(rec *eventRecorder, name string) []events.Job {
	var jobs []events.Job
	for _, ev := range rec.forSource(name) {
		o := ev.outcome()
		if o == nil || slices.ContainsFunc(jobs, func(j events.Job) bool { return j.ID == o.Job.ID }) {
			continue
		}
		jobs = append(jobs, o.Job)
	}
	return jobs
}
