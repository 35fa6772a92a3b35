package bus

import (
	"context"
	"sort"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// Endpoints are what a service on the bus serves from the moment it
// starts, before it reaches storage, Kubernetes or NATS: /metrics from
// Registry (with headwater_build_info and headwater_bus_ready), /healthz,
// and /readyz from Ready, which already holds the bus's check (Bus).
type Endpoints struct {
	// Registry is the service's metric registry.
	Registry *prometheus.Registry
	// Ready are the readiness checks; replace a waiting one with Set once
	// what it waits for is up.
	Ready *telemetry.Checks
	// Bus is how far the service has got onto the bus: pass it to Connect
	// with ReportTo, and call its Up once the consumer is joined.
	Bus *Status
}

// EndpointOptions say what a service's readiness waits for.
type EndpointOptions struct {
	// Waiting names the checks that fail, with the reason given, until the
	// service sets them ("storage": "not opened yet").
	Waiting map[string]string
	// BusInformsOnly reports the bus in /readyz?verbose and the metric
	// without making the service unready while NATS is down: for the
	// artifact-server, which serves what is stored without the bus.
	BusInformsOnly bool
}

// ServeEndpoints serves service's endpoints on addr until ctx ends (an
// empty addr serves nothing, and the checks are still kept).
func ServeEndpoints(ctx context.Context, addr, service string, log logr.Logger, o EndpointOptions) (*Endpoints, error) {
	e := &Endpoints{Registry: telemetry.NewRegistry(), Ready: &telemetry.Checks{}, Bus: NewStatus()}
	telemetry.RegisterBuildInfo(e.Registry, service)
	e.Bus.Register(e.Registry, service)
	names := make([]string, 0, len(o.Waiting))
	for name := range o.Waiting {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		e.Ready.Set(name, telemetry.Pending(o.Waiting[name]))
	}
	if o.BusInformsOnly {
		e.Ready.Inform("nats", e.Bus.Check)
	} else {
		e.Ready.Set("nats", e.Bus.Check)
	}
	if err := telemetry.Serve(ctx, addr, e.Registry, e.Ready, log); err != nil {
		return nil, err
	}
	return e, nil
}
