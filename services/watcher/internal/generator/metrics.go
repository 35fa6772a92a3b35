package generator

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// Metrics count the generators' jobs and outcomes:
// headwater_artifactgenerator_reconciles_total{result}.
type Metrics struct {
	results *prometheus.CounterVec
}

// NewMetrics registers the generator's families on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{results: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Name: "artifactgenerator_reconciles_total",
		Help: "ArtifactGenerator reconciles and outcomes, by result: published (a job), problem (a spec or source problem, no job), stored, failed, stale (an outcome for sources since changed, ignored).",
	}, []string{"result"})}
	reg.MustRegister(m.results)
	return m
}

func (m *Metrics) count(result string) {
	if m == nil {
		return
	}
	m.results.WithLabelValues(result).Inc()
}
