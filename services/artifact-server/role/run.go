package role

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/telemetry"

	"github.com/headwater-gitops/headwater/services/artifact-server/internal/announce"
	"github.com/headwater-gitops/headwater/services/artifact-server/internal/httpserver"
	"github.com/headwater-gitops/headwater/services/artifact-server/internal/sink"
)

// shutdownTimeout bounds how long downloads in progress may finish after a
// stop signal.
const shutdownTimeout = 20 * time.Second

// run serves artifacts and announces results until ctx ends, then stops the
// announcer and lets downloads in progress finish. It logs with ctx's
// logger.
//
// Serving artifacts needs the storage alone: the endpoints and the
// artifact listener start before the service connects to NATS, and
// readiness follows the storage only, so a NATS outage leaves the artifact
// Service its endpoints. The bus, which only the announcements need, is
// reported by /readyz?verbose, headwater_bus_ready and the log.
func run(ctx context.Context, o options) error {
	log := logr.FromContextOrDiscard(ctx)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ep, err := bus.ServeEndpoints(ctx, o.telemetry.Addr, service, log, bus.EndpointOptions{Waiting: map[string]string{storage.ReadyName: "not opened yet"}, BusInformsOnly: true})
	if err != nil {
		return err
	}
	reg, ready, onBus := ep.Registry, ep.Ready, ep.Bus

	store, err := o.storage.OpenReady(ctx, log, ready)
	if err != nil {
		return err
	}
	defer storage.Close(store)

	sinks, err := sink.New(o.sinks, sink.Options{}, reg, log.WithName("sink"))
	if err != nil {
		return err
	}
	if len(o.sinks) > 0 {
		log.Info("-event-sink-url is deprecated: declare a Subscription (events.headwater.dev/v1alpha1) instead, which the dispatcher delivers with retries, signatures and dead letters")
	}
	advertised := o.advAddr
	if advertised == "" {
		advertised = httpserver.AdvertisedAddr(o.addr)
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.addr, err)
	}
	ln = o.limits.Listener(ln, reg)
	srv := o.limits.Server(httpserver.New(store, reg, log.WithName("http")))
	serveErr := make(chan error, 1)
	go func() {
		serveErr <- command.Serve(ctx, srv, ln, shutdownTimeout)
		cancel()
	}()
	sinksDone := make(chan struct{})
	go func() {
		defer close(sinksDone)
		sinks.Run(ctx)
	}()
	log.Info("serving artifacts", "addr", ln.Addr().String(), "advertised", advertised,
		"sinks", len(o.sinks), "concurrency", o.concurrency)

	ann := &announce.Announcer{Service: service, Advertised: advertised}
	if len(o.sinks) > 0 {
		ann.Sink = sinks
	}
	workErr := announceResults(ctx, o, ann, onBus, reg, log)
	cancel()
	log.Info("shutting down")
	<-sinksDone
	return errors.Join(workErr, <-serveErr)
}

// announceResults connects to NATS, retrying until it can (or
// -nats-connect-timeout passes), and announces the results of jobs with
// ann until ctx ends. It reports its way onto the bus to onBus.
func announceResults(ctx context.Context, o options, ann *announce.Announcer, onBus *bus.Status, reg *prometheus.Registry, log logr.Logger) error {
	conn, err := bus.Connect(ctx, o.bus, service, log, bus.ReportTo(onBus))
	if err != nil {
		return err
	}
	defer conn.Close()
	join := conn.Joiner(events.PublishStream, events.ArtifactServerConsumer, events.ConsumerOptions{})
	cons, err := join(ctx)
	if err != nil {
		return err
	}
	ann.Publisher = conn.NewPublisher(service)
	worker := &bus.Worker{
		Service:     service,
		Consumer:    cons,
		Rejoin:      join,
		Conn:        conn,
		Concurrency: o.concurrency,
		Handler:     ann.Handle,
		Metrics:     telemetry.NewJobMetrics(reg, service),
		Log:         log.WithName("announce"),
	}
	onBus.Up(conn)
	host, _ := os.Hostname()
	if err := ann.AnnounceAddress(conn.NC, fmt.Sprintf("%s/%d", host, time.Now().UnixNano())); err != nil {
		// The watchers learn it from the next artifact announced.
		log.Error(err, "announcing the advertised address")
	}
	log.Info("announcing results", "concurrency", o.concurrency)
	return worker.Run(ctx)
}
