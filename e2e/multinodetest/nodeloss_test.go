package multinodetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"golang.org/x/sys/unix"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster"
	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

const (
	// loadNamespace holds the sources of the load.
	loadNamespace = "load"
	// loadSources is how many GitRepositories the load has.
	loadSources = 100
	// leaseDuration is the watcher's -leader-election-lease-duration
	// and retryPeriod its -leader-election-retry-period (their defaults).
	leaseDuration = 35 * time.Second
	retryPeriod   = 5 * time.Second
	// proxyGrace is how long after a lost node's artifact-server left
	// the Service's ready endpoints the doc says a download may still
	// fail (docs/operating.md, "A node is lost"): kube-proxy's resync on
	// every node. The test lets as long pass after a return before its
	// next stage.
	proxyGrace = 30 * time.Second
)

// TestNodeLoss installs overlays/ha on the three nodes, puts it
// under load (loadSources sources with commits arriving, a download every
// 100 ms through the Service), stops the node of the watcher's leader hard,
// brings it back, then drains another with kubectl drain; and asserts that
// nothing was lost: every source Ready at its newest commit, every artifact
// whole, downloads failing only in the window the doc states, a new leader
// within the lease, no revision stored twice, the JetStream streams back to
// three current copies. The node returns stale (every source moved on
// while it was away), and is stopped again briefly so that its pods
// restart in place on their volumes: it must serve and write nothing
// stale (stale_test.go): no source's revision ever goes back, every write
// of a watcher pod (status, Events: the API server's audit log names its
// pod, audit_test.go) comes from the Lease's holder of its moment, its NATS
// server catches up, nothing done is fetched again, and its
// artifact-server, asked directly, serves every source's current digest.
func TestNodeLoss(t *testing.T) {
	c := requireCluster(t)
	if len(c.Nodes) < 3 {
		t.Skip("needs three nodes")
	}
	ctx := context.Background()
	cl := env.Client(t)
	installHA(t)
	checkSpread(t)

	l := newLoad(t, cl)
	l.start()
	defer l.stop()
	// Every status write to the sources and every holder of the
	// watcher's Lease, from here to the end.
	writes := watchWrites(t)
	defer writes.stop()

	// The node to lose holds the watcher's leader; the one to drain is
	// another; the downloads start on the third, which neither touches.
	leader, leaderNode := watcherLeader(t)
	var lost, drained, downloader *cluster.Node
	for _, n := range c.Nodes {
		switch {
		case n.Name == leaderNode:
			lost = n
		case drained == nil:
			drained = n
		default:
			downloader = n
		}
	}
	t.Logf("the watcher's leader %s is on %s: stopping it; %s is drained next; downloads from %s", leader, lost.Name, drained.Name, downloader.Name)
	l.dumpNode = downloader
	l.downloadFrom(downloader)
	proxy := sampleProxy(downloader, l.done)
	conns := sampleConns(downloader, strings.TrimPrefix(l.base, "http://"), l.done)
	l.explain = func(d download) string {
		return writes.endpointsAt(d.at) + "; " + proxy.at(d.at) + "; " + conns.at(d.at, d.sport)
	}
	l.stale = func(d download) (string, bool) {
		e, ok := conns.staleAt(d.at, d.sport, writes.readyAt(d.at))
		if !ok {
			return "", false
		}
		return fmt.Sprintf("source port %d tracked on %s as a connection to %s (%s, read from %s to %s), not a ready endpoint then: %s",
			d.sport, downloader.Name, e.endpoint, e.state, e.firstSeen.Format("15:04:05.000"), e.lastSeen.Format("15:04:05.000"), writes.endpointsAt(d.at)), true
	}
	streamsR3 := streamsR3From(downloader)
	l.waitDownloads(t, 20)
	// What the node to lose holds when it stops: its NATS server's
	// streams, and the sources' revisions, all stale by its return.
	hc := downloader.HTTPClient()
	staleSeqs := lastSeqOn(t, hc, lost.Name)
	revsAtStop := l.revisions(t)
	lostServers := artifactServersOn(t, lost.Name)

	// A node lost.
	stopped := time.Now()
	l.mark("node lost")
	if err := c.StopNode(ctx, lost.Name); err != nil {
		t.Fatal(err)
	}
	whole := watchWhole(lost.Name)
	var newLeader string
	kubetest.Eventually(t, 3*leaseDuration, "a new watcher leader", func(ctx context.Context) error {
		holder, node, err := leaseHolder(ctx)
		if err != nil {
			return err
		}
		if holder == leader || node == lost.Name {
			return fmt.Errorf("the lease is still %s's (on %s)", holder, node)
		}
		newLeader = holder
		return nil
	})
	took := time.Since(stopped)
	t.Logf("new watcher leader %s %s after the node stopped (lease %s, retry %s)", newLeader, took.Round(100*time.Millisecond), leaseDuration, retryPeriod)
	if took > leaseDuration+2*retryPeriod+10*time.Second {
		t.Errorf("new leader after %s: more than the lease (%s) and two retries", took.Round(time.Second), leaseDuration)
	}
	l.commitRound(t)
	fresh := l.waitFresh(t, 10*time.Minute)
	t.Logf("every source fresh at its newest commit %s after the node stopped", fresh.Sub(stopped).Round(100*time.Millisecond))
	wholeAgain := whole(t)
	t.Logf("the artifact-servers whole again (the lost one replaced and Ready) %s after the node stopped", wholeAgain.Sub(stopped).Round(100*time.Millisecond))

	// The node comes back with the state it had, stale: every source
	// has moved on since it stopped. NATS's server rejoins and catches
	// up, the streams have three current copies again, and nothing done
	// is fetched again. A download may fail after its return only on a
	// stale tracked connection to its lost pod (docs/operating.md).
	l.checkMovedOn(t, revsAtStop)
	fetchesBack := l.countFetches()
	returning := time.Now()
	l.mark("node back, settling")
	if err := c.StartNode(ctx, lost.Name); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	kubetest.Eventually(t, 10*time.Minute, "every pod Ready with the node back", podsReady)
	kubetest.Eventually(t, 5*time.Minute, "every stream in three current copies", streamsR3)
	t.Logf("streams back to three current copies %s after the node returned", time.Since(back).Round(100*time.Millisecond))
	waitCaughtUp(t, hc, lost.Name, staleSeqs)
	waitFor(t, back.Add(proxyGrace))
	l.checkNoRefetch(t, fetchesBack, "from the node's return until 30 s after it was Ready")
	l.mark("node back")
	// Its services' pods were replaced on the others while it was away:
	// put one of each back on it, then download every artifact from its
	// artifact-server directly, and through the Service.
	moveOnto(t, lost.Name, []*cluster.Node{drained, downloader})
	pod, ip := artifactServerOn(t, lost.Name)
	l.checkServedBy(t, pod, ip, 1)
	l.checkArtifacts(t)
	checkTakesJobs(t, lost.Name, downloader, "after they were put back on it")

	// The same node stopped again, and back as soon as it is NotReady,
	// before its pods are evicted: they restart where they were, with
	// the volumes and caches they had, and the sources moved on while
	// it was away (a new commit to each).
	briefServers := artifactServersOn(t, lost.Name)
	briefStop, briefReturning, briefBack, briefReady := stopBriefly(t, l, lost, hc)
	fresh = l.waitFresh(t, 10*time.Minute)
	t.Logf("every source fresh at its newest commit %s after the node returned from its brief stop", fresh.Sub(briefBack).Round(100*time.Millisecond))
	pod, ip = artifactServerOn(t, lost.Name)
	l.checkServedBy(t, pod, ip, 1)
	checkTakesJobs(t, lost.Name, downloader, "after they restarted in place")
	waitFor(t, briefReady.Add(proxyGrace))
	l.mark("node back")

	// Another node drained, as for maintenance: the budgets let it
	// finish.
	l.mark("drain")
	drainStart := time.Now()
	out, err := c.Kubectl(ctx, "drain", drained.Name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=8m").Run()
	if err != nil {
		t.Fatalf("kubectl drain %s: %v\n%s", drained.Name, err, out)
	}
	t.Logf("kubectl drain %s finished in %s", drained.Name, time.Since(drainStart).Round(100*time.Millisecond))
	checkNATSApart(t, drained.Name)
	l.commitRound(t)
	fresh = l.waitFresh(t, 10*time.Minute)
	t.Logf("every source fresh at its newest commit %s after the drain began (NATS on two servers)", fresh.Sub(drainStart).Round(100*time.Millisecond))
	l.mark("uncordoned")
	env.Kubectl(t, "uncordon", drained.Name)
	kubetest.Eventually(t, 10*time.Minute, "every pod Ready after the uncordon", podsReady)
	kubetest.Eventually(t, 5*time.Minute, "every stream in three current copies after the drain", streamsR3)

	// The NATS quorum lost: two nodes of three stopped at once. Work
	// waits, every source keeps its artifact, downloads go on from the
	// survivor; with the nodes back, work resumes by itself.
	quorumServers := artifactServersOn(t, lost.Name, drained.Name)
	quorumLost := time.Now()
	l.mark("quorum lost")
	for _, n := range []*cluster.Node{lost, drained} {
		if err := c.StopNode(ctx, n.Name); err != nil {
			t.Fatal(err)
		}
	}
	wholeQuorum := watchWhole(lost.Name, drained.Name)
	l.commitRound(t)
	kubetest.Eventually(t, 3*time.Minute, "both nodes NotReady", func(ctx context.Context) error {
		for _, n := range []*cluster.Node{lost, drained} {
			if err := c.NodeReady(ctx, n.Name); err == nil {
				return fmt.Errorf("%s still Ready", n.Name)
			}
		}
		return nil
	})
	// Once the artifact-servers are whole on the survivor, it serves
	// every source's artifact, none lost.
	quorumWhole := wholeQuorum(t)
	t.Logf("without the quorum, the artifact-servers whole again %s after the nodes stopped", quorumWhole.Sub(quorumLost).Round(100*time.Millisecond))
	waitFor(t, quorumWhole.Add(proxyGrace))
	l.checkArtifacts(t)
	l.waitBusUnavailable(t)
	t.Logf("without the quorum: %s", l.sample(t))
	quorumReturning := time.Now()
	l.mark("quorum back, settling")
	for _, n := range []*cluster.Node{lost, drained} {
		if err := c.StartNode(ctx, n.Name); err != nil {
			t.Fatal(err)
		}
	}
	quorumBack := time.Now()
	fresh = l.waitFresh(t, 10*time.Minute)
	t.Logf("every source fresh at its newest commit %s after the quorum returned", fresh.Sub(quorumBack).Round(100*time.Millisecond))
	kubetest.Eventually(t, 10*time.Minute, "every pod Ready after the quorum returned", podsReady)
	kubetest.Eventually(t, 5*time.Minute, "every stream in three current copies after the quorum returned", streamsR3)
	waitFor(t, quorumBack.Add(proxyGrace))
	l.mark("quorum back")
	l.waitDownloads(t, l.downloads()+50)
	l.stop()

	t.Log(proxy.summary())
	t.Log(conns.summary())
	// Nothing lost, nothing corrupt, nothing stored twice.
	l.checkArtifacts(t)
	// A loss's window ends kube-proxy's 30 s after the lost
	// artifact-servers left the Service's ready endpoints; a return has
	// none (its end zero): what fails after it must have met a stale
	// tracked connection (docs/operating.md, "A lost node returns").
	left := func(phase string, addrs []string, start, orElse time.Time) time.Time {
		at, ok := writes.leftReady(addrs, start)
		if !ok {
			t.Errorf("%s: the lost artifact-servers %v never seen to leave the Service's ready endpoints", phase, addrs)
			return orElse
		}
		return at
	}
	lostLeft := left("node lost", lostServers, stopped, wholeAgain)
	briefLeft := left("node lost briefly", briefServers, briefStop, briefReady)
	quorumLeft := left("quorum lost", quorumServers, quorumLost, quorumWhole)
	l.report(t, []window{
		{"node lost", stopped, lostLeft.Add(proxyGrace), lostLeft, time.Time{}},
		{"node back, settling", returning, time.Time{}, time.Time{}, returning},
		{"node lost briefly", briefStop, briefLeft.Add(proxyGrace), briefLeft, briefReturning},
		{"quorum lost", quorumLost, quorumLeft.Add(proxyGrace), quorumLeft, time.Time{}},
		{"quorum back, settling", quorumReturning, time.Time{}, time.Time{}, quorumReturning},
	})
	checkNoDoubleWrites(t)
	// Nothing written stale, nothing by a watcher but the leader.
	writes.stop()
	writes.checkNoRegression(t, l)
	writes.checkWriters(t)
	writes.checkAuditWriters(t, c.AuditLogPath)
}

// waitFor returns at when, the test's clock moving on by itself (no
// condition to poll: the window the doc gives must have passed).
func waitFor(t *testing.T, when time.Time) {
	t.Helper()
	kubetest.Eventually(t, time.Until(when)+time.Minute, "the clock", func(context.Context) error {
		if d := time.Until(when); d > 0 {
			return fmt.Errorf("%s to go", d.Round(time.Second))
		}
		return nil
	})
}

// sample says what one source's status says: its artifact and its
// conditions.
func (l *load) sample(t *testing.T) string {
	t.Helper()
	var gr sourcev1.GitRepository
	if err := l.cl.Get(context.Background(), ctrlclient.ObjectKey{Namespace: loadNamespace, Name: l.names[0]}, &gr); err != nil {
		return err.Error()
	}
	var b strings.Builder
	if gr.Status.Artifact != nil {
		fmt.Fprintf(&b, "%s artifact %s; ", gr.Name, gr.Status.Artifact.Revision)
	}
	for _, c := range gr.Status.Conditions {
		fmt.Fprintf(&b, "%s=%s %s %q; ", c.Type, c.Status, c.Reason, c.Message)
	}
	return b.String()
}

// waitBusUnavailable waits, without the NATS quorum, until a source
// whose fetch job the bus refused says so (FetchFailed and Ready False,
// reason BusUnavailable) while every source keeps its artifact.
func (l *load) waitBusUnavailable(t *testing.T) {
	t.Helper()
	kubetest.Eventually(t, 3*time.Minute, "a source says BusUnavailable without the quorum", func(ctx context.Context) error {
		var list sourcev1.GitRepositoryList
		if err := l.cl.List(ctx, &list, ctrlclient.InNamespace(loadNamespace)); err != nil {
			return err
		}
		saying := 0
		for i := range list.Items {
			gr := &list.Items[i]
			if gr.Status.Artifact == nil {
				return fmt.Errorf("%s has no artifact without the quorum", gr.Name)
			}
			failed := apimeta.FindStatusCondition(gr.Status.Conditions, sourcev1.FetchFailedCondition)
			ready := apimeta.FindStatusCondition(gr.Status.Conditions, meta.ReadyCondition)
			if failed != nil && failed.Reason == "BusUnavailable" && ready != nil && ready.Status == metav1.ConditionFalse && ready.Reason == "BusUnavailable" {
				saying++
			}
		}
		if saying == 0 {
			return fmt.Errorf("none of %d sources says BusUnavailable", len(list.Items))
		}
		t.Logf("without the quorum, %d of %d sources say BusUnavailable, each with its artifact", saying, len(list.Items))
		return nil
	})
}

// checkSpread checks the scheduler did what components/ha asks: a NATS
// server on every node, and no node with more than one fetcher, packager
// or artifact-server.
func checkSpread(t *testing.T) {
	t.Helper()
	apps, err := podsByApp(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"nats", "fetcher", "packager", "artifact-server"} {
		perNode := map[string]int{}
		for _, p := range apps[app] {
			perNode[p.Spec.NodeName]++
		}
		t.Logf("%s per node: %v", app, perNode)
		if len(perNode) != len(env.C.Nodes) {
			t.Errorf("%s runs on %d nodes, want every one of %d: %v", app, len(perNode), len(env.C.Nodes), perNode)
		}
	}
}

// checkNATSApart checks that no two NATS servers share a node while
// drained is cordoned: the drained node's server waits rather than double
// up.
func checkNATSApart(t *testing.T, drained string) {
	t.Helper()
	apps, err := podsByApp(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	perNode := map[string][]string{}
	for _, p := range apps["nats"] {
		where := p.Spec.NodeName
		if where == "" {
			where = "(" + string(p.Status.Phase) + ", no node)"
		}
		perNode[where] = append(perNode[where], p.Name)
	}
	t.Logf("NATS servers with %s drained: %v", drained, perNode)
	for node, names := range perNode {
		if node == drained || (len(names) > 1 && !strings.HasPrefix(node, "(")) {
			t.Errorf("NATS servers %v on %s while %s is drained", names, node, drained)
		}
	}
}

// watcherLeader is the pod holding the watcher's Lease and its node.
func watcherLeader(t *testing.T) (string, string) {
	t.Helper()
	var holder, node string
	kubetest.Eventually(t, 2*time.Minute, "a watcher leader", func(ctx context.Context) error {
		var err error
		holder, node, err = leaseHolder(ctx)
		return err
	})
	return holder, node
}

func leaseHolder(ctx context.Context) (string, string, error) {
	l, err := env.C.Client.CoordinationV1().Leases(hwNamespace).Get(ctx, "headwater-watcher", metav1.GetOptions{})
	if err != nil {
		return "", "", err
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return "", "", fmt.Errorf("lease has no holder")
	}
	id := *l.Spec.HolderIdentity
	pods, err := env.C.Client.CoreV1().Pods(hwNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=watcher"})
	if err != nil {
		return "", "", err
	}
	for _, p := range pods.Items {
		if strings.HasPrefix(id, p.Name) {
			return p.Name, p.Spec.NodeName, nil
		}
	}
	return "", "", fmt.Errorf("lease holder %q is no watcher pod", id)
}

// streamsR3From returns a check, made from node n, that is nil when every
// JetStream stream is kept on three servers, its leader and two current
// replicas, as the stream's leader reports.
func streamsR3From(n *cluster.Node) func(ctx context.Context) error {
	hc := n.HTTPClient()
	return func(ctx context.Context) error { return streamsR3(ctx, hc) }
}

func streamsR3(ctx context.Context, hc *http.Client) error {
	pods, err := env.C.Client.CoreV1().Pods(hwNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nats"})
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	var problems []string
	for _, p := range pods.Items {
		if p.Status.PodIP == "" {
			return fmt.Errorf("%s has no address", p.Name)
		}
		var jsz struct {
			Accounts []struct {
				Streams []struct {
					Name   string `json:"name"`
					Config struct {
						Replicas int `json:"num_replicas"`
					} `json:"config"`
					Cluster struct {
						Leader   string `json:"leader"`
						Replicas []struct {
							Name    string `json:"name"`
							Current bool   `json:"current"`
							Offline bool   `json:"offline"`
						} `json:"replicas"`
					} `json:"cluster"`
				} `json:"stream_detail"`
			} `json:"account_details"`
		}
		body, err := get(ctx, hc, fmt.Sprintf("http://%s:8222/jsz?accounts=true&streams=true&config=true", p.Status.PodIP))
		if err != nil {
			return err
		}
		if err := json.Unmarshal([]byte(body), &jsz); err != nil {
			return fmt.Errorf("jsz of %s: %w", p.Name, err)
		}
		for _, a := range jsz.Accounts {
			for _, s := range a.Streams {
				if s.Cluster.Leader != p.Name {
					continue
				}
				seen[s.Name] = true
				current := 0
				for _, r := range s.Cluster.Replicas {
					if r.Current && !r.Offline {
						current++
					}
				}
				if s.Config.Replicas != 3 || current != 2 {
					problems = append(problems, fmt.Sprintf("%s: %d replicas configured, leader %s and %d current", s.Name, s.Config.Replicas, s.Cluster.Leader, current))
				}
			}
		}
	}
	if len(seen) == 0 {
		return fmt.Errorf("no stream has a leader yet")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// checkNoDoubleWrites checks that no source's revision was stored twice:
// one NewArtifact Event per source and commit, counted once.
func checkNoDoubleWrites(t *testing.T) {
	t.Helper()
	evs, err := env.C.Client.CoreV1().Events(loadNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int32{}
	for _, e := range evs.Items {
		if e.Reason != "NewArtifact" {
			continue
		}
		seen[e.InvolvedObject.Name+": "+e.Message] += max(e.Count, 1)
	}
	if len(seen) == 0 {
		t.Fatal("no NewArtifact Event at all")
	}
	for k, n := range seen {
		if n > 1 {
			t.Errorf("stored %d times: %s", n, k)
		}
	}
	t.Logf("%d NewArtifact Events, each revision stored once", len(seen))
}

// load is the sources, their repositories' commits and the downloads.
type load struct {
	cl    ctrlclient.Client
	repos []*gitserver.Repo
	names []string
	done  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	heads   map[string]string // the newest commit of each repository
	commits int
	// commitsOf counts the commits made to each repository.
	commitsOf map[string]int
	// gitMu keeps the committer and commitRound from running git in one
	// repository at once.
	gitMu   sync.Mutex
	phase   string
	results []download
	// artifacts are the sources' current artifacts, as the lister last
	// read them: what the downloader fetches.
	artifacts map[string]meta.Artifact
	base      string // http://<the Service's cluster IP>
	client    *http.Client
	stopOnce  sync.Once
	// marks are when each phase began; explain, if set, says what the
	// Service's endpoints were at a failed download's time; stale, if
	// set, says whether a failed download's connection met a tracked
	// connection to a lost pod (connSampler.staleAt), and which.
	marks   []download
	explain func(download) string
	stale   func(download) (string, bool)
	// dumpNode, if set, is where a download that fails to connect has
	// its node's state read at once (dumps, by the download's time).
	dumpNode *cluster.Node
	lastDump time.Time
	dumps    map[time.Time]string
}

type download struct {
	at      time.Time
	phase   string
	source  string
	err     string
	corrupt bool
	sport   int // the connection's source port, 0 if not known
}

// sourcePortKey is a context key for an *int that dialRecordingPort sets
// to the source port of the connection it dials, made or failed.
type sourcePortKey struct{}

// dialRecordingPort dials from n's namespace, and records the source port
// the kernel gave the connection where the context asks for it (the
// socket is kept open until then, so a failed connect's port can be read
// too): what names the connection in the node's connection tracking.
func dialRecordingPort(n *cluster.Node) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		port, _ := ctx.Value(sourcePortKey{}).(*int)
		if port == nil {
			return n.DialContext(ctx, network, addr)
		}
		// The dial may outlive the call (its context ends first): the
		// copy of the socket is closed by whichever comes last.
		var mu sync.Mutex
		dup, returned := -1, false
		d := &net.Dialer{ControlContext: func(_ context.Context, _, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) {
				nfd, err := unix.Dup(int(fd))
				if err != nil {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if returned {
					unix.Close(nfd)
					return
				}
				dup = nfd
			})
		}}
		conn, err := n.DialContextWith(ctx, d, network, addr)
		mu.Lock()
		defer mu.Unlock()
		returned = true
		if dup >= 0 {
			if sa, serr := unix.Getsockname(dup); serr == nil {
				if in4, ok := sa.(*unix.SockaddrInet4); ok {
					*port = in4.Port
				}
			}
			unix.Close(dup)
		}
		return conn, err
	}
}

func newLoad(t *testing.T, cl ctrlclient.Client) *load {
	t.Helper()
	ctx := context.Background()
	env.EnsureNamespace(t, loadNamespace)
	l := &load{cl: cl, done: make(chan struct{}), heads: map[string]string{}, commitsOf: map[string]int{}, artifacts: map[string]meta.Artifact{}, phase: "steady"}
	start := time.Now()
	work := t.TempDir()
	for i := range loadSources {
		name := fmt.Sprintf("src-%03d", i)
		r, err := gitserver.NewRepo(env.GitRoot, name, filepath.Join(work, name), "main")
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Write(map[string]string{"app.yaml": name + " 0\n"}); err != nil {
			t.Fatal(err)
		}
		head, err := r.Commit("initial")
		if err != nil {
			t.Fatal(err)
		}
		l.repos = append(l.repos, r)
		l.names = append(l.names, name)
		l.heads[name] = head
		gr := &sourcev1.GitRepository{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: loadNamespace},
			Spec: sourcev1.GitRepositorySpec{
				URL:       env.Git.RepoURL(name),
				Interval:  metav1.Duration{Duration: time.Minute},
				Reference: &sourcev1.GitRepositoryRef{Branch: "main"},
			},
		}
		if err := cl.Create(ctx, gr); err != nil {
			t.Fatal(err)
		}
	}
	l.waitFresh(t, 10*time.Minute)
	t.Logf("%d sources created and Ready in %s", loadSources, time.Since(start).Round(100*time.Millisecond))
	svc, err := env.C.ServiceURL(ctx, hwNamespace, "source-controller", "http")
	if err != nil {
		t.Fatal(err)
	}
	l.base = svc
	return l
}

// start starts the commits: one repository a second in turn, so each
// gets a new commit every loadSources seconds, as a busy fleet does.
func (l *load) start() {
	l.wg.Add(2)
	go func() {
		defer l.wg.Done()
		for i := 0; ; i++ {
			select {
			case <-l.done:
				return
			case <-time.After(time.Second):
			}
			l.commit(i % len(l.repos))
		}
	}()
	go func() {
		defer l.wg.Done()
		for {
			l.list()
			select {
			case <-l.done:
				return
			case <-time.After(2 * time.Second):
			}
		}
	}()
}

func (l *load) commit(i int) {
	l.gitMu.Lock()
	defer l.gitMu.Unlock()
	r, name := l.repos[i], l.names[i]
	l.mu.Lock()
	l.commits++
	n := l.commits
	l.mu.Unlock()
	if err := r.Write(map[string]string{"app.yaml": fmt.Sprintf("%s %d\n", name, n)}); err != nil {
		return
	}
	// Each commit's message is its own: the NewArtifact Events name it.
	head, err := r.Commit(fmt.Sprintf("change %d", n))
	if err != nil {
		return
	}
	l.mu.Lock()
	l.heads[name] = head
	l.commitsOf[name]++
	l.mu.Unlock()
}

// commitRound commits to every repository once, so every source has a
// newest commit made after what came before.
func (l *load) commitRound(t *testing.T) {
	t.Helper()
	for i := range l.repos {
		l.commit(i)
	}
}

// list reads every source's artifact.
func (l *load) list() {
	var list sourcev1.GitRepositoryList
	if err := l.cl.List(context.Background(), &list, ctrlclient.InNamespace(loadNamespace)); err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, gr := range list.Items {
		if gr.Status.Artifact != nil {
			l.artifacts[gr.Name] = *gr.Status.Artifact
		}
	}
}

// downloadFrom starts the downloads from node n's namespace: every 100 ms
// one source's artifact in turn, through the Service, each on a new
// connection (so the Service picks a pod each time, as many consumers
// would), its digest checked. A download that hangs (its pod's node is
// gone) delays none of the others.
func (l *load) downloadFrom(n *cluster.Node) {
	l.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dialRecordingPort(n), DisableKeepAlives: true}}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-l.done:
				return
			case <-tick.C:
			}
			l.wg.Add(1)
			go func(name string) {
				defer l.wg.Done()
				l.downloadOne(name)
			}(l.names[i%len(l.names)])
		}
	}()
}

func (l *load) downloadOne(name string) {
	l.mu.Lock()
	a, ok := l.artifacts[name]
	phase := l.phase
	l.mu.Unlock()
	if !ok {
		return
	}
	d := download{at: time.Now(), phase: phase, source: name}
	ctx := context.WithValue(context.Background(), sourcePortKey{}, &d.sport)
	digest, status, err := l.fetchCtx(ctx, l.base, a.URL)
	switch {
	case err != nil:
		d.err = err.Error()
	case status == http.StatusNotFound && l.superseded(name, a):
		// A newer artifact replaced it and the old one was collected
		// between the listing and the download: not a failure.
		return
	case status != http.StatusOK:
		d.err = fmt.Sprintf("status %d", status)
	case digest != a.Digest:
		d.err, d.corrupt = fmt.Sprintf("digest %s, want %s", digest, a.Digest), true
	}
	if strings.Contains(d.err, "connect: ") {
		l.dump(d)
	}
	l.mu.Lock()
	l.results = append(l.results, d)
	l.mu.Unlock()
}

// dump reads, right after a download failed to connect, what the
// downloading node held for it: its neighbours, its routes and the tracked
// connections of its source port, at most one a second.
func (l *load) dump(d download) {
	l.mu.Lock()
	n := l.dumpNode
	if n == nil || time.Since(l.lastDump) < time.Second {
		l.mu.Unlock()
		return
	}
	l.lastDump = time.Now()
	l.mu.Unlock()
	script := fmt.Sprintf("date -u +%%T.%%N; ip neigh show; ip route show; grep -E 'port=%d ' /proc/net/nf_conntrack; nstat -az TcpExtTCPAbortFailed IpOutNoRoutes Icmp* 2>/dev/null | grep -v ' 0 '", d.sport)
	out, err := l.dumpNode.Command("sh", "-c", script).CombinedOutput()
	if err != nil {
		out = append(out, []byte(err.Error())...)
	}
	l.mu.Lock()
	if l.dumps == nil {
		l.dumps = map[time.Time]string{}
	}
	l.dumps[d.at] = strings.ReplaceAll(strings.TrimSpace(string(out)), "\n", " | ")
	l.mu.Unlock()
}

// fetch downloads an artifact URL through the Service's cluster IP.
func (l *load) fetch(raw string) (string, int, error) { return l.fetchFrom(l.base, raw) }

// fetchFrom downloads an artifact URL's path from base (http://<host>).
func (l *load) fetchFrom(base, raw string) (string, int, error) {
	return l.fetchCtx(context.Background(), base, raw)
}

// fetchCtx is fetchFrom with a context, which may carry a sourcePortKey.
func (l *load) fetchCtx(ctx context.Context, base, raw string) (string, int, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+u.RequestURI(), nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	h := sha256.New()
	if _, err := io.Copy(h, resp.Body); err != nil {
		return "", 0, err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), resp.StatusCode, nil
}

func (l *load) superseded(name string, a meta.Artifact) bool {
	var gr sourcev1.GitRepository
	if err := l.cl.Get(context.Background(), ctrlclient.ObjectKey{Namespace: loadNamespace, Name: name}, &gr); err != nil {
		return false
	}
	return gr.Status.Artifact != nil && gr.Status.Artifact.Revision != a.Revision
}

// mark starts a new phase of the run, which the downloads are counted in.
func (l *load) mark(phase string) {
	l.mu.Lock()
	l.phase = phase
	l.marks = append(l.marks, download{at: time.Now(), phase: phase})
	l.mu.Unlock()
}

// downloads is how many downloads have been made.
func (l *load) downloads() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.results)
}

// waitDownloads waits until n downloads have been made.
func (l *load) waitDownloads(t *testing.T, n int) {
	t.Helper()
	kubetest.Eventually(t, 2*time.Minute, fmt.Sprintf("%d downloads", n), func(context.Context) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		if len(l.results) < n {
			return fmt.Errorf("%d downloads so far", len(l.results))
		}
		return nil
	})
}

// waitFresh stops nothing: it waits until every source is Ready at the
// newest commit of its repository as of the call, and returns when.
func (l *load) waitFresh(t *testing.T, timeout time.Duration) time.Time {
	t.Helper()
	l.mu.Lock()
	want := make(map[string]string, len(l.heads))
	for k, v := range l.heads {
		want[k] = v
	}
	l.mu.Unlock()
	kubetest.Eventually(t, timeout, "every source Ready at its newest commit", func(ctx context.Context) error {
		var list sourcev1.GitRepositoryList
		if err := l.cl.List(ctx, &list, ctrlclient.InNamespace(loadNamespace)); err != nil {
			return err
		}
		var behind []string
		for _, gr := range list.Items {
			if !atOrAfter(gr, want[gr.Name], l.repoOf(gr.Name)) {
				behind = append(behind, gr.Name)
			}
		}
		if len(list.Items) != len(want) {
			return fmt.Errorf("%d sources, want %d", len(list.Items), len(want))
		}
		if len(behind) > 0 {
			sort.Strings(behind)
			return fmt.Errorf("%d sources not yet Ready at their newest commit: %s", len(behind), strings.Join(behind[:min(len(behind), 5)], ", "))
		}
		return nil
	})
	return time.Now()
}

func (l *load) repoOf(name string) *gitserver.Repo {
	for i, n := range l.names {
		if n == name {
			return l.repos[i]
		}
	}
	return nil
}

// atOrAfter reports whether gr is Ready with an artifact of commit or of
// a commit made after it (commits keep arriving while the test waits).
func atOrAfter(gr sourcev1.GitRepository, commit string, r *gitserver.Repo) bool {
	ready := apimeta.FindStatusCondition(gr.Status.Conditions, "Ready")
	if ready == nil || ready.Status != metav1.ConditionTrue || gr.Status.Artifact == nil {
		return false
	}
	_, rev, ok := strings.Cut(gr.Status.Artifact.Revision, "sha1:")
	if !ok {
		return false
	}
	if rev == commit {
		return true
	}
	if r == nil {
		return false
	}
	// rev descends from commit: a newer commit.
	return r.Git("merge-base", "--is-ancestor", commit, rev) == nil
}

func (l *load) stop() {
	l.stopOnce.Do(func() {
		close(l.done)
		l.wg.Wait()
	})
}

// checkArtifacts downloads every source's current artifact once more and
// checks its digest: nothing lost, nothing corrupt.
func (l *load) checkArtifacts(t *testing.T) {
	t.Helper()
	var list sourcev1.GitRepositoryList
	if err := l.cl.List(context.Background(), &list, ctrlclient.InNamespace(loadNamespace)); err != nil {
		t.Fatal(err)
	}
	for _, gr := range list.Items {
		if gr.Status.Artifact == nil {
			t.Errorf("%s has no artifact", gr.Name)
			continue
		}
		digest, status, err := l.fetchOnce(t, gr.Name, gr.Status.Artifact.URL)
		if err != nil || status != http.StatusOK || digest != gr.Status.Artifact.Digest {
			t.Errorf("%s: artifact %s: status %d, digest %s (want %s), %v", gr.Name, gr.Status.Artifact.URL, status, digest, gr.Status.Artifact.Digest, err)
		}
	}
}

// fetchOnce downloads an artifact URL through the Service, as a consumer
// that retries a connection the node sent to a lost pod does: a failure
// to connect on a stale tracked connection (the second window in
// docs/operating.md, "A node is lost", proven by its source port) is
// logged and tried once more on a new connection; any other failure is
// returned.
func (l *load) fetchOnce(t *testing.T, name, raw string) (string, int, error) {
	t.Helper()
	d := download{at: time.Now(), source: name}
	ctx := context.WithValue(context.Background(), sourcePortKey{}, &d.sport)
	digest, status, err := l.fetchCtx(ctx, l.base, raw)
	if err == nil || l.stale == nil || !strings.Contains(err.Error(), "connect: ") {
		return digest, status, err
	}
	why, ok := l.stale(d)
	if !ok {
		return digest, status, err
	}
	t.Logf("%s: %v, on a stale tracked connection (%s): asked again", name, err, why)
	return l.fetch(raw)
}

// window is when downloads of a phase may fail: from a loss until its
// lost artifact-servers left the Service's ready endpoints (left) and
// kube-proxy has caught up (end); a phase whose end is zero (a return)
// has none.
type window struct {
	phase      string
	start, end time.Time
	left       time.Time
	// returned is when a lost node's network came back in the phase
	// (zero if it did not): the failures from then on are reported one
	// by one, with what they met.
	returned time.Time
}

// reportReturn logs each download of w's phase that failed from the lost
// node's return (w.returned) on: whether it met a stale tracked connection
// (docs/operating.md, "A lost node returns"), and what the rest met. l.mu
// is held.
func (l *load) reportReturn(t *testing.T, w window, stale map[time.Time]bool) {
	t.Helper()
	failed, onStale := 0, 0
	for _, d := range l.results {
		if d.err == "" || d.phase != w.phase || d.at.Before(w.returned) {
			continue
		}
		failed++
		what := "not on a stale tracked connection"
		if stale[d.at] {
			onStale++
			what, _ = l.stale(d)
			what = "on a stale tracked connection: " + what
		} else if l.explain != nil {
			what += "; the Service's endpoints " + l.explain(d)
			if dump, ok := l.dumps[d.at]; ok {
				what += "; read on the node right after: " + dump
			}
		}
		t.Logf("%s, after the node's return: download of %s failed %s after the return (at %s): %s; %s",
			w.phase, d.source, d.at.Sub(w.returned).Round(time.Millisecond), d.at.Format("15:04:05.000"), d.err, what)
	}
	t.Logf("%s: from the node's return on, %d downloads failed, %d of them on a stale tracked connection to a lost pod", w.phase, failed, onStale)
}

// leftSays says when a loss's artifact-servers left the Service's ready
// endpoints, and the last failure not on a stale tracked connection
// (lastRules after the loss) against that.
func leftSays(w window, lastRules time.Duration) string {
	if w.left.IsZero() {
		return ""
	}
	left := w.left.Sub(w.start)
	return fmt.Sprintf("; its lost artifact-servers left the Service's ready endpoints %s after it began, so that last failure came %s after they left",
		left.Round(time.Millisecond), (lastRules - left).Round(time.Millisecond))
}

// artifactServersOn are the addresses of the artifact-server pods on
// nodes (Ready or not, each with an address).
func artifactServersOn(t *testing.T, nodes ...string) []string {
	t.Helper()
	apps, err := podsByApp(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range apps["artifact-server"] {
		if slices.Contains(nodes, p.Spec.NodeName) && p.Status.PodIP != "" && p.DeletionTimestamp == nil {
			out = append(out, p.Status.PodIP)
		}
	}
	return out
}

// watchWhole starts watching the artifact-servers after the nodes named
// lost stopped; the function it returns waits until they are whole again
// (as many Ready replicas as the Deployment wants, none on a lost node)
// and returns when that was first seen.
func watchWhole(lost ...string) func(t *testing.T) time.Time {
	done := make(chan time.Time, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		for ctx.Err() == nil {
			if artifactServersWhole(ctx, lost) == nil {
				done <- time.Now()
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
		close(done)
	}()
	return func(t *testing.T) time.Time {
		t.Helper()
		at, ok := <-done
		if !ok {
			t.Fatal("the artifact-servers not whole again within 15 minutes")
		}
		return at
	}
}

func artifactServersWhole(ctx context.Context, lost []string) error {
	d, err := env.C.Client.AppsV1().Deployments(hwNamespace).Get(ctx, "artifact-server", metav1.GetOptions{})
	if err != nil {
		return err
	}
	pods, err := env.C.Client.CoreV1().Pods(hwNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=artifact-server"})
	if err != nil {
		return err
	}
	ready := 0
	for _, p := range pods.Items {
		if kubetest.PodReady(&p) && p.DeletionTimestamp == nil && !slices.Contains(lost, p.Spec.NodeName) {
			ready++
		}
	}
	if d.Spec.Replicas == nil || int32(ready) < *d.Spec.Replicas {
		return fmt.Errorf("%d artifact-servers Ready on live nodes", ready)
	}
	return nil
}

// report prints the downloads by phase and fails on any corrupt download
// and on any failed one outside the windows docs/operating.md states.
func (l *load) report(t *testing.T, windows []window) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	type count struct{ ok, failed, stale int }
	byPhase := map[string]*count{}
	staleFailures := 0
	staleByDownload := map[time.Time]bool{}
	var phases []string
	for _, d := range l.results {
		c, ok := byPhase[d.phase]
		if !ok {
			c = &count{}
			byPhase[d.phase] = c
			phases = append(phases, d.phase)
		}
		if d.err == "" {
			c.ok++
			continue
		}
		c.failed++
		inWindow := slices.ContainsFunc(windows, func(w window) bool {
			return d.phase == w.phase && !w.end.IsZero() && !d.at.After(w.end)
		})
		var stale string
		if l.stale != nil && strings.Contains(d.err, "connect: ") {
			stale, _ = l.stale(d)
		}
		if stale != "" {
			c.stale++
			staleByDownload[d.at] = true
		}
		switch {
		case d.corrupt:
			t.Errorf("corrupt download of %s at %s (%s): %s", d.source, d.at.Format(time.TimeOnly), d.phase, d.err)
		case !inWindow && stale != "":
			// docs/operating.md: a connection that reuses the source
			// port of one tracked to a lost pod goes to it.
			staleFailures++
			t.Logf("download of %s failed at %s (%s), outside the windows, on a stale tracked connection (allowed): %s; %s", d.source, d.at.Format("15:04:05.000"), d.phase, d.err, stale)
		case !inWindow:
			why := ""
			if l.explain != nil {
				why = "; the Service's endpoints " + l.explain(d)
			}
			if dump, ok := l.dumps[d.at]; ok {
				why += "; read on the node right after: " + dump
			}
			t.Errorf("download of %s failed at %s (%s), outside the window the doc states: %s%s", d.source, d.at.Format("15:04:05.000"), d.phase, d.err, why)
		}
	}
	for _, m := range l.marks {
		t.Logf("phase %q began at %s", m.phase, m.at.Format("15:04:05.000"))
	}
	t.Logf("downloads failed outside the windows on a stale tracked connection to a lost pod: %d", staleFailures)
	for _, p := range phases {
		t.Logf("downloads while %s: %d whole, %d failed (%d of them on a stale tracked connection to a lost pod)", p, byPhase[p].ok, byPhase[p].failed, byPhase[p].stale)
	}
	for _, w := range windows {
		// The last failure, and the last one the Service's rules caused
		// (not a stale tracked connection): what the window must cover.
		var last, lastRules time.Duration
		for _, d := range l.results {
			if d.err != "" && d.phase == w.phase {
				last = max(last, d.at.Sub(w.start))
				if !staleByDownload[d.at] {
					lastRules = max(lastRules, d.at.Sub(w.start))
				}
			}
		}
		may := "may fail on a stale tracked connection only"
		if !w.end.IsZero() {
			may = "may fail for " + w.end.Sub(w.start).Round(100*time.Millisecond).String()
		}
		t.Logf("%s: downloads %s; the last failed %s after it began, the last not on a stale tracked connection %s after it began%s",
			w.phase, may, last.Round(time.Millisecond), lastRules.Round(time.Millisecond), leftSays(w, lastRules))
		if !w.returned.IsZero() {
			l.reportReturn(t, w, staleByDownload)
		}
	}
	if v := os.Getenv("HEADWATER_NODELOSS_DUMP"); v != "" {
		var b strings.Builder
		for _, d := range l.results {
			fmt.Fprintf(&b, "%s\t%s\t%s\t%s\n", d.at.Sub(windows[0].start).Round(time.Millisecond), d.phase, d.source, d.err)
		}
		_ = os.WriteFile(v, []byte(b.String()), 0o644)
	}
}
