package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"

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
func run(ctx context.Context, o options) error {
	log := logr.FromContextOrDiscard(ctx)
	store, err := o.storage.OpenContext(ctx)
	if err != nil {
		return err
	}
	defer storage.Close(store)
	conn, err := bus.Connect(ctx, o.bus, service, log)
	if err != nil {
		return err
	}
	defer conn.Close()
	join := conn.Joiner(events.PublishStream, events.ArtifactServerConsumer, events.ConsumerOptions{})
	cons, err := join(ctx)
	if err != nil {
		return err
	}

	reg := telemetry.NewRegistry()
	telemetry.RegisterBuildInfo(reg, service)
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
	ann := &announce.Announcer{
		Publisher:  conn.NewPublisher(service),
		Service:    service,
		Advertised: advertised,
	}
	if len(o.sinks) > 0 {
		ann.Sink = sinks
	}
	worker := &bus.Worker{
		Service:     service,
		Consumer:    cons,
		Rejoin:      join,
		Concurrency: o.concurrency,
		Handler:     ann.Handle,
		Metrics:     telemetry.NewJobMetrics(reg, service),
		Log:         log.WithName("announce"),
	}

	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.addr, err)
	}
	srv := &http.Server{
		Handler:           httpserver.New(store, reg, log.WithName("http")),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ready telemetry.Checks
	ready.Set("nats", conn.Healthy)
	ready.Set("storage", storage.ReadyCheck(store, 5*time.Second))
	if err := telemetry.Serve(ctx, o.telemetry.Addr, reg, &ready, log); err != nil {
		_ = ln.Close()
		return err
	}

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

	workErr := worker.Run(ctx)
	cancel()
	log.Info("shutting down")
	<-sinksDone
	return errors.Join(workErr, <-serveErr)
}
