package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// apiServerAgent is the product of kube-apiserver's own user agent: the
// requests it makes to itself (leases, its identity, CRD status).
const apiServerAgent = "kube-apiserver"

// auditEvent is the part of an audit event (audit.k8s.io/v1 Event) that
// countAuditRequests reads.
type auditEvent struct {
	AuditID         string    `json:"auditID"`
	UserAgent       string    `json:"userAgent"`
	RequestReceived time.Time `json:"requestReceivedTimestamp"`
}

// countAuditRequests counts the requests of an audit log (JSON lines) that
// the API server received in [from, to), by the product of their user
// agent (client-go's default agent starts with the binary's name:
// "watcher/v0.0.0 (linux/amd64) kubernetes/$Format"). A request logged at
// several stages (a watch: started, then complete) counts once.
func countAuditRequests(r io.Reader, from, to time.Time) (map[string]int64, error) {
	out := map[string]int64{}
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var ev auditEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			return nil, fmt.Errorf("audit log: %w", err)
		}
		if ev.RequestReceived.Before(from) || !ev.RequestReceived.Before(to) || seen[ev.AuditID] {
			continue
		}
		seen[ev.AuditID] = true
		out[agentProduct(ev.UserAgent)]++
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	return out, nil
}

// agentProduct is the product of a user agent: what comes before the
// first "/" ("(none)" for an empty one).
func agentProduct(ua string) string {
	if ua == "" {
		return "(none)"
	}
	product, _, _ := strings.Cut(ua, "/")
	return product
}

// benchAgent is the product of this process's user agent, as client-go
// makes it (rest.DefaultKubernetesUserAgent): its binary's name.
func benchAgent() string {
	return strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe")
}

// auditRequests reads the audit log at path and counts its requests
// received in [from, to) by user agent product.
func auditRequests(path string, from, to time.Time) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	defer f.Close()
	return countAuditRequests(f, from, to)
}

// SystemAPIRequests is the number of requests the system under test made to
// the API server during the measurement: every request of APIRequestsByAgent
// but the benchmark's own and the API server's to itself. ok is false when
// the requests were not counted.
func (m *Measurement) SystemAPIRequests() (n int64, ok bool) {
	if m.APIRequestsByAgent == nil {
		return 0, false
	}
	own := benchAgent()
	for agent, c := range m.APIRequestsByAgent {
		if agent != own && agent != apiServerAgent {
			n += c
		}
	}
	return n, true
}
