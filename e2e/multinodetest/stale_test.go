package multinodetest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	watchtools "k8s.io/client-go/tools/watch"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster"
	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
)

// What TestNodeLoss checks of a node that returns with stale local state
// (issue 35, "it rejoins without serving or writing anything stale"): its
// NATS server's JetStream store, and every pod it ran, are from before
// the sources moved on.

const (
	// watcherLease is the watcher's leader election Lease (one shard).
	watcherLease = "headwater-watcher"
	// watcherController is the reportingController of the watcher's
	// Events; reportingInstance is it, a dash and the pod's hostname.
	watcherController = "headwater-watcher"
	// revisionAnnotation is where the watcher's Events about an artifact
	// name its revision (Flux's event metadata).
	revisionAnnotation = "source.toolkit.fluxcd.io/revision"
	// artifactServerPort is the artifact-server's HTTP port in its pod.
	artifactServerPort = 9090
)

var gitRepositories = schema.GroupVersionResource{Group: sourcev1.GroupVersion.Group, Version: sourcev1.GroupVersion.Version, Resource: "gitrepositories"}

// writeLog watches, for the whole of a test, every load source (each
// change of its status.artifact revision, in the order the API server
// made them) and the watcher's Lease (each holder and when it took the
// lease), so that at the end every revision change can be checked to
// move forward and every Event to come from the leader of its moment.
type writeLog struct {
	start  time.Time
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	updates  int               // object updates seen
	last     map[string]string // source -> the revision last seen
	changes  []revisionChange
	terms    []leaseTerm
	relisted int // watches restarted from a list (history compacted)
	// endpoints are the source-controller Service's endpoints, each
	// time its EndpointSlices changed: what a failed download met.
	endpoints []endpointsSeen
	slices    map[string]string // EndpointSlice -> its endpoints
}

// endpointsSeen is the Service's endpoints from a moment on.
type endpointsSeen struct {
	at        time.Time
	endpoints string
}

// revisionChange is one status write that changed a source's artifact
// revision, as the watch saw it.
type revisionChange struct {
	at               time.Time
	source, from, to string
	resourceVersion  string
}

// leaseTerm is one holder of the watcher's Lease, from its acquireTime
// (pod "" when the lease was released and nobody holds it).
type leaseTerm struct {
	pod      string
	acquired time.Time
}

// watchWrites starts watching the load's sources and the watcher's Lease.
func watchWrites(t *testing.T) *writeLog {
	t.Helper()
	dc, err := dynamic.NewForConfig(env.C.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &writeLog{start: time.Now(), cancel: cancel, last: map[string]string{}, slices: map[string]string{}}
	sources := dc.Resource(gitRepositories).Namespace(loadNamespace)
	leases := env.C.Client.CoordinationV1().Leases(hwNamespace)
	byName := metav1.ListOptions{FieldSelector: "metadata.name=" + watcherLease}
	endpointSlices := env.C.Client.DiscoveryV1().EndpointSlices(hwNamespace)
	bySvc := metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=source-controller"}
	w.wg.Add(3)
	go func() {
		defer w.wg.Done()
		w.follow(ctx, func(ctx context.Context) (string, error) {
			list, err := endpointSlices.List(ctx, bySvc)
			if err != nil {
				return "", err
			}
			for i := range list.Items {
				w.observeEndpoints(&list.Items[i])
			}
			return list.ResourceVersion, nil
		}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = bySvc.LabelSelector
			return endpointSlices.Watch(ctx, o)
		}, func(obj any) {
			if es, ok := obj.(*discoveryv1.EndpointSlice); ok {
				w.observeEndpoints(es)
			}
		})
	}()
	go func() {
		defer w.wg.Done()
		w.follow(ctx, func(ctx context.Context) (string, error) {
			list, err := sources.List(ctx, metav1.ListOptions{})
			if err != nil {
				return "", err
			}
			for i := range list.Items {
				w.observeSource(&list.Items[i])
			}
			return list.GetResourceVersion(), nil
		}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return sources.Watch(ctx, o)
		}, func(obj any) {
			if u, ok := obj.(*unstructured.Unstructured); ok {
				w.observeSource(u)
			}
		})
	}()
	go func() {
		defer w.wg.Done()
		w.follow(ctx, func(ctx context.Context) (string, error) {
			list, err := leases.List(ctx, byName)
			if err != nil {
				return "", err
			}
			for i := range list.Items {
				w.observeLease(&list.Items[i])
			}
			return list.ResourceVersion, nil
		}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName.FieldSelector
			return leases.Watch(ctx, o)
		}, func(obj any) {
			if l, ok := obj.(*coordinationv1.Lease); ok {
				w.observeLease(l)
			}
		})
	}()
	kubetest.Eventually(t, time.Minute, "the writes' watches to start", func(context.Context) error {
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.last) < loadSources || len(w.terms) == 0 {
			return fmt.Errorf("%d sources and %d lease holders seen", len(w.last), len(w.terms))
		}
		return nil
	})
	return w
}

// watchFunc makes a function a cache.WatcherWithContext.
type watchFunc func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)

func (f watchFunc) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return f(ctx, o)
}

// follow lists, then watches from the list's resourceVersion, passing
// every object to observe, until ctx ends; a watch the API server ends
// for good (its history compacted) is followed by a new list.
func (w *writeLog) follow(ctx context.Context, list func(context.Context) (string, error), wf watchFunc, observe func(any)) {
	for first := true; ctx.Err() == nil; first = false {
		rv, err := list(ctx)
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		if !first {
			w.mu.Lock()
			w.relisted++
			w.mu.Unlock()
		}
		rw, err := watchtools.NewRetryWatcherWithContext(ctx, rv, wf)
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		for ev := range rw.ResultChan() {
			if ev.Type == watch.Added || ev.Type == watch.Modified {
				observe(ev.Object)
			}
		}
		rw.Stop()
	}
}

func (w *writeLog) observeSource(u *unstructured.Unstructured) {
	rev, _, _ := unstructured.NestedString(u.Object, "status", "artifact", "revision")
	w.mu.Lock()
	defer w.mu.Unlock()
	w.updates++
	prev, seen := w.last[u.GetName()]
	w.last[u.GetName()] = rev
	if seen && prev != rev {
		w.changes = append(w.changes, revisionChange{at: time.Now(), source: u.GetName(), from: prev, to: rev, resourceVersion: u.GetResourceVersion()})
	}
}

func (w *writeLog) observeLease(l *coordinationv1.Lease) {
	var term leaseTerm
	if l.Spec.HolderIdentity != nil {
		// controller-runtime's identity: the hostname (the pod's
		// name), an underscore and a UUID.
		term.pod, _, _ = strings.Cut(*l.Spec.HolderIdentity, "_")
	}
	if l.Spec.AcquireTime != nil {
		term.acquired = l.Spec.AcquireTime.Time
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(w.terms); n > 0 && w.terms[n-1] == term {
		return
	}
	w.terms = append(w.terms, term)
}

func (w *writeLog) observeEndpoints(es *discoveryv1.EndpointSlice) {
	var eps []string
	for _, e := range es.Endpoints {
		c := e.Conditions
		state := fmt.Sprintf("ready=%t,serving=%t,terminating=%t", c.Ready != nil && *c.Ready, c.Serving != nil && *c.Serving, c.Terminating != nil && *c.Terminating)
		eps = append(eps, fmt.Sprintf("%s(%s,%s)", strings.Join(e.Addresses, "/"), cmpOr(ptrOr(e.NodeName), "?"), state))
	}
	sort.Strings(eps)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.slices[es.Name] = strings.Join(eps, " ")
	var all []string
	for _, v := range w.slices {
		if v != "" {
			all = append(all, v)
		}
	}
	sort.Strings(all)
	w.endpoints = append(w.endpoints, endpointsSeen{at: time.Now(), endpoints: strings.Join(all, " ")})
}

// readyAt is the Service's ready endpoints' addresses at at.
func (w *writeLog) readyAt(at time.Time) map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	var eps string
	for _, e := range w.endpoints {
		if e.at.After(at) {
			break
		}
		eps = e.endpoints
	}
	return readyIn(eps)
}

// leftReady is when, from after on, none of addrs was a ready endpoint of
// the Service any more (as its EndpointSlices were seen): when the last of
// them left. ok is false if one of them never did.
func (w *writeLog) leftReady(addrs []string, after time.Time) (at time.Time, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(addrs) == 0 {
		return after, true
	}
	for _, e := range w.endpoints {
		if e.at.Before(after) {
			continue
		}
		ready := readyIn(e.endpoints)
		if !slices.ContainsFunc(addrs, func(a string) bool { return ready[a] }) {
			return e.at, true
		}
	}
	return time.Time{}, false
}

// readyIn is the ready addresses of endpoints as observeEndpoints writes
// them.
func readyIn(eps string) map[string]bool {
	ready := map[string]bool{}
	// Each is "addr[/addr...](node,ready=...,serving=...,terminating=...)".
	for _, ep := range strings.Fields(eps) {
		addrs, state, ok := strings.Cut(ep, "(")
		if !ok || !strings.Contains(state, ",ready=true,") {
			continue
		}
		for _, a := range strings.Split(addrs, "/") {
			ready[a] = true
		}
	}
	return ready
}

func ptrOr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// endpointsAt says what the Service's endpoints were at, and since when.
func (w *writeLog) endpointsAt(at time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := "(not seen yet)"
	for _, e := range w.endpoints {
		if e.at.After(at) {
			break
		}
		out = fmt.Sprintf("since %s: %s", e.at.Format("15:04:05.000"), cmpOr(e.endpoints, "none"))
	}
	return out
}

// stop ends the watches.
func (w *writeLog) stop() {
	w.cancel()
	w.wg.Wait()
}

// holderAt is the pod that held the Lease at, by the terms seen; ok is
// false before the first.
func (w *writeLog) holderAt(at time.Time) (pod string, ok bool) {
	return holderAt(w.terms, at)
}

// checkNoRegression fails t on any status write that took a source's
// artifact back to an older commit, or took it away.
func (w *writeLog) checkNoRegression(t *testing.T, l *load) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	forward := 0
	for _, c := range w.changes {
		from, to := commitOf(c.from), commitOf(c.to)
		switch {
		case c.to == "":
			t.Errorf("%s at %s (resourceVersion %s): status.artifact %s removed", c.source, c.at.Format(time.TimeOnly), c.resourceVersion, c.from)
		case from == "" || to == "":
			forward++ // a first artifact
		case l.repoOf(c.source).Git("merge-base", "--is-ancestor", to, from) == nil:
			// to is an ancestor of from: an older commit.
			t.Errorf("%s at %s (resourceVersion %s): status.artifact went back from %s to the older %s", c.source, c.at.Format(time.TimeOnly), c.resourceVersion, c.from, c.to)
		default:
			forward++
		}
	}
	t.Logf("%d status updates of the %d sources watched, %d changes of revision, %d forward (watches restarted from a list: %d)",
		w.updates, len(w.last), len(w.changes), forward, w.relisted)
}

func commitOf(revision string) string {
	_, c, _ := strings.Cut(revision, "sha1:")
	return c
}

// checkWriters fails t on any Event of the watcher about a load source
// that did not come from the pod holding the Lease when it was recorded
// (its eventTime, and its series' lastObservedTime), and on any revision
// change of a source's status without a NewArtifact Event for it, from
// the leader: status.artifact is written by the same handling of an
// outcome, in the same process, that records its NewArtifact Event, so
// the Event names the writer.
func (w *writeLog) checkWriters(t *testing.T) {
	t.Helper()
	evs, err := env.C.Client.EventsV1().Events(loadNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var terms []string
	for _, term := range w.terms {
		terms = append(terms, fmt.Sprintf("%s from %s", cmpOr(term.pod, "(released)"), term.acquired.Format(time.TimeOnly)))
	}
	t.Logf("the watcher's Lease holders: %s", strings.Join(terms, ", "))
	byInstance := map[string]int{}
	newArtifact := map[string]bool{} // source|revision
	checked, before := 0, 0
	for i := range evs.Items {
		e := &evs.Items[i]
		if e.ReportingController != watcherController {
			continue
		}
		if e.Reason == "NewArtifact" {
			newArtifact[e.Regarding.Name+"|"+e.Annotations[revisionAnnotation]] = true
		}
		at := e.EventTime.Time
		if at.IsZero() {
			at = e.DeprecatedFirstTimestamp.Time
		}
		if at.Before(w.start) {
			before++
			continue
		}
		pod := strings.TrimPrefix(e.ReportingInstance, watcherController+"-")
		byInstance[pod]++
		checked++
		times := []time.Time{at}
		if e.Series != nil {
			times = append(times, e.Series.LastObservedTime.Time)
		}
		for _, when := range times {
			if holder, ok := w.holderAt(when); !ok || holder != pod {
				t.Errorf("%s Event about %s (%q) at %s from %s, while the Lease was %s's", e.Reason, e.Regarding.Name, e.Note,
					when.Format("15:04:05.000"), e.ReportingInstance, cmpOr(holder, "nobody"))
			}
		}
	}
	if checked == 0 {
		t.Errorf("no Event of the watcher about a load source since the watches began (%d older): nothing to check the writers on", before)
	}
	t.Logf("%d Events of the watcher since the watches began, by the pod that recorded them: %v (%d older ones not checked)", checked, byInstance, before)
	paired := 0
	for _, c := range w.changes {
		if c.to == "" || c.from == "" {
			continue
		}
		if !newArtifact[c.source+"|"+c.to] {
			t.Errorf("%s: status.artifact moved to %s at %s with no NewArtifact Event for it from the watcher", c.source, c.to, c.at.Format(time.TimeOnly))
			continue
		}
		paired++
	}
	t.Logf("%d revision changes in status, each with its NewArtifact Event from the leader of its moment: %d", len(w.changes), paired)
}

func cmpOr(s, or string) string {
	if s == "" {
		return or
	}
	return s
}

// streamState is what a NATS server's /jsz says of one stream.
type streamState struct {
	leader   string
	lastSeq  uint64
	replicas int
	current  map[string]bool // replica server -> current (as the leader sees it)
}

// natsStreams reads /jsz of the NATS server pod (its name is the server's)
// through hc: the streams it keeps, with their last sequence on it.
func natsStreams(ctx context.Context, hc *http.Client, podIP string) (map[string]streamState, error) {
	var jsz struct {
		Accounts []struct {
			Streams []struct {
				Name   string `json:"name"`
				Config struct {
					Replicas int `json:"num_replicas"`
				} `json:"config"`
				State struct {
					LastSeq uint64 `json:"last_seq"`
				} `json:"state"`
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
	body, err := get(ctx, hc, fmt.Sprintf("http://%s:8222/jsz?accounts=true&streams=true&config=true", podIP))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(body), &jsz); err != nil {
		return nil, fmt.Errorf("jsz of %s: %w", podIP, err)
	}
	out := map[string]streamState{}
	for _, a := range jsz.Accounts {
		for _, s := range a.Streams {
			st := streamState{leader: s.Cluster.Leader, lastSeq: s.State.LastSeq, replicas: s.Config.Replicas, current: map[string]bool{}}
			for _, r := range s.Cluster.Replicas {
				st.current[r.Name] = r.Current && !r.Offline
			}
			out[s.Name] = st
		}
	}
	return out, nil
}

// natsPods are the NATS server pods that have an address: their IPs and
// their nodes, by name.
func natsPods(ctx context.Context) (map[string]string, map[string]string, error) {
	pods, err := env.C.Client.CoreV1().Pods(hwNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nats"})
	if err != nil {
		return nil, nil, err
	}
	ips, nodes := map[string]string{}, map[string]string{}
	for _, p := range pods.Items {
		if p.Status.PodIP != "" && p.DeletionTimestamp == nil {
			ips[p.Name], nodes[p.Name] = p.Status.PodIP, p.Spec.NodeName
		}
	}
	return ips, nodes, nil
}

// natsOn reads the streams of the NATS server on node, and its name.
func natsOn(ctx context.Context, hc *http.Client, node string) (string, map[string]streamState, error) {
	ips, nodes, err := natsPods(ctx)
	if err != nil {
		return "", nil, err
	}
	for name, n := range nodes {
		if n == node {
			s, err := natsStreams(ctx, hc, ips[name])
			return name, s, err
		}
	}
	return "", nil, fmt.Errorf("no NATS server on %s", node)
}

// waitCaughtUp waits until the NATS server on node keeps every stream,
// each at the last sequence its leader had when read just before (or
// later), and each stream's leader counts it a current replica; it logs
// how far behind the server came back (its last sequences when its node
// stopped, whenStopped).
func waitCaughtUp(t *testing.T, hc *http.Client, node string, whenStopped map[string]uint64) {
	t.Helper()
	start := time.Now()
	var name string
	var caught map[string]uint64
	kubetest.Eventually(t, 5*time.Minute, "the returned node's NATS server caught up", func(ctx context.Context) error {
		ips, nodes, err := natsPods(ctx)
		if err != nil {
			return err
		}
		// The others first, the returned server last: it must have
		// what they had.
		returned, others := "", map[string]map[string]streamState{}
		for n, ip := range ips {
			if nodes[n] == node {
				returned = n
				continue
			}
			if others[n], err = natsStreams(ctx, hc, ip); err != nil {
				return err
			}
		}
		if returned == "" {
			return fmt.Errorf("no NATS server on %s", node)
		}
		mine, err := natsStreams(ctx, hc, ips[returned])
		if err != nil {
			return err
		}
		leaders := map[string]uint64{}
		var behind []string
		for leader, streams := range others {
			for s, st := range streams {
				if st.leader != leader {
					continue
				}
				leaders[s] = st.lastSeq
				if !st.current[returned] {
					behind = append(behind, fmt.Sprintf("%s: not a current replica for its leader %s", s, leader))
				}
			}
		}
		for s, st := range mine {
			if st.leader == returned {
				leaders[s] = st.lastSeq
			}
		}
		if len(leaders) == 0 {
			return fmt.Errorf("no stream has a leader")
		}
		for s, seq := range leaders {
			st, ok := mine[s]
			switch {
			case !ok:
				behind = append(behind, s+": not kept")
			case st.lastSeq < seq:
				behind = append(behind, fmt.Sprintf("%s: at %d, its leader at %d", s, st.lastSeq, seq))
			}
		}
		if len(behind) > 0 {
			sort.Strings(behind)
			return fmt.Errorf("%s", strings.Join(behind, "; "))
		}
		name, caught = returned, leaders
		return nil
	})
	var lines []string
	for s, seq := range caught {
		lines = append(lines, fmt.Sprintf("%s %d -> %d", s, whenStopped[s], seq))
	}
	sort.Strings(lines)
	t.Logf("the returned node's NATS server %s caught up %s after the check began; each stream's last sequence on it when its node stopped -> its leader's, which it has now: %s",
		name, time.Since(start).Round(100*time.Millisecond), strings.Join(lines, ", "))
}

// lastSeqOn reads the last sequence of each stream on the NATS server on
// node.
func lastSeqOn(t *testing.T, hc *http.Client, node string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	kubetest.Eventually(t, time.Minute, "the streams of the NATS server on "+node, func(ctx context.Context) error {
		_, streams, err := natsOn(ctx, hc, node)
		if err != nil {
			return err
		}
		for s, st := range streams {
			out[s] = st.lastSeq
		}
		return nil
	})
	return out
}

// moveOnto puts a fetcher, a packager, an artifact-server and the
// watcher's standby on node, as an operator rebalancing after a node's
// return would (the returned node runs none: their replacements went to
// the others while it was away): with the other nodes cordoned, one pod
// of each is deleted from a node with two (the standby watcher: never the
// leader), so its replacement can only start on node.
func moveOnto(t *testing.T, node string, others []*cluster.Node) {
	t.Helper()
	ctx := context.Background()
	for _, n := range others {
		env.Kubectl(t, "cordon", n.Name)
	}
	uncordon := func() {
		for _, n := range others {
			_, _ = env.C.Kubectl(context.Background(), "uncordon", n.Name).Run()
		}
	}
	defer uncordon()
	apps, err := podsByApp(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader, _, err := leaseHolder(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, app := range []string{"fetcher", "packager", "artifact-server", "watcher"} {
		pods := apps[app]
		if slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.Spec.NodeName == node }) {
			continue
		}
		perNode := map[string]int{}
		for _, p := range pods {
			perNode[p.Spec.NodeName]++
		}
		victim := ""
		for _, p := range pods {
			if p.Name == leader {
				continue
			}
			if victim == "" || perNode[p.Spec.NodeName] > 1 {
				victim = p.Name
			}
		}
		if victim == "" {
			t.Fatalf("no %s pod to move onto %s", app, node)
		}
		env.Kubectl(t, "-n", hwNamespace, "delete", "pod", victim, "--wait=false")
		t.Logf("%s: %s deleted, so its replacement starts on %s", app, victim, node)
	}
	kubetest.Eventually(t, 5*time.Minute, "a fetcher, packager, artifact-server and watcher Ready on "+node, func(ctx context.Context) error {
		if err := podsReady(ctx); err != nil {
			return err
		}
		apps, err := podsByApp(ctx)
		if err != nil {
			return err
		}
		for _, app := range []string{"fetcher", "packager", "artifact-server", "watcher"} {
			if !slices.ContainsFunc(apps[app], func(p corev1.Pod) bool { return p.Spec.NodeName == node && kubetest.PodReady(&p) }) {
				return fmt.Errorf("no %s Ready on %s", app, node)
			}
		}
		return nil
	})
	t.Logf("the moved pods Ready on %s %s after the deletions", node, time.Since(start).Round(100*time.Millisecond))
}

// artifactServerOn is the IP of a Ready artifact-server pod on node.
func artifactServerOn(t *testing.T, node string) (string, string) {
	t.Helper()
	apps, err := podsByApp(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range apps["artifact-server"] {
		if p.Spec.NodeName == node && kubetest.PodReady(&p) && p.Status.PodIP != "" {
			return p.Name, p.Status.PodIP
		}
	}
	t.Fatalf("no artifact-server Ready on %s", node)
	return "", ""
}

// checkServedBy downloads every source's current artifact (as its status
// says when the download starts) from the artifact-server at podIP
// directly, rounds times over, and fails t on any answer but the digest
// status gives: never an older artifact, never a corrupt one. A 404 for
// an artifact a newer one replaced in the meantime is asked again.
func (l *load) checkServedBy(t *testing.T, pod, podIP string, rounds int) {
	t.Helper()
	base := fmt.Sprintf("http://%s:%d", podIP, artifactServerPort)
	ok, superseded := 0, 0
	for range rounds {
		for _, name := range l.names {
			for attempt := 0; ; attempt++ {
				var gr sourcev1.GitRepository
				if err := l.cl.Get(context.Background(), ctrlclient.ObjectKey{Namespace: loadNamespace, Name: name}, &gr); err != nil {
					t.Fatal(err)
				}
				a := gr.Status.Artifact
				if a == nil {
					t.Errorf("%s has no artifact", name)
					break
				}
				digest, status, err := l.fetchFrom(base, a.URL)
				if status == http.StatusNotFound && attempt < 3 && l.superseded(name, *a) {
					superseded++
					continue
				}
				if err != nil || status != http.StatusOK || digest != a.Digest {
					t.Errorf("%s from %s (%s): artifact %s: status %d, digest %s, want %s (revision %s): %v", name, pod, podIP, a.URL, status, digest, a.Digest, a.Revision, err)
				} else {
					ok++
				}
				break
			}
		}
	}
	t.Logf("%s (%s, directly): %d downloads of the sources' current artifacts, each with the digest status gives (%d asked again: a newer artifact replaced it meanwhile)", pod, podIP, ok, superseded)
}

// fetchCounter counts the git server's fetches of each repository and
// the load's commits to it from a moment on.
type fetchCounter struct {
	at      time.Time
	fetches map[string]int64
	commits map[string]int
}

func (l *load) countFetches() *fetchCounter {
	c := &fetchCounter{at: time.Now(), fetches: map[string]int64{}}
	for _, name := range l.names {
		c.fetches[name] = env.Git.FetchesOf(name)
	}
	l.mu.Lock()
	c.commits = copyCounts(l.commitsOf)
	l.mu.Unlock()
	return c
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// checkNoRefetch fails t on a repository fetched more often since c
// began than the commits made to it since, and one: a job already done
// fetched again (the one is the commit made just before, fetched just
// after).
func (l *load) checkNoRefetch(t *testing.T, c *fetchCounter, what string) {
	t.Helper()
	l.mu.Lock()
	commits := copyCounts(l.commitsOf)
	l.mu.Unlock()
	var fetches, made int64
	for _, name := range l.names {
		f := env.Git.FetchesOf(name) - c.fetches[name]
		n := int64(commits[name] - c.commits[name])
		fetches += f
		made += n
		if f > n+1 {
			t.Errorf("%s: %s fetched %d times for %d new commits: a job already done fetched again", what, name, f, n)
		}
	}
	t.Logf("%s (%s): %d fetches from the git server for %d new commits", what, time.Since(c.at).Round(100*time.Millisecond), fetches, made)
}

// revisions reads every source's artifact revision.
func (l *load) revisions(t *testing.T) map[string]string {
	t.Helper()
	var list sourcev1.GitRepositoryList
	if err := l.cl.List(context.Background(), &list, ctrlclient.InNamespace(loadNamespace)); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, gr := range list.Items {
		if gr.Status.Artifact != nil {
			out[gr.Name] = gr.Status.Artifact.Revision
		}
	}
	return out
}

// checkMovedOn fails t unless every source's artifact changed since
// before (the revisions when the node stopped): what the node returns
// with is stale for every one.
func (l *load) checkMovedOn(t *testing.T, before map[string]string) {
	t.Helper()
	now := l.revisions(t)
	same := 0
	for name, rev := range before {
		if now[name] == rev {
			same++
		}
	}
	if same > 0 {
		t.Errorf("%d sources at the revision they had when the node stopped: the node does not return stale for them", same)
	}
	t.Logf("while the node was away, all %d sources moved to a newer revision", len(before)-same)
}

// stopBriefly stops node n hard, commits to every repository, and starts
// n again once the cluster has seen it NotReady: before the unreachable
// toleration evicts its pods, so they restart in place, on the volumes
// and caches they had before the commits. It checks the node's NATS
// server catches up and logs which pods were kept, and how many sources
// had moved on by its return; it returns when n stopped, when its network
// came back (returning), when it was back (Ready), and when every pod was
// Ready again.
func stopBriefly(t *testing.T, l *load, n *cluster.Node, hc *http.Client) (stopped, returning, back, ready time.Time) {
	t.Helper()
	ctx := context.Background()
	before := podsOn(t, n.Name)
	revs := l.revisions(t)
	staleSeqs := lastSeqOn(t, hc, n.Name)
	l.mark("node lost briefly")
	stopped = time.Now()
	if err := env.C.StopNode(ctx, n.Name); err != nil {
		t.Fatal(err)
	}
	l.commitRound(t)
	kubetest.Eventually(t, 3*time.Minute, n.Name+" NotReady", func(ctx context.Context) error {
		if err := env.C.NodeReady(ctx, n.Name); err == nil {
			return fmt.Errorf("%s still Ready", n.Name)
		}
		return nil
	})
	notReady := time.Now()
	moved := 0
	now := l.revisions(t)
	for name, rev := range revs {
		if now[name] != rev {
			moved++
		}
	}
	fetches := l.countFetches()
	returning = time.Now()
	if err := env.C.StartNode(ctx, n.Name); err != nil {
		t.Fatal(err)
	}
	back = time.Now()
	t.Logf("%s stopped again: NotReady %s after, %d of %d sources at a newer revision by then; back (Ready) %s after the stop",
		n.Name, notReady.Sub(stopped).Round(100*time.Millisecond), moved, len(revs), back.Sub(stopped).Round(100*time.Millisecond))
	kubetest.Eventually(t, 10*time.Minute, "every pod Ready after the brief stop", podsReady)
	ready = time.Now()
	after := podsOn(t, n.Name)
	var kept, restarted []string
	for name, uid := range before {
		if after[name] == uid {
			kept = append(kept, name)
		} else {
			restarted = append(restarted, name)
		}
	}
	sort.Strings(kept)
	sort.Strings(restarted)
	t.Logf("every pod Ready %s after the node was back; kept on %s, restarted in place with their volumes: %v; evicted or replaced: %v",
		ready.Sub(back).Round(100*time.Millisecond), n.Name, kept, restarted)
	kubetest.Eventually(t, 5*time.Minute, "every stream in three current copies after the brief stop", func(ctx context.Context) error { return streamsR3(ctx, hc) })
	waitCaughtUp(t, hc, n.Name, staleSeqs)
	l.checkNoRefetch(t, fetches, "from the node's return from its brief stop until its pods were Ready and its NATS server caught up")
	return stopped, returning, back, ready
}

// podsOn is Headwater's pods on node, their UIDs by name.
func podsOn(t *testing.T, node string) map[string]string {
	t.Helper()
	pods, err := env.C.Client.CoreV1().Pods(hwNamespace).List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && !kubetest.IsJobPod(&p) {
			out[p.Name] = string(p.UID)
		}
	}
	return out
}
