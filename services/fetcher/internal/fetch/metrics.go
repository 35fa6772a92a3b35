package fetch

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// Results of a fetch, the result label of the fetch metrics.
const (
	ResultFetched   = "fetched"
	ResultUnchanged = "unchanged"
	ResultFailed    = "failed"
	// ResultQuiet: unchanged, for a steady source's quiet job
	// (events.FetchRequested.Quiet): nothing was published.
	ResultQuiet = "quiet"
	// ResultReused: the content cache held the content; nothing was
	// downloaded.
	ResultReused = "reused"
	// ResultJoined: another fetch of the same content was under way in
	// this fetcher or another replica; its staged content was copied,
	// nothing downloaded.
	ResultJoined = "joined"
)

// Metrics are the fetcher's own families:
// headwater_fetch_duration_seconds{kind,result},
// headwater_fetch_bytes_total{kind} and
// headwater_fetch_combined_total{outcome}.
type Metrics struct {
	duration *prometheus.HistogramVec
	bytes    *prometheus.CounterVec
	combined *prometheus.CounterVec
}

// NewMetrics registers the fetch families on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: telemetry.Namespace, Name: "fetch_duration_seconds",
			Help:    "Time to fetch one source, from resolving its revision to staging its content, by kind and result (fetched, reused, joined, unchanged, quiet, failed).",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"kind", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "fetch_bytes_total",
			Help: "Bytes of content staged for packaging, by kind.",
		}, []string{"kind"}),
		combined: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "fetch_combined_total",
			Help: "Fetches of content that may be shared, by how they combined with identical fetches in flight: " +
				"led (downloaded for all replicas), followed-local, followed-remote (copied what another fetch staged), " +
				"leader-failed, lease-expired, bypassed (downloaded alone).",
		}, []string{"outcome"}),
	}
	reg.MustRegister(m.duration, m.bytes, m.combined)
	return m
}

// countCombined counts how a fetch combined with identical fetches in
// flight (Combine*); m may be nil.
func (m *Metrics) countCombined(outcome string) {
	if m != nil && outcome != "" {
		m.combined.WithLabelValues(outcome).Inc()
	}
}
