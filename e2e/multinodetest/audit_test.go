package multinodetest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"testing"
	"time"
)

// What names the writer of every write the watcher makes: kube-apiserver's
// audit log. A status write names no pod (its field manager is the
// watcher's, one for every replica), but the request does: each watcher
// pod authenticates with its projected ServiceAccount token, bound to the
// pod, and the API server puts the pod's name in the request's user info
// (user.extra["authentication.kubernetes.io/pod-name"]).

// auditPolicy logs, at the Metadata level (no bodies), every write request
// of Headwater's service accounts once it has completed, and nothing else:
// a few thousand lines a run.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:` + hwNamespace + `"]
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
`

const (
	// watcherUser is the watcher pods' ServiceAccount, as the API server
	// names its requests' user.
	watcherUser = "system:serviceaccount:" + hwNamespace + ":watcher"
	// podNameExtra is the user info's extra key that names the pod a
	// bound ServiceAccount token was issued to.
	podNameExtra = "authentication.kubernetes.io/pod-name"
)

// auditWrite is one write request, as the audit log has it once the API
// server answered it.
type auditWrite struct {
	received, completed time.Time
	user, pod           string
	verb                string
	resource            string // with its subresource: "gitrepositories/status"
	namespace, name     string
	code                int
}

func (a auditWrite) String() string {
	return fmt.Sprintf("%s %s %s/%s by %s (received %s, answered %d at %s)", a.verb, a.resource, a.namespace, a.name,
		cmpOr(a.pod, a.user), a.received.Format("15:04:05.000000"), a.code, a.completed.Format("15:04:05.000000"))
}

// readAuditWrites reads an audit log (JSON lines of audit.k8s.io/v1
// Events) and returns its write requests that completed (or panicked), in
// the log's order.
func readAuditWrites(r io.Reader) ([]auditWrite, error) {
	var out []auditWrite
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for line := 1; sc.Scan(); line++ {
		var e struct {
			Stage string `json:"stage"`
			Verb  string `json:"verb"`
			User  struct {
				Username string              `json:"username"`
				Extra    map[string][]string `json:"extra"`
			} `json:"user"`
			ObjectRef *struct {
				Resource    string `json:"resource"`
				Subresource string `json:"subresource"`
				Namespace   string `json:"namespace"`
				Name        string `json:"name"`
			} `json:"objectRef"`
			ResponseStatus *struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
			Received time.Time `json:"requestReceivedTimestamp"`
			Stage2   time.Time `json:"stageTimestamp"`
		}
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("audit log line %d: %w", line, err)
		}
		if e.Stage != "ResponseComplete" && e.Stage != "Panic" {
			continue
		}
		switch e.Verb {
		case "create", "update", "patch", "delete", "deletecollection":
		default:
			continue
		}
		w := auditWrite{received: e.Received, completed: e.Stage2, user: e.User.Username, verb: e.Verb}
		if pods := e.User.Extra[podNameExtra]; len(pods) > 0 {
			w.pod = pods[0]
		}
		if o := e.ObjectRef; o != nil {
			w.resource, w.namespace, w.name = o.Resource, o.Namespace, o.Name
			if o.Subresource != "" {
				w.resource += "/" + o.Subresource
			}
		}
		if e.ResponseStatus != nil {
			w.code = e.ResponseStatus.Code
		}
		out = append(out, w)
	}
	return out, sc.Err()
}

// holderAt is the pod that held the Lease at, by terms (in the order
// they began); ok is false before the first.
func holderAt(terms []leaseTerm, at time.Time) (pod string, ok bool) {
	for _, term := range terms {
		if term.acquired.After(at) {
			break
		}
		pod, ok = term.pod, true
	}
	return pod, ok
}

// nextTermAfter is when the term after the one holding at began (zero if
// none did).
func nextTermAfter(terms []leaseTerm, at time.Time) time.Time {
	for _, term := range terms {
		if term.acquired.After(at) {
			return term.acquired
		}
	}
	return time.Time{}
}

// writerReport is what attributeWrites found.
type writerReport struct {
	checked    int            // watcher writes since the watches began
	before     int            // older ones, not checked
	byPod      map[string]int // checked writes by pod
	byResource map[string]int // checked writes by resource, Leases included
	others     map[string]int // writes of Headwater's other service accounts, by user
	// leaseRefused are the watcher's Lease writes the API server refused
	// (a standby's try that lost to another's): nothing written.
	leaseRefused int
	// released are Lease writes that gave the Lease up (its holder's,
	// on shutdown), and stoppedLeading the Events about the Lease of a
	// pod whose term had just ended.
	released, stoppedLeading int
	// inFlight are writes received while their pod held the Lease and
	// answered after the next term began.
	inFlight []string
	// wrong are the writes of a watcher pod that did not hold the Lease
	// (or of none), each with who held it then ("" for nobody).
	wrong []wrongWrite
}

// wrongWrite is a write by a pod that did not hold the Lease.
type wrongWrite struct {
	auditWrite
	holder string
}

func (w wrongWrite) String() string {
	if w.pod == "" {
		return fmt.Sprintf("%s: names no pod (a token not bound to one)", w.auditWrite)
	}
	return fmt.Sprintf("%s, while the Lease was %s's", w.auditWrite, cmpOr(w.holder, "nobody"))
}

// attributeWrites checks every write of the watcher's ServiceAccount
// received from since on against the Lease's terms: each must come from
// the pod that held the Lease when the API server received it. Its own
// Lease writes are the exception that makes the terms: a try refused by
// the API server (a conflict) wrote nothing; an accepted one must be its
// holder's, once it holds it (the acquiring write carries an acquireTime
// taken before it was sent, so the API server receives it within the new
// term), or give the Lease up (the term it begins, nobody's, follows the
// writer's). And the Event client-go's leader election records about the
// Lease when its pod stops leading, after it gave the Lease up, may come
// from the pod whose term just ended.
//
// The time is the request's requestReceivedTimestamp, from the API
// server's clock; acquireTime is from the acquiring pod's: one clock, the
// machine's, as every node is a namespace of this machine. No tolerance is
// added at a hand-over: the old leader stops writing when it fails to renew
// within its renew deadline (30 s), 5 s before the Lease expires (35 s),
// and the new one takes it only after, so none of its requests may arrive
// in the next term. A request received in its pod's term that completes in
// the next (in flight at the hand-over) is allowed, and listed: the API
// server took it while its pod led.
func attributeWrites(writes []auditWrite, terms []leaseTerm, since time.Time) writerReport {
	r := writerReport{byPod: map[string]int{}, byResource: map[string]int{}, others: map[string]int{}}
	for _, w := range writes {
		if w.user != watcherUser {
			r.others[w.user]++
			continue
		}
		if w.received.Before(since) {
			r.before++
			continue
		}
		r.checked++
		r.byPod[cmpOr(w.pod, "(no pod)")]++
		r.byResource[w.resource]++
		holder, ok := holderAt(terms, w.received)
		if w.pod == "" {
			r.wrong = append(r.wrong, wrongWrite{auditWrite: w, holder: holder})
			continue
		}
		if w.resource == "leases" && w.name == watcherLease {
			switch {
			case w.code < 200 || w.code > 299:
				r.leaseRefused++
				continue
			case ok && holder == w.pod:
				continue
			case ok && holder == "" && releasedBy(terms, w.received) == w.pod:
				r.released++
				continue
			}
		}
		if w.resource == "events" && w.namespace == hwNamespace && strings.HasPrefix(w.name, watcherLease+".") &&
			holder != w.pod && previousHolder(terms, w.received) == w.pod {
			// client-go's leader election records an Event about the
			// Lease ("<pod> stopped leading") once its pod stops
			// renewing it, after giving it up: the last word of the
			// term that ended, about the Lease alone.
			r.stoppedLeading++
			continue
		}
		if !ok || holder != w.pod {
			r.wrong = append(r.wrong, wrongWrite{auditWrite: w, holder: holder})
			continue
		}
		if next := nextTermAfter(terms, w.received); !next.IsZero() && w.completed.After(next) {
			r.inFlight = append(r.inFlight, fmt.Sprintf("%s, the next term from %s", w, next.Format("15:04:05.000000")))
		}
	}
	return r
}

// releasedBy is the pod whose term came just before the released term
// (holder "") holding at.
func releasedBy(terms []leaseTerm, at time.Time) string {
	prev := ""
	for i, term := range terms {
		if term.acquired.After(at) {
			break
		}
		if i > 0 {
			prev = terms[i-1].pod
		}
	}
	return prev
}

// previousHolder is the pod that held the Lease last before the term
// holding at ("" if none did): the one whose term ended, through a
// release or not.
func previousHolder(terms []leaseTerm, at time.Time) string {
	current, prev := "", ""
	for _, term := range terms {
		if term.acquired.After(at) {
			break
		}
		if current != "" && term.pod != current {
			prev = current
		}
		if term.pod != "" {
			current = term.pod
		}
	}
	return prev
}

// checkAuditWriters fails t on any write of a watcher pod, by the audit
// log at path, that it made while it did not hold the Lease (by w's
// terms; attributeWrites).
func (w *writeLog) checkAuditWriters(t *testing.T, path string) {
	t.Helper()
	if path == "" {
		t.Fatal("the cluster keeps no audit log: cluster.Options.AuditPolicy unset")
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	writes, err := readAuditWrites(f)
	if err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	terms := append([]leaseTerm(nil), w.terms...)
	w.mu.Unlock()
	if keep := os.Getenv("HEADWATER_NODELOSS_AUDIT"); keep != "" {
		// The log and the terms, kept for a look after the run (the
		// cluster's directory goes with it).
		var b strings.Builder
		fmt.Fprintf(&b, "since\t%s\n", w.start.Format(time.RFC3339Nano))
		for _, term := range terms {
			fmt.Fprintf(&b, "%s\t%s\n", cmpOr(term.pod, "-"), term.acquired.Format(time.RFC3339Nano))
		}
		if _, err := f.Seek(0, io.SeekStart); err == nil {
			if data, err := io.ReadAll(f); err == nil {
				_ = os.WriteFile(keep, data, 0o644)
			}
		}
		_ = os.WriteFile(keep+".terms", []byte(b.String()), 0o644)
	}
	r := attributeWrites(writes, terms, w.start)
	for _, s := range r.wrong {
		t.Errorf("a write of a watcher pod that did not hold the Lease: %s", s)
	}
	if r.byResource["gitrepositories/status"] == 0 || r.byResource["events"] == 0 {
		t.Errorf("the audit log has no status write or no Event of the watcher since the watches began (%v): nothing to check the writers on", r.byResource)
	}
	t.Logf("audit log: %d writes of the watcher since the watches began, each by the Lease's holder when the API server received it (%d older not checked); by pod %v; by resource %s; its Lease writes refused (a standby's lost try) %d, giving it up %d; Events about the Lease by the pod whose term just ended (its stopped-leading Event) %d; in flight at a hand-over (received in the term, answered in the next) %d%s; other service accounts' writes %v",
		r.checked, r.before, r.byPod, sortedCounts(r.byResource), r.leaseRefused, r.released, r.stoppedLeading, len(r.inFlight), listed(r.inFlight), r.others)
}

func sortedCounts(m map[string]int) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, m[k])
	}
	return b.String()
}

func listed(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return ": " + strings.Join(s, "; ")
}
