package role

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// TestLeaderChangeKeepsOutcomeOrder runs two replicas of the watcher with
// leader election, each in a process of its own, on one API server and
// one NATS server; the test plays the fetchers and artifact-servers. The
// first leader writes the outcome of a source's newest job, then is
// killed. The outcome of an older job, finished late (as by a fetcher on
// a node cut off from the bus), arrives once the standby leads: it is not
// written, though the new leader never saw the newer outcome, because the
// order is kept in the bus's bucket (events.OrderBucket). The new
// leader's own job is written.
func TestLeaderChangeKeepsOutcomeOrder(t *testing.T) {
	if s := os.Getenv(takeoverChildEnv); s != "" {
		runTakeoverChild(t, s)
		return
	}
	ctx := context.Background()
	dir := t.TempDir()
	cfg, kubeconfig := startControlPlane(t, filepath.Join("..", "..", "..", "deploy", "crds"))
	natsURL := startNATS(t)
	conn, fetchJobs := connectBus(ctx, t, natsURL)
	e := &env{conn: conn, pub: conn.NewPublisher("test"), fetchJobs: fetchJobs, k8s: newClient(t, cfg)}
	jobKey := writeJobKey(t) // the replicas' shared key
	replica := func() (takeoverShard, string) {
		addr := freeAddr(t)
		return takeoverShard{User: "watcher", Kubeconfig: kubeconfig, NATS: natsURL, JobKey: jobKey,
			Test: "TestLeaderChangeKeepsOutcomeOrder", LeaderElect: true, Telemetry: addr}, "http://" + addr + "/metrics"
	}
	firstSettings, firstMetrics := replica()
	first := startTakeoverChild(t, dir, firstSettings)
	waitLeading(t, firstMetrics)

	// Three jobs of one source: the first, and two asked for by
	// reconcile requests.
	key := createHourly(t, e, "order")
	var jobs []events.Job
	for i := range 3 {
		if i > 0 {
			requestReconcile(t, e, key, fmt.Sprintf("order-%d", i))
		}
		jobs = append(jobs, fetchJobsFor(t, fetchJobs, []string{key.Name})[key.Name].Job)
	}
	publishOutcome(t, e, events.TypeArtifactStored, storedOutcome(jobs[2], "c", "sha256:newest"))
	waitSource(t, e.k8s, key.Name, func(g *sourcev1.GitRepository) error {
		if !conditions.IsReady(g) || g.Status.Artifact == nil || g.Status.Artifact.Digest != "sha256:newest" {
			return fmt.Errorf("Ready %v, artifact %v", conditions.Get(g, meta.ReadyCondition), g.Status.Artifact)
		}
		return nil
	})

	// The first leader is killed (no release of its lease); the
	// standby leads once the lease runs out.
	secondSettings, secondMetrics := replica()
	startTakeoverChild(t, dir, secondSettings)
	first.stop()
	waitLeading(t, secondMetrics)

	// Older jobs' outcomes, finished late: a failure, and an older
	// revision stored after the newest (so with a later
	// lastUpdateTime).
	publishOutcome(t, e, events.TypeArtifactFailed, &events.Outcome{Job: jobs[1], Failure: &events.Failure{
		Condition: sourcev1.FetchFailedCondition, Reason: sourcev1.GitOperationFailedReason, Message: "late failure"}})
	publishOutcome(t, e, events.TypeArtifactStored, storedOutcome(jobs[0], "a", "sha256:oldest"))
	eventually(t, "the new leader superseding both late outcomes", func() bool {
		return scrapeCounter(t, secondMetrics, "headwater_superseded_outcomes_total") == 2
	})
	checkNotMovedBack(t, e, key, "sha256:newest", "order-2", "stored artifact for commit 'a'", "late failure")

	// The new leader's own job is written.
	requestReconcile(t, e, key, "after-the-change")
	var own events.Job
	for own.ReconcileToken != "after-the-change" {
		own = fetchJobsFor(t, fetchJobs, []string{key.Name})[key.Name].Job
	}
	publishOutcome(t, e, events.TypeArtifactStored, storedOutcome(own, "d", "sha256:after"))
	waitSource(t, e.k8s, key.Name, func(g *sourcev1.GitRepository) error {
		if g.Status.Artifact == nil || g.Status.Artifact.Digest != "sha256:after" || g.Status.LastHandledReconcileAt != "after-the-change" {
			return fmt.Errorf("artifact %v, last handled %q", g.Status.Artifact, g.Status.LastHandledReconcileAt)
		}
		return nil
	})
}

// requestReconcile annotates the source key with a reconcile request of
// token, as `flux reconcile` does.
func requestReconcile(t *testing.T, e *env, key client.ObjectKey, token string) {
	t.Helper()
	var got sourcev1.GitRepository
	if err := e.k8s.Get(context.Background(), key, &got); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(got.DeepCopy())
	got.Annotations = map[string]string{meta.ReconcileRequestAnnotation: token}
	if err := e.k8s.Patch(context.Background(), &got, patch); err != nil {
		t.Fatal(err)
	}
}

// checkNotMovedBack fails t unless source key is Ready with the artifact
// of digest, no failure and lastHandledReconcileAt token, and no Event
// about it says one of lateMessages: the late outcomes that said them were
// not written.
func checkNotMovedBack(t *testing.T, e *env, key client.ObjectKey, digest, token string, lateMessages ...string) {
	t.Helper()
	ctx := context.Background()
	var got sourcev1.GitRepository
	if err := e.k8s.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	if a := got.Status.Artifact; a == nil || a.Digest != digest || !conditions.IsReady(&got) ||
		conditions.Get(&got, sourcev1.FetchFailedCondition) != nil || got.Status.LastHandledReconcileAt != token {
		t.Errorf("status after the late outcomes = %+v, want the artifact %s, Ready, no failure, last handled %s", got.Status, digest, token)
	}
	var list corev1.EventList
	if err := e.k8s.List(ctx, &list, client.InNamespace(key.Namespace)); err != nil {
		t.Fatal(err)
	}
	for _, ev := range list.Items {
		if ev.InvolvedObject.Name == key.Name && slices.Contains(lateMessages, ev.Message) {
			t.Errorf("a late outcome recorded an Event: %s %s", ev.Reason, ev.Message)
		}
	}
}

// storedOutcome is the outcome of job storing commit (a letter, repeated
// into a hash) with digest, stored now.
func storedOutcome(job events.Job, commit, digest string) *events.Outcome {
	rev := "master@sha1:" + strings.Repeat(commit, 40)
	path := "gitrepository/" + job.Object.Namespace + "/" + job.Object.Name + "/" + commit + ".tar.gz"
	return &events.Outcome{Job: job, Revision: rev, EventMessage: "stored artifact for commit '" + commit + "'",
		Artifact: &meta.Artifact{Path: path, URL: "http://a/" + path, Revision: rev, Digest: digest, LastUpdateTime: metav1.Now()}}
}

// waitLeading waits until the replica serving metrics leads
// (controller-runtime's leader_election_master_status).
func waitLeading(t *testing.T, metrics string) {
	t.Helper()
	eventually(t, "a leader at "+metrics, func() bool {
		return scrapeCounter(t, metrics, "leader_election_master_status") == 1
	})
}

// scrapeCounter is the sum of metric name's samples at the /metrics
// address metrics; -1 when it cannot be read.
func scrapeCounter(t *testing.T, metrics, name string) float64 {
	t.Helper()
	resp, err := http.Get(metrics)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return -1
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("%s: %v", metrics, err)
	}
	f, ok := families[name]
	if !ok {
		return -1
	}
	sum := 0.0
	for _, m := range f.GetMetric() {
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return sum
}
