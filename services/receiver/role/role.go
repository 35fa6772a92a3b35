// Package role is the receiver's main (Main), importable so that the receiver
// command and the headwater command (headwater -target=receiver) run the same
// service; the receiver command's documentation says what it does.
package role

import (
	"context"
	"flag"
	"time"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/signature"
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
	// hookRate and hookBurst bound each Receiver's requests.
	hookRate  float64
	hookBurst int
	// tolerance is the replay window of Headwater-signed requests.
	tolerance time.Duration
}

func (o *options) bindFlags(fs *flag.FlagSet) {
	o.bus.BindFlags(fs)
	o.telemetry.BindFlags(fs, ":9104")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig; default: $KUBECONFIG, then in-cluster.")
	fs.StringVar(&o.addr, "receiver-addr", ":9292", "Address the webhook endpoint (/hook/<digest>) listens on (Flux's port).")
	fs.Float64Var(&o.hookRate, "hook-rate", 10, "Requests per second each Receiver accepts on average; past -hook-burst the others are answered 429 before the token Secret is read. 0 means no limit.")
	fs.IntVar(&o.hookBurst, "hook-burst", 50, "Requests a Receiver accepts at once before -hook-rate applies.")
	fs.DurationVar(&o.tolerance, "signature-tolerance", signature.DefaultTolerance, "Replay window of generic-hmac requests signed by a Headwater dispatcher (X-Headwater-Signature-V2): a timestamp further from the clock is refused.")
}

// Flags returns the role's flags as Main parses them (command.NewFlagSet),
// bound to options of their own: for tests and the flag reference
// (docs/flags.md).
func Flags() *flag.FlagSet {
	var o options
	return command.NewFlagSet(service, o.bindFlags)
}

// Main runs the receiver with args, the command line after the program's
// name (or after -target), and exits the process when it ends.
func Main(args []string) {
	var o options
	command.MainArgs(service, args, o.bindFlags, func() logr.Logger { return o.telemetry.NewLogger(service) },
		func(ctx context.Context) error { return run(ctx, o) })
}
