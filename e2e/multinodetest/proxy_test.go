package multinodetest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/headwater-gitops/headwater/e2e/cluster"
	"github.com/headwater-gitops/headwater/e2e/promtext"
)

// proxySampler reads, every second, the metrics of a node's kube-proxy
// that say when it last wrote its Service rules: what a download that
// failed with the Service's endpoints healthy met on that node.
type proxySampler struct {
	node string
	mu   sync.Mutex
	seen []proxySample
}

// proxySample is kube-proxy's state as read at a moment.
type proxySample struct {
	at                   time.Time
	lastSync, lastQueued float64 // unix seconds
	pending, failures    float64
}

// sampleProxy samples n's kube-proxy until done is closed.
func sampleProxy(n *cluster.Node, done <-chan struct{}) *proxySampler {
	p := &proxySampler{node: n.Name}
	hc := n.HTTPClient()
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Second):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			body, err := get(ctx, hc, "http://127.0.0.1:10249/metrics")
			cancel()
			if err != nil {
				continue
			}
			ss, err := promtext.Parse(body)
			if err != nil {
				continue
			}
			s := proxySample{at: time.Now()}
			for _, m := range ss {
				// A series per IP family: the IPv4 proxier's timestamps are
				// the newest (no IPv6 here), the counts add up.
				switch m.Name {
				case "kubeproxy_sync_proxy_rules_last_timestamp_seconds":
					s.lastSync = max(s.lastSync, m.Value)
				case "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds":
					s.lastQueued = max(s.lastQueued, m.Value)
				case "kubeproxy_sync_proxy_rules_endpoint_changes_pending":
					s.pending += m.Value
				case "kubeproxy_sync_proxy_rules_iptables_restore_failures_total":
					s.failures += m.Value
				}
			}
			p.mu.Lock()
			p.seen = append(p.seen, s)
			p.mu.Unlock()
		}
	}()
	return p
}

// at says what kube-proxy reported last before at.
func (p *proxySampler) at(at time.Time) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var last *proxySample
	for i := range p.seen {
		if p.seen[i].at.After(at) {
			break
		}
		last = &p.seen[i]
	}
	if last == nil {
		return "kube-proxy on " + p.node + ": not read yet"
	}
	unix := func(f float64) string {
		if f == 0 {
			return "never"
		}
		return time.Unix(0, int64(f*1e9)).Format("15:04:05.000")
	}
	return fmt.Sprintf("kube-proxy on %s, read at %s: rules last written %s, a write last queued %s, %v endpoint changes pending, %v iptables-restore failures so far",
		p.node, last.at.Format("15:04:05.000"), unix(last.lastSync), unix(last.lastQueued), last.pending, last.failures)
}

// summary says how often kube-proxy wrote its rules while sampled, and
// its longest time without a write (a healthy one writes at least every
// syncPeriod, 30 s by default, whether anything changed or not).
func (p *proxySampler) summary() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.seen) == 0 {
		return "kube-proxy on " + p.node + ": never read"
	}
	writes := 0
	var last float64
	var gap time.Duration
	var gapFrom, gapTo time.Time
	for _, s := range p.seen {
		if s.lastSync != last {
			writes++
			last = s.lastSync
		}
		written := time.Unix(0, int64(last*1e9))
		if d := s.at.Sub(written); last != 0 && d > gap {
			gap, gapFrom, gapTo = d, written, s.at
		}
	}
	return fmt.Sprintf("kube-proxy on %s: %d rule writes seen in %d samples from %s to %s; the longest time without one: %s (from %s, still at %s)",
		p.node, writes, len(p.seen), p.seen[0].at.Format(time.TimeOnly), p.seen[len(p.seen)-1].at.Format(time.TimeOnly),
		gap.Round(time.Second), gapFrom.Format(time.TimeOnly), gapTo.Format(time.TimeOnly))
}
