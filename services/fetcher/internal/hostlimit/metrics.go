package hostlimit

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// Metrics are the per-host families:
// headwater_fetch_host_requests_total{host} (requests sent),
// headwater_fetch_host_throttled_total{host,by} (requests not sent: by
// "host" while it is held, by "limit" when its bucket has no slot within
// the wait), headwater_fetch_host_retry_after_total{host,code} (answers
// asking to wait: the hold, and the retry after it, that follow) and
// headwater_fetch_host_wait_seconds_total{host} (time requests waited for
// a slot or for a hold to end) and headwater_fetch_host_resent_total{host}
// (requests sent again after a short hold the host asked for). A nil
// *Metrics records nothing.
type Metrics struct {
	requests    *prometheus.CounterVec
	throttles   *prometheus.CounterVec
	retryAfters *prometheus.CounterVec
	wait        *prometheus.CounterVec
	resends     *prometheus.CounterVec
	// seen holds the hosts whose series exist.
	seen sync.Map
}

// NewMetrics registers the families on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "fetch_host_requests_total",
			Help: "HTTP requests sent to upstream hosts, by host (a request that never reached its host, such as a failed TLS handshake, is not counted).",
		}, []string{"host"}),
		throttles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "fetch_host_throttled_total",
			Help: "HTTP requests not sent, by host and by what held them: host (it asked to wait with Retry-After) or limit (the fetcher's token bucket for it).",
		}, []string{"host", "by"}),
		retryAfters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "fetch_host_retry_after_total",
			Help: "Answers of upstream hosts asking to wait (429, or 503 with Retry-After), by host and status code; the source is retried when the host allows.",
		}, []string{"host", "code"}),
		wait: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "fetch_host_wait_seconds_total",
			Help: "Seconds HTTP requests waited for a slot of their host's token bucket or for its hold to end, by host.",
		}, []string{"host"}),
		resends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "fetch_host_resent_total",
			Help: "HTTP requests sent again, by host, after the host asked to wait (429, or 503 with Retry-After) for less than the fetcher's -rate-limit-max-wait.",
		}, []string{"host"}),
	}
	reg.MustRegister(m.requests, m.throttles, m.retryAfters, m.wait, m.resends)
	return m
}

func (m *Metrics) request(host string) {
	if m != nil {
		m.requests.WithLabelValues(host).Inc()
		m.see(host)
	}
}

// see makes every series of host, at zero, the first time a request to
// it goes: a dashboard or an alert then reads a rate from the start, not
// from the first refusal.
func (m *Metrics) see(host string) {
	if _, loaded := m.seen.LoadOrStore(host, true); loaded {
		return
	}
	m.throttles.WithLabelValues(host, "host")
	m.throttles.WithLabelValues(host, "limit")
	m.retryAfters.WithLabelValues(host, strconv.Itoa(http.StatusTooManyRequests))
	m.retryAfters.WithLabelValues(host, strconv.Itoa(http.StatusServiceUnavailable))
	m.wait.WithLabelValues(host)
	m.resends.WithLabelValues(host)
}

func (m *Metrics) throttled(host string, byHost bool) {
	if m == nil {
		return
	}
	by := "limit"
	if byHost {
		by = "host"
	}
	m.throttles.WithLabelValues(host, by).Inc()
}

func (m *Metrics) retryAfter(host string, code int) {
	if m != nil {
		m.retryAfters.WithLabelValues(host, strconv.Itoa(code)).Inc()
	}
}

func (m *Metrics) waited(host string, d time.Duration) {
	if m != nil {
		m.wait.WithLabelValues(host).Add(d.Seconds())
	}
}

func (m *Metrics) resent(host string) {
	if m != nil {
		m.resends.WithLabelValues(host).Inc()
	}
}
