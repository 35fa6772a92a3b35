package fetch

import "go.opentelemetry.io/otel"

// tracer makes the fetcher's spans from the global tracer provider (package
// tracing installs it when the service traces).
var tracer = otel.Tracer("github.com/headwater-gitops/headwater/services/fetcher")
