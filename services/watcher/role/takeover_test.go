package role

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/kubeconfig"
	"github.com/headwater-gitops/headwater/services/watcher/internal/shard"
)

// takeoverChildEnv carries a shard's settings (takeoverShard, JSON) to the
// child process of TestShardTakeover that runs it.
const takeoverChildEnv = "HEADWATER_TEST_TAKEOVER_SHARD"

// shardKey is the label of Flux's sharding docs.
const shardKey = "sharding.fluxcd.io/key"

// takeoverShard is one watcher shard of TestShardTakeover.
type takeoverShard struct {
	// User is the API server user the shard writes as (its kubeconfig's).
	User       string `json:"user"`
	Selector   string `json:"selector"`
	Kubeconfig string `json:"kubeconfig"`
	NATS       string `json:"nats"`
	JobKey     string `json:"jobKey"`
	// Test is the test whose child process runs the shard; empty is
	// TestShardTakeover.
	Test string `json:"test,omitempty"`
	// LeaderElect runs the shard's replicas with leader election, on
	// short leases.
	LeaderElect bool `json:"leaderElect,omitempty"`
	// Telemetry is the address of the shard's /metrics; empty serves
	// none.
	Telemetry string `json:"telemetry,omitempty"`
}

// TestShardTakeover runs two watcher shards as Flux's sharding docs run
// source-controllers (the main one, !sharding.fluxcd.io/key, and shard1),
// each in a process of its own and writing as an API user of its own, on
// one API server and one NATS server; the test plays the fetchers and
// artifact-servers. Two Ready sources of shard1 move to the main shard:
// one by a patch of its labels (as `kubectl label`), one written back
// whole by a typed client, which also makes a new generation (the CRD
// defaults spec.timeout to "60s", the Go type writes it back as "1m0s").
// For both, every version the API server serves during the move is Ready
// (the new shard's progress mark keeps the stored artifact's Ready), the
// move costs one fetch job at most (the main shard's), shard1 writes
// nothing once the label moved (the API server's audit log names every
// writer), and a job shard1 made before the move is written by the main
// shard. A third source moves while the main shard is down: the outcome
// of shard1's job in flight, which shard1 alone receives, is not written.
func TestShardTakeover(t *testing.T) {
	if s := os.Getenv(takeoverChildEnv); s != "" {
		runTakeoverChild(t, s)
		return
	}
	ctx := context.Background()
	dir := t.TempDir()
	auditLog := filepath.Join(dir, "audit.log")
	cfg, kubeconfigs := startAuditedControlPlane(t, filepath.Join("..", "..", "..", "deploy", "crds"), auditLog, "shard-main", "shard-1")

	natsURL := startNATS(t)
	conn, fetchJobs := connectBus(ctx, t, natsURL)
	e := &env{conn: conn, pub: conn.NewPublisher("test"), fetchJobs: fetchJobs, k8s: newClient(t, cfg)}
	scheme := e.k8s.Scheme()

	jobKey := writeJobKey(t)
	shards := map[string]*takeoverChild{}
	for _, s := range []takeoverShard{
		{User: "shard-main", Selector: "!" + shardKey},
		{User: "shard-1", Selector: shardKey + " in (shard1)"},
	} {
		s.Kubeconfig, s.NATS, s.JobKey = kubeconfigs[s.User], natsURL, jobKey
		shards[s.User] = startTakeoverChild(t, dir, s)
	}

	// Two sources of shard1, Ready with an artifact.
	names := []string{"relabelled", "rewritten"}
	for _, name := range names {
		repo := &sourcev1.GitRepository{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{shardKey: "shard1"}},
			Spec: sourcev1.GitRepositorySpec{URL: "http://127.0.0.1:1/" + name + ".git", Interval: metav1.Duration{Duration: time.Hour},
				Reference: &sourcev1.GitRepositoryRef{Branch: "master"}},
		}
		if err := e.k8s.Create(ctx, repo); err != nil {
			t.Fatal(err)
		}
	}
	first := fetchJobsFor(t, fetchJobs, names)
	for _, name := range names {
		if first[name].Job.Object.Labels[shardKey] != "shard1" {
			t.Fatalf("the first job of %s has labels %v, want shard1's", name, first[name].Job.Object.Labels)
		}
		// The shards' consumers deliver the outcomes published after
		// they joined: shard1 made the job, so it has.
		storeArtifact(t, e, first[name].Job, "sha256:"+name)
	}
	for _, name := range names {
		waitSource(t, e.k8s, name, func(g *sourcev1.GitRepository) error {
			if !conditions.IsReady(g) || g.Status.Artifact == nil || g.Status.ObservedGeneration != g.Generation {
				return fmt.Errorf("Ready %v, artifact %v, observedGeneration %d of %d",
					conditions.Get(g, meta.ReadyCondition), g.Status.Artifact, g.Status.ObservedGeneration, g.Generation)
			}
			return nil
		})
	}

	// A job of shard1 in flight when the label moves: a reconcile
	// request makes it; its outcome comes after the move.
	var relabelled sourcev1.GitRepository
	if err := e.k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "relabelled"}, &relabelled); err != nil {
		t.Fatal(err)
	}
	token := "before-the-move"
	if err := e.k8s.Patch(ctx, &relabelled, client.RawPatch(types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+meta.ReconcileRequestAnnotation+`":"`+token+`"}}}`))); err != nil {
		t.Fatal(err)
	}
	inFlight := fetchJobsFor(t, fetchJobs, []string{"relabelled"})["relabelled"]
	if inFlight.Job.Object.Labels[shardKey] != "shard1" || inFlight.Job.ReconcileToken != token {
		t.Fatalf("the requested job = %+v, want shard1's with the token", inFlight.Job)
	}

	// Every version of the sources from here on.
	versions := watchVersions(t, cfg, scheme, names)
	generations := map[string]int64{}
	for _, name := range names {
		var g sourcev1.GitRepository
		if err := e.k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &g); err != nil {
			t.Fatal(err)
		}
		generations[name] = g.Generation
	}
	// The moves: a label patch, and a typed client's update.
	moves := map[string]string{} // name -> resourceVersion of the move
	if err := e.k8s.Patch(ctx, &relabelled, client.RawPatch(types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+shardKey+`":null}}}`))); err != nil {
		t.Fatal(err)
	}
	moves["relabelled"] = relabelled.ResourceVersion
	var rewritten sourcev1.GitRepository
	if err := e.k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "rewritten"}, &rewritten); err != nil {
		t.Fatal(err)
	}
	delete(rewritten.Labels, shardKey)
	if err := e.k8s.Update(ctx, &rewritten); err != nil {
		t.Fatal(err)
	}
	moves["rewritten"] = rewritten.ResourceVersion
	if relabelled.Generation != generations["relabelled"] {
		t.Errorf("a label patch made generation %d of %d", relabelled.Generation, generations["relabelled"])
	}
	if rewritten.Generation != generations["rewritten"]+1 {
		t.Errorf("the typed update made generation %d of %d, want a new one (spec.timeout written back as %v)",
			rewritten.Generation, generations["rewritten"], rewritten.Spec.Timeout)
	}

	// The main shard takes both over with one fetch job each at most:
	// rewritten's new generation makes one; relabelled's job is the same
	// as shard1's in flight (same generation, request and inputs) and, made
	// within the same second, is that job (the fetch stream drops the
	// duplicate ID): then the move costs no fetch at all.
	after := fetchJobsAfterMove(t, fetchJobs, "rewritten", 3*time.Second)
	for _, name := range names {
		jobs := after[name]
		if len(jobs) > 1 || name == "rewritten" && len(jobs) != 1 {
			t.Errorf("%d fetch jobs of %s after the move, want one at most (rewritten: one)", len(jobs), name)
		}
		for _, j := range jobs {
			if _, ok := j.Job.Object.Labels[shardKey]; ok {
				t.Errorf("a job of %s after the move has labels %v, want the main shard's", name, j.Job.Object.Labels)
			}
			if j.Previous == nil || j.Previous.Digest != "sha256:"+name {
				t.Errorf("the takeover job of %s carries the artifact %v, want its stored one", name, j.Previous)
			}
		}
	}

	// shard1's job answers after the move, then the main shard's: the
	// stored artifacts are unchanged.
	answer := []events.Job{inFlight.Job}
	for _, name := range names {
		for _, j := range after[name] {
			answer = append(answer, j.Job)
		}
	}
	for _, j := range answer {
		var g sourcev1.GitRepository
		if err := e.k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: j.Object.Name}, &g); err != nil {
			t.Fatal(err)
		}
		publishOutcome(t, e, events.TypeArtifactUnchanged, &events.Outcome{Job: j, Revision: g.Status.Artifact.Revision, Artifact: g.Status.Artifact})
	}
	for _, name := range names {
		waitSource(t, e.k8s, name, func(g *sourcev1.GitRepository) error {
			if !conditions.IsReady(g) || g.Status.ObservedGeneration != g.Generation || g.Status.Artifact.Digest != "sha256:"+name {
				return fmt.Errorf("Ready %v, artifact %v, observedGeneration %d of %d",
					conditions.Get(g, meta.ReadyCondition), g.Status.Artifact, g.Status.ObservedGeneration, g.Generation)
			}
			if name == "relabelled" && g.Status.LastHandledReconcileAt != token {
				return fmt.Errorf("lastHandledReconcileAt %q, want %q", g.Status.LastHandledReconcileAt, token)
			}
			return nil
		})
	}

	// Ready in every version served since before the move.
	seen := versions.stop(t)
	for _, name := range names {
		if len(seen[name]) < 2 {
			t.Errorf("%s: %d versions watched, want the move and the writes after it", name, len(seen[name]))
		}
		for _, v := range seen[name] {
			if v.ready.Status != metav1.ConditionTrue {
				t.Errorf("%s written with Ready %s (%s: %s) at resourceVersion %s, generation %d (observed %d)",
					name, v.ready.Status, v.ready.Reason, v.ready.Message, v.resourceVersion, v.generation, v.observed)
			}
		}
	}

	// The outcome of shard1's job in flight when the label moved, while
	// the main shard is down: shard1 receives it alone and must not write
	// it (the main shard's durable consumer would, once back).
	stranded := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "stranded", Namespace: "default", Labels: map[string]string{shardKey: "shard1"}},
		Spec: sourcev1.GitRepositorySpec{URL: "http://127.0.0.1:1/stranded.git", Interval: metav1.Duration{Duration: time.Hour},
			Reference: &sourcev1.GitRepositoryRef{Branch: "master"}},
	}
	if err := e.k8s.Create(ctx, stranded); err != nil {
		t.Fatal(err)
	}
	storeArtifact(t, e, fetchJobsFor(t, fetchJobs, []string{"stranded"})["stranded"].Job, "sha256:stranded")
	waitSource(t, e.k8s, "stranded", func(g *sourcev1.GitRepository) error {
		if !conditions.IsReady(g) || g.Status.Artifact == nil {
			return fmt.Errorf("Ready %v, artifact %v", conditions.Get(g, meta.ReadyCondition), g.Status.Artifact)
		}
		return nil
	})
	if err := e.k8s.Patch(ctx, stranded, client.RawPatch(types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+meta.ReconcileRequestAnnotation+`":"`+token+`"}}}`))); err != nil {
		t.Fatal(err)
	}
	held := fetchJobsFor(t, fetchJobs, []string{"stranded"})["stranded"]
	shards["shard-main"].stop()
	strandedVersions := watchVersions(t, cfg, scheme, []string{"stranded"})
	if err := e.k8s.Patch(ctx, stranded, client.RawPatch(types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+shardKey+`":null}}}`))); err != nil {
		t.Fatal(err)
	}
	moves["stranded"] = stranded.ResourceVersion
	// A new artifact, so that applying it would be a write.
	storeArtifact(t, e, held.Job, "sha256:stranded-2")
	stream, err := conn.JS.Stream(ctx, events.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	published := info.State.LastSeq
	eventually(t, "shard1 handled the outcome of its job in flight", func() bool {
		c, err := conn.JS.Consumer(ctx, events.EventStream, shards["shard-1"].consumer)
		if err != nil {
			return false
		}
		ci, err := c.Info(ctx)
		return err == nil && ci.AckFloor.Stream >= published
	})
	var got sourcev1.GitRepository
	if err := e.k8s.Get(ctx, client.ObjectKeyFromObject(stranded), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Artifact == nil || got.Status.Artifact.Digest != "sha256:stranded" || got.Status.LastHandledReconcileAt == token {
		t.Errorf("stranded after its former shard got its outcome: artifact %v, lastHandledReconcileAt %q; want it as it was",
			got.Status.Artifact, got.Status.LastHandledReconcileAt)
	}
	seen["stranded"] = strandedVersions.stop(t)["stranded"]

	// Who wrote what after the move: the main shard alone.
	// (A write is after the move when the watch served its version after
	// the move's.)
	writes := auditedWrites(t, auditLog)
	byMain := map[string]int{}
	for _, w := range writes {
		versions := seen[w.name]
		i := slices.IndexFunc(versions, func(v sourceVersion) bool { return v.resourceVersion == w.resourceVersion })
		j := slices.IndexFunc(versions, func(v sourceVersion) bool { return v.resourceVersion == moves[w.name] })
		if i < 0 || j < 0 || i <= j {
			continue
		}
		switch w.user {
		case "shard-main":
			byMain[w.name]++
		case "shard-1":
			t.Errorf("%s: shard1 wrote %s at resourceVersion %s after the label moved away", w.name, w.what, w.resourceVersion)
		}
	}
	for _, name := range names {
		if byMain[name] == 0 {
			t.Errorf("%s: no write by the main shard after the move in the audit log (%d writes audited)", name, len(writes))
		}
	}
}

// startAuditedControlPlane starts a real API server with the CRDs of
// crdDir that audits every write of a GitRepository (with the object
// written) into auditLog, and returns its configuration and, for each of
// users (members of system:masters), the path of a kubeconfig.
func startAuditedControlPlane(t *testing.T, crdDir, auditLog string, users ...string) (*rest.Config, map[string]string) {
	t.Helper()
	policy := filepath.Join(t.TempDir(), "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: RequestResponse
  verbs: [create, update, patch]
  resources: [{group: source.toolkit.fluxcd.io, resources: [gitrepositories, gitrepositories/status]}]
- level: None
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return startControlPlaneFor(t, crdDir, func(testEnv *envtest.Environment) {
		testEnv.ControlPlane.GetAPIServer().Configure().
			Set("audit-policy-file", policy).
			Set("audit-log-path", auditLog).
			Set("audit-log-mode", "blocking")
	}, users...)
}

// takeoverChild is a shard's child process.
type takeoverChild struct {
	// consumer is the shard's consumer of the outcomes.
	consumer string
	// stop kills the process and waits for it; it may be called again.
	stop func()
}

// startTakeoverChild runs shard s in a child process until the test ends
// or it is stopped, its output in dir (logged if the test fails), and
// waits until its consumer of the outcomes is on the bus.
func startTakeoverChild(t *testing.T, dir string, s takeoverShard) *takeoverChild {
	t.Helper()
	settings, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(filepath.Join(dir, s.User+".log"))
	if s.Telemetry != "" {
		// Replicas of one shard: one log each.
		out, err = os.Create(filepath.Join(dir, s.User+"-"+strings.ReplaceAll(s.Telemetry, ":", "-")+".log"))
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+cmp.Or(s.Test, "TestShardTakeover")+"$", "-test.v")
	cmd.Env = append(os.Environ(), takeoverChildEnv+"="+string(settings))
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); _ = cmd.Wait() }) }
	t.Cleanup(func() {
		stop()
		_ = out.Close()
		if t.Failed() {
			if b, err := os.ReadFile(out.Name()); err == nil {
				lines := strings.Split(string(b), "\n")
				t.Logf("--- %s (last lines)\n%s", s.User, strings.Join(lines[max(0, len(lines)-60):], "\n"))
			}
		}
	})

	sel, err := shard.ParseSelector(s.Selector)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := shard.New(shard.Options{Selector: sel})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := bus.Connect(ctx, bus.Options{URL: s.NATS}, "test", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	consumer := events.WatcherShardConsumer(sh.ID)
	eventually(t, s.User+"'s consumer of the outcomes", func() bool {
		_, err := nc.JS.Consumer(ctx, events.EventStream, consumer)
		return err == nil
	})
	return &takeoverChild{consumer: consumer, stop: stop}
}

// runTakeoverChild is a child process of TestShardTakeover: the watcher as
// the shard settings (takeoverShard, JSON) say, until the parent kills it.
func runTakeoverChild(t *testing.T, settings string) {
	var s takeoverShard
	if err := json.Unmarshal([]byte(settings), &s); err != nil {
		t.Fatal(err)
	}
	o := options{kube: kubeconfig.Options{Path: s.Kubeconfig}, healthAddr: "0", jobKeyFile: s.JobKey,
		concurrency: 2, eventConcurrency: 2, requeueDependency: time.Second, sourceMetricsInterval: time.Minute}
	o.bus.URL = s.NATS
	o.telemetry.Addr = cmp.Or(s.Telemetry, "0")
	o.telemetry.LogFormat = "text"
	if s.LeaderElect {
		o.leaderElect, o.leaderElectionNamespace, o.releaseOnCancel = true, "default", true
		o.leaseDuration, o.renewDeadline, o.retryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
	}
	if err := o.shard.Selector.Set(s.Selector); err != nil {
		t.Fatal(err)
	}
	ctx := logr.NewContext(context.Background(), testr.NewWithOptions(t, testr.Options{Verbosity: 1}))
	if err := run(ctx, o); err != nil {
		t.Fatal(err)
	}
}

// fetchJobsFor reads fetch jobs until it has one for each of names (the
// first of each) and fails on a job for another source.
func fetchJobsFor(t *testing.T, c jetstream.Consumer, names []string) map[string]*events.FetchRequested {
	t.Helper()
	got := map[string]*events.FetchRequested{}
	for len(got) < len(names) {
		m := next(t, c)
		req, ok := m.Data.(*events.FetchRequested)
		if !ok || !slices.Contains(names, req.Job.Object.Name) {
			t.Fatalf("got %s %+v, want a fetch job for one of %v", m.Event.Type(), m.Data, names)
		}
		if _, dup := got[req.Job.Object.Name]; dup {
			t.Fatalf("a second fetch job for %s: %+v", req.Job.Object.Name, req.Job)
		}
		got[req.Job.Object.Name] = req
	}
	return got
}

// fetchJobsAfterMove reads the fetch jobs, by source, until one for must
// has come and then for quiet more.
func fetchJobsAfterMove(t *testing.T, c jetstream.Consumer, must string, quiet time.Duration) map[string][]*events.FetchRequested {
	t.Helper()
	got := map[string][]*events.FetchRequested{}
	read := func(wait time.Duration) int {
		batch, err := c.Fetch(10, jetstream.FetchMaxWait(wait))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for msg := range batch.Messages() {
			_ = msg.Ack()
			m, err := events.Decode(msg.Data())
			if err != nil {
				t.Fatal(err)
			}
			req, ok := m.Data.(*events.FetchRequested)
			if !ok {
				t.Fatalf("got %s on the fetch stream, want a fetch job", m.Event.Type())
			}
			got[req.Job.Object.Name] = append(got[req.Job.Object.Name], req)
			n++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(got[must]) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no fetch job of %s within 30s", must)
		}
		read(time.Second)
	}
	for read(quiet) > 0 {
	}
	return got
}

// waitSource waits until check passes on the GitRepository name.
func waitSource(t *testing.T, c client.Client, name string, check func(*sourcev1.GitRepository) error) {
	t.Helper()
	var last error
	eventually(t, name+" settled", func() bool {
		var g sourcev1.GitRepository
		if last = c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &g); last != nil {
			return false
		}
		last = check(&g)
		return last == nil
	})
	if last != nil {
		t.Fatalf("%s: %v", name, last)
	}
}

// sourceVersion is one version of a GitRepository as a watch served it.
type sourceVersion struct {
	resourceVersion      string
	generation, observed int64
	ready                metav1.Condition
}

// versionWatch records every version of some GitRepositories a watch
// serves, until stopped.
type versionWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	seen   map[string][]sourceVersion
	err    error
}

// watchVersions watches the GitRepositories names of the namespace
// default from now on: every version the API server serves after this
// call is recorded, none sampled. A version without Ready records it as
// Unknown.
func watchVersions(t *testing.T, cfg *rest.Config, scheme *runtime.Scheme, names []string) *versionWatch {
	t.Helper()
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var list sourcev1.GitRepositoryList
	if err := c.List(ctx, &list, client.InNamespace("default")); err != nil {
		cancel()
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, &sourcev1.GitRepositoryList{}, client.InNamespace("default"),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	vw := &versionWatch{cancel: cancel, done: make(chan struct{}), seen: map[string][]sourceVersion{}}
	go func() {
		defer close(vw.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			g, ok := ev.Object.(*sourcev1.GitRepository)
			if !ok || ev.Type == watch.Error {
				vw.fail(ctx, fmt.Errorf("the watch ended: %v", ev.Object))
				return
			}
			if !slices.Contains(names, g.Name) {
				continue
			}
			v := sourceVersion{resourceVersion: g.ResourceVersion, generation: g.Generation, observed: g.Status.ObservedGeneration,
				ready: metav1.Condition{Type: meta.ReadyCondition, Status: metav1.ConditionUnknown, Reason: "NoReadyCondition"}}
			if r := apimeta.FindStatusCondition(g.Status.Conditions, meta.ReadyCondition); r != nil {
				v.ready = *r
			}
			vw.mu.Lock()
			vw.seen[g.Name] = append(vw.seen[g.Name], v)
			vw.mu.Unlock()
		}
		vw.fail(ctx, errors.New("the API server closed the watch"))
	}()
	t.Cleanup(func() { cancel(); <-vw.done })
	return vw
}

// fail records why the watch ended early, unless it was stopped.
func (vw *versionWatch) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	vw.mu.Lock()
	vw.err = err
	vw.mu.Unlock()
}

// stop ends the watch and returns the versions of each source; a watch
// that ended early fails the test, as versions may be missing.
func (vw *versionWatch) stop(t *testing.T) map[string][]sourceVersion {
	t.Helper()
	vw.cancel()
	<-vw.done
	vw.mu.Lock()
	defer vw.mu.Unlock()
	if vw.err != nil {
		t.Fatal(vw.err)
	}
	return vw.seen
}

// auditedWrite is a write of a GitRepository the API server audited and
// made.
type auditedWrite struct {
	user, name, what, resourceVersion string
}

// auditedWrites reads the successful writes of GitRepositories from the
// audit log: who wrote which object, its status or the rest, and the
// resourceVersion written.
func auditedWrites(t *testing.T, path string) []auditedWrite {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []auditedWrite
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		var ev struct {
			Stage string `json:"stage"`
			User  struct {
				Username string `json:"username"`
			} `json:"user"`
			ObjectRef struct {
				Name        string `json:"name"`
				Subresource string `json:"subresource"`
			} `json:"objectRef"`
			ResponseStatus struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
			ResponseObject struct {
				Metadata struct {
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
			} `json:"responseObject"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("audit log line: %v", err)
		}
		if ev.Stage != "ResponseComplete" || ev.ResponseStatus.Code >= 300 {
			continue
		}
		what := "the object"
		if ev.ObjectRef.Subresource != "" {
			what = "its " + ev.ObjectRef.Subresource
		}
		out = append(out, auditedWrite{user: ev.User.Username, name: ev.ObjectRef.Name, what: what,
			resourceVersion: ev.ResponseObject.Metadata.ResourceVersion})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
