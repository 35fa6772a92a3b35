package packager

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// Metrics are the packager's own families, beside the shared job metrics:
// headwater_artifact_bytes, headwater_gc_deleted_total and
// headwater_content_cache_artifacts_total{operation},
// headwater_generated_artifacts_total{result} and
// headwater_latest_pointer_superseded_total.
type Metrics struct {
	// ArtifactBytes observes the size of every artifact written.
	ArtifactBytes prometheus.Histogram
	// GCDeleted counts the artifacts removed by retention.
	GCDeleted prometheus.Counter
	// Recorded counts the artifacts added to the content cache, Reused
	// the artifacts copied from it.
	Recorded, Reused prometheus.Counter
	// Generated counts the outputs of ArtifactGenerator jobs, by result:
	// changed (a new artifact stored) or unchanged (the previous kept).
	Generated *prometheus.CounterVec
	// LatestSuperseded counts the latest pointers a job left as they were
	// because a newer job had set them: an artifact stored late, or an
	// ArtifactGenerator output removed late.
	LatestSuperseded prometheus.Counter
}

// NewMetrics registers the packager's families on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ArtifactBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: telemetry.Namespace, Name: "artifact_bytes",
			Help: "Size in bytes of the artifacts written.",
			// 1 KiB to 1 GiB, by powers of four.
			Buckets: prometheus.ExponentialBuckets(1024, 4, 11),
		}),
		GCDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "gc_deleted_total",
			Help: "Artifacts deleted by retention garbage collection.",
		}),
	}
	cache := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Name: "content_cache_artifacts_total",
		Help: "Artifacts of the content cache, by operation: recorded (added after packaging fetched content) or reused (copied for a source instead of fetching).",
	}, []string{"operation"})
	m.Recorded, m.Reused = cache.WithLabelValues("recorded"), cache.WithLabelValues("reused")
	m.Generated = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Name: "generated_artifacts_total",
		Help: "Outputs of ArtifactGenerator jobs, by result: changed (a new artifact stored) or unchanged (the previous artifact kept).",
	}, []string{"result"})
	m.LatestSuperseded = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Name: "latest_pointer_superseded_total",
		Help: "Latest pointers left as they were because a job requested after the one moving (or, for an ArtifactGenerator output it no longer has, removing) them had set them: a late job, its packager cut off from the bus.",
	})
	reg.MustRegister(m.ArtifactBytes, m.GCDeleted, cache, m.Generated, m.LatestSuperseded)
	return m
}
