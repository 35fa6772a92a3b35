// Package role is the artifact-server's main (Main), importable so that the artifact-server
// command and the headwater command (headwater -target=artifact-server) run the same
// service; the artifact-server command's documentation says what it does.
package role

import (
	"context"
	"flag"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/artifact-server/internal/httpserver"

	"github.com/headwater-gitops/headwater/services/artifact-server/internal/sink"
)

// service names the artifact-server on the bus, in logs and in metrics.
const service = "artifact-server"

// options are the artifact-server's flags; every flag can also be set from
// HEADWATER_<FLAG> (see package flagenv).
type options struct {
	bus       bus.Options
	storage   storage.Options
	telemetry telemetry.Options
	// addr is the HTTP listen address of the artifact file server.
	addr string
	// advAddr is the host[:port] put into artifact URLs.
	advAddr string
	// concurrency bounds the results announced at once.
	concurrency int
	// sinks are HTTP endpoints that also receive every public CloudEvent.
	sinks sink.URLs
	// limits bound the file server's requests and connections.
	limits httpserver.Limits
}

func (o *options) bindFlags(fs *flag.FlagSet) {
	o.bus.BindFlags(fs)
	o.storage.BindFlags(fs)
	o.telemetry.BindFlags(fs, ":9103")
	fs.StringVar(&o.addr, "storage-addr", ":9090", "Address the artifact file server listens on.")
	fs.StringVar(&o.advAddr, "storage-adv-addr", "",
		"Host[:port] put into artifact URLs (http://<addr>/<path>). Default: the -storage-addr, with an empty host "+
			"replaced by localhost and 0.0.0.0 or :: by this machine's hostname.")
	fs.IntVar(&o.concurrency, "concurrency", 8, "Job results announced at once.")
	d := httpserver.DefaultLimits
	fs.DurationVar(&o.limits.ReadHeaderTimeout, "read-header-timeout", d.ReadHeaderTimeout, "Time a client has to send a request's headers.")
	fs.DurationVar(&o.limits.ReadTimeout, "read-timeout", d.ReadTimeout, "Time a client has to send a whole request.")
	fs.DurationVar(&o.limits.WriteTimeout, "write-timeout", d.WriteTimeout,
		"Time to send a response, from the end of its request's headers: the largest artifact must reach its slowest consumer within it.")
	fs.DurationVar(&o.limits.IdleTimeout, "idle-timeout", d.IdleTimeout, "Time a kept-alive connection may stay idle between requests.")
	fs.IntVar(&o.limits.MaxConnections, "max-connections", d.MaxConnections,
		"Connections open at once; a client past them waits until one closes. 0 means no limit.")
	fs.Var(&o.sinks, "event-sink-url",
		"Deprecated: use a Subscription (events.headwater.dev), delivered with retries and signatures by the dispatcher. "+
			"HTTP endpoint that also receives every public CloudEvent (binary HTTP binding), best effort; repeatable or comma-separated.")
}

// Flags returns the role's flags as Main parses them (command.NewFlagSet),
// bound to options of their own: for tests and the flag reference
// (docs/flags.md).
func Flags() *flag.FlagSet {
	var o options
	return command.NewFlagSet(service, o.bindFlags)
}

// Main runs the artifact-server with args, the command line after the program's
// name (or after -target), and exits the process when it ends.
func Main(args []string) {
	var o options
	command.MainArgs(service, args, o.bindFlags, func() logr.Logger { return o.telemetry.NewLogger(service) },
		func(ctx context.Context) error { return run(ctx, o) })
}
