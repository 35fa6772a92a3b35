// Command receiver is Headwater's webhook receiver: it serves Flux's
// /hook/<digest> endpoint for Receivers (notification.toolkit.fluxcd.io/v1),
// validates each request as Flux's notification-controller does, and
// publishes the hooks it accepts on the bus for the watcher, which turns
// them into fetch jobs. It is internet-facing, so it holds the least
// rights: it lists and watches Receivers, gets the one Secret a request
// needs, and may only publish hooks on the bus.
package main

import (
	"context"
	"flag"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// service names the receiver on the bus, in logs and in metrics.
const service = "receiver"

// options are the receiver's flags; every flag can also be set from
// HEADWATER_<FLAG> (see package flagenv).
type options struct {
	bus       bus.Options
	telemetry telemetry.Options
	// kubeconfig is the path to a kubeconfig; empty means $KUBECONFIG,
	// then in-cluster.
	kubeconfig string
	// addr is the listen address of the webhook endpoint.
	addr string
}

func (o *options) bindFlags(fs *flag.FlagSet) {
	o.bus.BindFlags(fs)
	o.telemetry.BindFlags(fs, ":9104")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig; default: $KUBECONFIG, then in-cluster.")
	fs.StringVar(&o.addr, "receiver-addr", ":9292", "Address the webhook endpoint (/hook/<digest>) listens on (Flux's port).")
}

func main() {
	var o options
	command.Main(service, o.bindFlags, func() logr.Logger { return o.telemetry.NewLogger(service) },
		func(ctx context.Context) error { return run(ctx, o) })
}
