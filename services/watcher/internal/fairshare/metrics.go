package fairshare

import (
	"cmp"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a slot is freed (headwater_fairshare_slots_released_total).
const (
	// ReleaseOutcome: the job's outcome arrived.
	ReleaseOutcome = "outcome"
	// ReleaseDeadline: no outcome within the slot timeout.
	ReleaseDeadline = "deadline"
	// ReleaseDeleted: the job's object was deleted.
	ReleaseDeleted = "deleted"
	// ReleaseLeaderLost: the watcher stopped leading.
	ReleaseLeaderLost = "leader_lost"
)

// TopNamespaces is how many namespaces headwater_fairshare_top_waiting_jobs
// names at most: the busiest, so the label's values stay bounded however
// many tenants there are.
const TopNamespaces = 5

// Metrics are the queue's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	inFlight   prometheus.Gauge
	waiting    prometheus.Gauge
	namespaces prometheus.Gauge
	topWaiting *prometheus.GaugeVec
	releases   *prometheus.CounterVec
	wait       prometheus.Histogram
	gateHeld   prometheus.Counter
	backlogs   *prometheus.GaugeVec
	readErrors prometheus.Counter
}

// NewMetrics registers the queue's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "headwater_fairshare_jobs_in_flight",
			Help: "Fetch jobs on the bus that hold a slot of their namespace (every namespace together).",
		}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "headwater_fairshare_waiting_jobs",
			Help: "Fetch jobs held in the watcher until their namespace has a free slot or the backlog gate lets them go (every namespace together).",
		}),
		namespaces: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "headwater_fairshare_waiting_namespaces",
			Help: "Namespaces with fetch jobs waiting for a slot.",
		}),
		topWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "headwater_fairshare_top_waiting_jobs",
			Help: "Fetch jobs waiting in the namespaces with the most waiting (at most 5 namespaces, updated every second).",
		}, []string{"namespace"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "headwater_fairshare_slots_released_total",
			Help: "Slots freed, by reason: outcome, deadline (no outcome in time), deleted (the object), leader_lost.",
		}, []string{"reason"}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "headwater_fairshare_wait_seconds",
			Help:    "Time a fetch job waited in the watcher for its namespace's slot or the backlog gate (0 for a job published at once).",
			Buckets: []float64{0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900},
		}),
		gateHeld: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "headwater_fairshare_gate_held_jobs_total",
			Help: "Fetch jobs held back in the watcher by the backlog gate: their namespace had a free slot and jobs in flight, and the fetch stream had -fair-share-fetch-backlog jobs undelivered (each job counted once).",
		}),
		backlogs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "headwater_fairshare_fetch_backlog",
			Help: "Fetch jobs no fetcher had taken (the fetch consumer's pending count), as last read by the backlog gate (read only while the gate holds jobs).",
		}, []string{"consumer"}),
		readErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "headwater_fairshare_fetch_backlog_read_errors_total",
			Help: "Failed readings of a fetch consumer's backlog; after one, the gate lets every job through for 5 s.",
		}),
	}
	reg.MustRegister(m.inFlight, m.waiting, m.namespaces, m.topWaiting, m.releases, m.wait, m.gateHeld, m.backlogs, m.readErrors)
	return m
}

func (m *Metrics) totals(inFlight, waiting, namespaces int) {
	if m == nil {
		return
	}
	m.inFlight.Set(float64(inFlight))
	m.waiting.Set(float64(waiting))
	m.namespaces.Set(float64(namespaces))
}

// top sets the waiting jobs of the TopNamespaces namespaces with the most.
func (m *Metrics) top(tenants map[string]*tenant) {
	if m == nil {
		return
	}
	type entry struct {
		ns string
		n  int
	}
	var all []entry
	for ns, t := range tenants {
		if n := t.waiting(); n > 0 {
			all = append(all, entry{ns, n})
		}
	}
	slices.SortFunc(all, func(a, b entry) int { return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.ns, b.ns)) })
	m.topWaiting.Reset()
	for _, e := range all[:min(len(all), TopNamespaces)] {
		m.topWaiting.WithLabelValues(e.ns).Set(float64(e.n))
	}
}

func (m *Metrics) released(reason string) {
	if m != nil {
		m.releases.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) admitted(waited time.Duration) {
	if m != nil {
		m.wait.Observe(waited.Seconds())
	}
}

func (m *Metrics) heldByGate() {
	if m != nil {
		m.gateHeld.Inc()
	}
}

func (m *Metrics) backlog(consumer string, n int) {
	if m != nil {
		m.backlogs.WithLabelValues(consumer).Set(float64(n))
	}
}

func (m *Metrics) backlogReadFailed() {
	if m != nil {
		m.readErrors.Inc()
	}
}
