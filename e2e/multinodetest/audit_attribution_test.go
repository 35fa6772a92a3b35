package multinodetest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// auditLine is one audit.k8s.io/v1 Event as kube-apiserver writes it at the
// Metadata level (fields a test does not read left out).
func auditLine(stage, verb, user, pod, resource, sub, name string, code int, received, answered string) string {
	return auditLineNS(stage, verb, user, pod, "load", resource, sub, name, code, received, answered)
}

// auditLineNS is auditLine in namespace ns.
func auditLineNS(stage, verb, user, pod, ns, resource, sub, name string, code int, received, answered string) string {
	extra := ""
	if pod != "" {
		extra = fmt.Sprintf(`,"extra":{"authentication.kubernetes.io/credential-id":["JTI=1"],"authentication.kubernetes.io/node-name":["headwater-node-1"],"authentication.kubernetes.io/pod-name":[%q],"authentication.kubernetes.io/pod-uid":["4a1c"]}`, pod)
	}
	return fmt.Sprintf(`{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":%q,"requestURI":"/x","verb":%q,`+
		`"user":{"username":%q,"uid":"u1","groups":["system:serviceaccounts","system:serviceaccounts:headwater-system","system:authenticated"]%s},`+
		`"sourceIPs":["10.88.1.5"],"userAgent":"watcher/v0.1.0","objectRef":{"resource":%q,"namespace":%q,"name":%q,"apiGroup":"source.toolkit.fluxcd.io","apiVersion":"v1","subresource":%q},`+
		`"responseStatus":{"metadata":{},"code":%d},"requestReceivedTimestamp":"2026-12-04T10:%sZ","stageTimestamp":"2026-12-04T10:%sZ","annotations":{"authorization.k8s.io/decision":"allow"}}`,
		stage, verb, user, extra, resource, ns, name, sub, code, received, answered)
}

func TestAuditAttribution(t *testing.T) {
	const fetcher = "system:serviceaccount:headwater-system:fetcher"
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, "2026-12-04T10:"+s+"Z")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// watcher-a leads, watcher-b takes over, gives the Lease up, and
	// watcher-c takes it.
	terms := []leaseTerm{
		{pod: "watcher-a", acquired: at("00:00.000000")},
		{pod: "watcher-b", acquired: at("01:00.000000")},
		{pod: "", acquired: at("02:00.000000")},
		{pod: "watcher-c", acquired: at("02:02.000000")},
	}
	lines := []string{
		// Before the watches began: not checked.
		auditLine("ResponseComplete", "patch", watcherUser, "watcher-b", "gitrepositories", "status", "src-000", 200, "00:00.500000", "00:00.510000"),
		// Stages other than the answer, and reads: not writes.
		auditLine("RequestReceived", "patch", watcherUser, "watcher-b", "gitrepositories", "status", "src-001", 200, "00:10.000000", "00:10.000000"),
		auditLine("ResponseComplete", "get", watcherUser, "watcher-b", "gitrepositories", "", "src-001", 200, "00:10.000000", "00:10.010000"),
		"",
		// The leader's: right.
		auditLine("ResponseComplete", "patch", watcherUser, "watcher-a", "gitrepositories", "status", "src-001", 200, "00:10.000000", "00:10.010000"),
		auditLine("ResponseComplete", "update", watcherUser, "watcher-a", "leases", "", watcherLease, 200, "00:40.000000", "00:40.010000"),
		// Received in watcher-a's term, answered in watcher-b's.
		auditLine("ResponseComplete", "create", watcherUser, "watcher-a", "events", "", "src-001.1", 201, "00:59.990000", "01:00.020000"),
		// watcher-b's acquiring write (its acquireTime taken just before).
		auditLine("ResponseComplete", "update", watcherUser, "watcher-b", "leases", "", watcherLease, 200, "01:00.003000", "01:00.010000"),
		// watcher-a's try, refused: nothing written.
		auditLine("ResponseComplete", "update", watcherUser, "watcher-a", "leases", "", watcherLease, 409, "01:00.500000", "01:00.510000"),
		// watcher-a writing in watcher-b's term: wrong.
		auditLine("ResponseComplete", "patch", watcherUser, "watcher-a", "gitrepositories", "status", "src-002", 200, "01:01.000000", "01:01.010000"),
		// watcher-b gives the Lease up.
		auditLine("ResponseComplete", "update", watcherUser, "watcher-b", "leases", "", watcherLease, 200, "02:00.001000", "02:00.008000"),
		// Its leader election's "stopped leading" Event about the Lease,
		// after it gave the Lease up: the last word of its term.
		auditLineNS("ResponseComplete", "create", watcherUser, "watcher-b", "headwater-system", "events", "", watcherLease+".18ee31a5", 201, "02:00.060000", "02:00.070000"),
		// One by watcher-a, whose term was not the one that ended: wrong.
		auditLineNS("ResponseComplete", "create", watcherUser, "watcher-a", "headwater-system", "events", "", watcherLease+".18ee31a6", 201, "02:00.080000", "02:00.090000"),
		// watcher-b's Event about a source after it gave the Lease up:
		// wrong.
		auditLine("ResponseComplete", "create", watcherUser, "watcher-b", "events", "", "src-003.2", 201, "02:00.500000", "02:00.510000"),
		// watcher-a writing the Lease, accepted, in nobody's term, not
		// having held it last: wrong.
		auditLine("ResponseComplete", "update", watcherUser, "watcher-a", "leases", "", watcherLease, 200, "02:01.000000", "02:01.010000"),
		// watcher-c, the new leader: right.
		auditLine("ResponseComplete", "patch", watcherUser, "watcher-c", "gitrepositories", "status", "src-004", 200, "02:03.000000", "02:03.010000"),
		// A token bound to no pod: cannot be told apart, so wrong.
		auditLine("ResponseComplete", "patch", watcherUser, "", "gitrepositories", "status", "src-005", 200, "02:04.000000", "02:04.010000"),
		// Another service account's: counted, not checked.
		auditLine("ResponseComplete", "create", fetcher, "fetcher-x", "events", "", "src-006.3", 201, "02:05.000000", "02:05.010000"),
	}
	writes, err := readAuditWrites(strings.NewReader(strings.Join(lines, "\n") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(writes) != len(lines)-3 {
		t.Fatalf("%d writes read, want %d: %v", len(writes), len(lines)-3, writes)
	}
	if w := writes[1]; w.pod != "watcher-a" || w.resource != "gitrepositories/status" || w.name != "src-001" || w.code != 200 || !w.received.Equal(at("00:10.000000")) || !w.completed.Equal(at("00:10.010000")) {
		t.Errorf("a status write read as %+v", w)
	}

	r := attributeWrites(writes, terms, at("00:05.000000"))
	var wrong []string
	for _, w := range r.wrong {
		wrong = append(wrong, fmt.Sprintf("%s %s by %s, Lease %s's", w.resource, w.name, w.pod, w.holder))
	}
	want := []string{
		"gitrepositories/status src-002 by watcher-a, Lease watcher-b's",
		"events " + watcherLease + ".18ee31a6 by watcher-a, Lease 's",
		"events src-003.2 by watcher-b, Lease 's",
		"leases " + watcherLease + " by watcher-a, Lease 's",
		"gitrepositories/status src-005 by , Lease watcher-c's",
	}
	if !slices.Equal(wrong, want) {
		t.Errorf("wrong writers found:\n%s\nwant:\n%s", strings.Join(wrong, "\n"), strings.Join(want, "\n"))
	}
	if r.checked != 13 || r.before != 1 || r.leaseRefused != 1 || r.released != 1 || r.stoppedLeading != 1 || len(r.inFlight) != 1 || r.others[fetcher] != 1 {
		t.Errorf("checked %d (want 13), older %d (want 1), Lease writes refused %d (want 1), giving it up %d (want 1), stopped leading %d (want 1), in flight %q (want 1), others %v",
			r.checked, r.before, r.leaseRefused, r.released, r.stoppedLeading, r.inFlight, r.others)
	}
	if r.byPod["watcher-a"] != 7 || r.byPod["(no pod)"] != 1 {
		t.Errorf("writes by pod %v", r.byPod)
	}

	// The same log against terms that name another pod as leader
	// throughout: every write but the Lease's refused try is wrong.
	swapped := []leaseTerm{{pod: "watcher-z", acquired: at("00:00.000000")}}
	if r := attributeWrites(writes, swapped, at("00:05.000000")); len(r.wrong) != 12 {
		t.Errorf("with another pod holding the Lease, %d writes found wrong, want 12: %q", len(r.wrong), r.wrong)
	}
}
