package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/e2e/promtext"
)

// watcherLease is the Lease the watcher replicas elect their leader with,
// in the namespace of -leader-election-namespace (default "default").
const watcherLease = "headwater-watcher"

// startFailoverEnv starts a second Env whose two watcher replicas elect a
// leader; it stops when the test ends, after checking that every service
// is running and then exits cleanly on SIGTERM. The private Env's helpers
// (newRepo, createSource, waitArtifact, ...) work on it: they touch only the
// Env and its recorder.
func startFailoverEnv(t *testing.T) *privateEnv {
	t.Helper()
	return startPrivateEnv(t, "failover", func(cfg *harness.Config) {
		cfg.WatcherReplicas = 2
		cfg.ExtraArgs[harness.Watcher] = append(cfg.ExtraArgs[harness.Watcher], "-leader-elect=true")
	})
}

// TestWatcherFailover checks that watcher replicas elect one leader, that
// only the leader applies outcomes, and that a standby takes over without
// losing a source: when the leader stops gracefully (it releases the lease)
// and when it is killed (the lease expires first). Sources created, and
// reconciles requested, while no replica leads are served by the next
// leader, and a replica that comes back stands by.
func TestWatcherFailover(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	e := startFailoverEnv(t)
	watchers := e.Watchers()
	if len(watchers) != 2 {
		t.Fatalf("%d watchers, want 2", len(watchers))
	}
	files := func(name, v string) map[string]string {
		return map[string]string{"deploy/app.yaml": "kind: App\nname: " + name + "\nversion: " + v + "\n"}
	}

	// One replica leads, and only it applies outcomes.
	first := e.waitLeader(t, "")
	standby := otherWatcher(watchers, first.svc)
	t.Logf("%s leads as %s", first.svc.Name, first.identity)
	e.checkStandby(t, standby, first, 0)
	repoA, a1 := e.newRepo(t, "failover-a", files("a", "1"))
	e.createSource(t, "failover-a", e.Git.RepoURL("failover-a"))
	e.waitArtifact(t, "failover-a", revision(a1))
	if n := outcomesApplied(t, first.svc); n == 0 {
		t.Errorf("the leader %s applied no outcome", first.svc.Name)
	}
	if n := outcomesApplied(t, standby); n != 0 {
		t.Errorf("the standby %s applied %v outcomes", standby.Name, n)
	}
	if !isLeader(first.svc) || holder(e.lease(t)) != first.identity {
		t.Fatalf("%s no longer leads as %s", first.svc.Name, first.identity)
	}
	transitions := e.lease(t).Spec.LeaseTransitions

	// The leader stops gracefully: it releases the lease and the standby
	// takes it; nothing waits for the lease to expire.
	if err := first.svc.Stop(); err != nil {
		t.Fatalf("stop the leader %s: %v", first.svc.Name, err)
	}
	second := e.waitLeader(t, first.identity)
	if second.svc != standby {
		t.Fatalf("%s took over, want the standby %s", second.svc.Name, standby.Name)
	}
	t.Logf("%s took over as %s after a graceful stop", second.svc.Name, second.identity)
	if got := e.lease(t).Spec.LeaseTransitions; got == nil || transitions == nil || *got <= *transitions {
		t.Errorf("lease transitions %v after a takeover, were %v", deref(got), deref(transitions))
	}
	repoB, b1 := e.newRepo(t, "failover-b", files("b", "1"))
	e.createSource(t, "failover-b", e.Git.RepoURL("failover-b"))
	e.waitArtifact(t, "failover-b", revision(b1))
	a2 := commit(t, repoA, files("a", "2"), "Second commit of failover-a")
	tokenA := e.requestReconcile(t, "failover-a")
	objA := e.waitArtifact(t, "failover-a", revision(a2))
	e.checkHandled(t, "failover-a", tokenA)
	if d := diffTrees(untarArtifact(t, download(t, objA.Status.Artifact.URL)), treeAt(t, repoA, a2)); d != "" {
		t.Errorf("failover-a's artifact is not the tree at %s: %s", a2, d)
	}
	if n := outcomesApplied(t, second.svc); n == 0 {
		t.Errorf("the new leader %s applied no outcome", second.svc.Name)
	}

	// The stopped replica comes back and stands by.
	e.restartStandby(t, first.svc, second)

	// The leader is killed: it cannot release the lease, so the standby
	// takes over once it expires. What happens meanwhile is not lost: a
	// new source and a reconcile requested for a new commit.
	_, c1 := e.newRepo(t, "failover-c", files("c", "1"))
	b2 := commit(t, repoB, files("b", "2"), "Second commit of failover-b")
	second.svc.Kill()
	e.createSource(t, "failover-c", e.Git.RepoURL("failover-c"))
	tokenB := e.requestReconcile(t, "failover-b")
	third := e.waitLeader(t, second.identity)
	if third.svc != first.svc {
		t.Fatalf("%s took over, want the standby %s", third.svc.Name, first.svc.Name)
	}
	t.Logf("%s took over as %s after the leader was killed", third.svc.Name, third.identity)
	e.waitArtifact(t, "failover-b", revision(b2))
	e.checkHandled(t, "failover-b", tokenB)
	e.waitArtifact(t, "failover-c", revision(c1))

	// The killed replica comes back and stands by, so every replica is up
	// for the Env's clean-exit checks.
	e.restartStandby(t, second.svc, third)
}

// leader is the watcher replica holding the lease, with the identity it
// holds it as.
type leader struct {
	identity string
	svc      *harness.Service
}

// waitLeader waits until the lease is held by an identity other than
// previous and exactly one running watcher replica reports that it leads,
// and returns that replica.
func (e *privateEnv) waitLeader(t *testing.T, previous string) leader {
	t.Helper()
	var l leader
	eventually(t, "a watcher replica leads, not "+strconv.Quote(previous), func() error {
		id := holder(e.lease(t))
		if id == "" || id == previous {
			return fmt.Errorf("lease held by %q", id)
		}
		var leaders []*harness.Service
		for _, s := range e.Watchers() {
			if s.Running() && isLeader(s) {
				leaders = append(leaders, s)
			}
		}
		if len(leaders) != 1 {
			return fmt.Errorf("lease held by %q; %d replicas report leading", id, len(leaders))
		}
		l = leader{identity: id, svc: leaders[0]}
		return nil
	})
	return l
}

// lease returns the watchers' Lease, or an empty one if there is none yet.
func (e *privateEnv) lease(t *testing.T) *coordinationv1.Lease {
	t.Helper()
	var l coordinationv1.Lease
	err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: watcherLease}, &l)
	if client.IgnoreNotFound(err) != nil {
		t.Fatalf("get lease %s: %v", watcherLease, err)
	}
	return &l
}

// checkHandled checks that a GitRepository of the Env has handled the
// reconcile request token.
func (e *privateEnv) checkHandled(t *testing.T, name, token string) {
	t.Helper()
	eventually(t, fmt.Sprintf("gitrepository %s handled %s", name, token), func() error {
		if got := e.get(t, name).Status.LastHandledReconcileAt; got != token {
			return fmt.Errorf("lastHandledReconcileAt %q", got)
		}
		return nil
	})
}

// holder is the lease's holder identity, "" when nobody holds it.
func holder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// deref is *p, or -1 for nil.
func deref(p *int32) int32 {
	if p == nil {
		return -1
	}
	return *p
}

// otherWatcher is the replica of two that is not s.
func otherWatcher(watchers []*harness.Service, s *harness.Service) *harness.Service {
	if watchers[0] == s {
		return watchers[1]
	}
	return watchers[0]
}

// acquireAttempt is what client-go's leader election logs when a replica
// starts trying to acquire the lease.
const acquireAttempt = "Attempting to acquire leader lease"

// restartStandby starts a stopped watcher replica again and checks that it
// stands by while l leads.
func (e *privateEnv) restartStandby(t *testing.T, s *harness.Service, l leader) {
	t.Helper()
	attempts := acquireAttempts(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatalf("start %s again: %v", s.Name, err)
	}
	e.checkStandby(t, s, l, attempts)
}

// checkStandby checks that the watcher replica s stands by while l leads:
// once s has begun to try to acquire the lease (its log has more than
// attempts tries) and l has renewed the lease since, l still holds it and s
// neither reports leading nor has applied an outcome.
func (e *privateEnv) checkStandby(t *testing.T, s *harness.Service, l leader, attempts int) {
	t.Helper()
	eventually(t, s.Name+" tries to acquire the lease", func() error {
		if n := acquireAttempts(t, s); n <= attempts {
			return fmt.Errorf("%d attempts logged, want more than %d", n, attempts)
		}
		return nil
	})
	seen := e.lease(t).Spec.RenewTime
	eventually(t, l.svc.Name+" renews the lease", func() error {
		cur := e.lease(t)
		if got := holder(cur); got != l.identity {
			t.Fatalf("lease held by %q with %s back, want %s's %q", got, s.Name, l.svc.Name, l.identity)
		}
		if r := cur.Spec.RenewTime; r == nil || seen == nil || !r.After(seen.Time) {
			return fmt.Errorf("renewed at %v, as before", r)
		}
		return nil
	})
	if isLeader(s) {
		t.Fatalf("%s reports leading beside %s", s.Name, l.svc.Name)
	}
	if !isLeader(l.svc) {
		t.Fatalf("%s no longer reports leading with %s back", l.svc.Name, s.Name)
	}
	if n := outcomesApplied(t, s); n != 0 {
		t.Errorf("the standby %s applied %v outcomes", s.Name, n)
	}
}

// acquireAttempts counts the times a watcher replica's log, across
// restarts, says that it began to try to acquire the lease.
func acquireAttempts(t *testing.T, s *harness.Service) int {
	t.Helper()
	logs, err := s.Logs()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(logs, acquireAttempt)
}

// isLeader reports whether a watcher replica says, on its /metrics, that it
// holds the lease; one that does not answer does not lead.
func isLeader(s *harness.Service) bool {
	v, err := metricSum(s.TelemetryAddr, "leader_election_master_status", `name="`+watcherLease+`"`)
	return err == nil && v == 1
}

// outcomesApplied is the number of outcomes a watcher replica has handled
// since it started, whatever their result.
func outcomesApplied(t *testing.T, s *harness.Service) float64 {
	t.Helper()
	v, err := metricSum(s.TelemetryAddr, "headwater_jobs_total", `service="watcher"`)
	if err != nil {
		t.Fatalf("%s: %v", s.Name, err)
	}
	return v
}

// metricSum scrapes http://addr/metrics and sums the samples of the metric
// name whose labels include every one of labels (each `key="value"`); a
// metric with no such sample sums to 0.
func metricSum(addr, name string, labels ...string) (float64, error) {
	ss, err := promtext.Scrape(context.Background(), nil, "http://"+addr+"/metrics")
	if err != nil {
		return 0, err
	}
	return ss.Sum(name, labels...)
}
