package multinodetest

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/headwater-gitops/headwater/e2e/cluster"
)

// connSampler reads, twice a second, the node's connection tracking table
// for the TCP connections to a Service's address: which pod each was sent
// to (its DNAT) and its state. An entry outlives its connection: one never
// answered (SYN_SENT) for 120 s (nf_conntrack_tcp_timeout_syn_sent; a new
// SYN on it does not restart that, on this machine's 6.18 kernel), one
// closing (FIN_WAIT) 120 s after its last packet, ESTABLISHED for days;
// kube-proxy deletes none of a TCP Service's (it cleans UDP's only). A new
// connection from the same address and source port matches the entry and
// goes where it went, whatever the Service's rules say since: to a lost
// pod, if the entry was a connection to it (docs/operating.md, "A node is
// lost").
type connSampler struct {
	node    string
	service string // the Service's address, host:port
	mu      sync.Mutex
	// seen are the entries read, by source port, oldest first, all of
	// them: the report reads them after the run, minutes after a failure
	// (a few thousand a run).
	seen    map[int][]connEntry
	samples int
}

// connEntry is one tracked connection to the Service, as read.
type connEntry struct {
	firstSeen, lastSeen time.Time
	state               string
	timeout             int    // seconds left, as last read
	endpoint            string // the pod address it was sent to, host:port
	restarted           int    // reads that found its timeout started again
}

// sampleConns samples n's table for connections to service (host:port)
// until done is closed.
func sampleConns(n *cluster.Node, service string, done <-chan struct{}) *connSampler {
	c := &connSampler{node: n.Name, service: service, seen: map[int][]connEntry{}}
	host, port, _ := net.SplitHostPort(service)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(500 * time.Millisecond):
			}
			out, err := n.Command("cat", "/proc/net/nf_conntrack").Output()
			if err != nil {
				continue
			}
			c.observe(time.Now(), string(out), host, port)
		}
	}()
	return c
}

// observe takes one read of the table.
func (c *connSampler) observe(at time.Time, table, host, port string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.samples++
	for _, line := range strings.Split(table, "\n") {
		// ipv4 2 tcp 6 117 SYN_SENT src=A dst=SVC sport=P dport=80 [UNREPLIED] src=POD dst=A' sport=9090 dport=P' ...
		f := strings.Fields(line)
		if len(f) < 12 || f[2] != "tcp" {
			continue
		}
		kv := map[string][]string{}
		for _, w := range f[6:] {
			if k, v, ok := strings.Cut(w, "="); ok {
				kv[k] = append(kv[k], v)
			}
		}
		if len(kv["dst"]) < 2 || len(kv["src"]) < 2 || len(kv["sport"]) < 2 || len(kv["dport"]) < 1 {
			continue
		}
		if kv["dst"][0] != host || kv["dport"][0] != port {
			continue
		}
		timeout, err1 := strconv.Atoi(f[4])
		sport, err2 := strconv.Atoi(kv["sport"][0])
		if err1 != nil || err2 != nil {
			continue
		}
		endpoint := net.JoinHostPort(kv["src"][1], kv["sport"][1])
		hist := c.seen[sport]
		if n := len(hist); n > 0 && hist[n-1].endpoint == endpoint && at.Sub(hist[n-1].lastSeen) < 3*time.Second {
			e := &hist[n-1]
			if timeout > e.timeout+1 {
				e.restarted++
			}
			e.lastSeen, e.timeout, e.state = at, timeout, f[5]
			continue
		}
		c.seen[sport] = append(hist, connEntry{firstSeen: at, lastSeen: at, state: f[5], timeout: timeout, endpoint: endpoint})
	}
}

// staleAt returns the entry that a connection made at from source port
// sport met, if it was one to a pod other than ready's (the Service's
// ready endpoints then, by address): an entry read from before at until
// at least 1.5 s before it (reads are 0.5 s apart, and a read can take a
// while on a busy machine), so it was there when the connection's SYN left.
func (c *connSampler) staleAt(at time.Time, sport int, ready map[string]bool) (connEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.seen[sport] {
		host, _, _ := net.SplitHostPort(e.endpoint)
		if !e.firstSeen.After(at) && !e.lastSeen.Before(at.Add(-1500*time.Millisecond)) && !ready[host] {
			return e, true
		}
	}
	return connEntry{}, false
}

// at says what the table held for source port sport around at.
func (c *connSampler) at(at time.Time, sport int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sport == 0 {
		return fmt.Sprintf("connections tracked on %s: the connection's source port is not known", c.node)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "connections tracked on %s from source port %d to %s:", c.node, sport, c.service)
	n := 0
	for _, e := range c.seen[sport] {
		if e.lastSeen.Before(at.Add(-130*time.Second)) || e.firstSeen.After(at.Add(5*time.Second)) {
			continue
		}
		n++
		fmt.Fprintf(&b, " one sent to %s, read from %s to %s, last %s with %d s left (its timeout started again %d times);",
			e.endpoint, e.firstSeen.Format("15:04:05.000"), e.lastSeen.Format("15:04:05.000"), e.state, e.timeout, e.restarted)
	}
	if n == 0 {
		b.WriteString(" none read in the 130 s before it")
	}
	return b.String()
}

// summary says how many reads were made.
func (c *connSampler) summary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("connection tracking on %s read %d times", c.node, c.samples)
}
