// Package bus connects Headwater services to NATS JetStream: the connection,
// the streams and consumers of package events, idempotent publishing of
// CloudEvents, and the bounded worker loop every consumer runs.
package bus

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// Options configure the connection to NATS.
type Options struct {
	// URL is the NATS server URL, or a comma-separated list of them.
	URL string
	// CredsFile is an optional NATS credentials (.creds) file.
	CredsFile string
}

// BindFlags registers the options on fs (environment: HEADWATER_NATS_URL,
// HEADWATER_NATS_CREDS, see package flagenv).
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.URL, "nats-url", nats.DefaultURL, "NATS server URL(s), comma-separated.")
	fs.StringVar(&o.CredsFile, "nats-creds", "", "Optional NATS credentials file.")
}

// Conn is a connection to NATS with its JetStream context.
type Conn struct {
	NC *nats.Conn
	JS jetstream.JetStream
}

// Connect dials NATS and keeps reconnecting for as long as the connection is
// in use; name identifies the service in the server's monitoring.
func Connect(ctx context.Context, o Options, name string, log logr.Logger) (*Conn, error) {
	opts := []nats.Option{
		nats.Name("headwater-" + name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Info("nats disconnected", "error", err.Error())
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrlRedacted()) }),
	}
	if o.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	var nc *nats.Conn
	var err error
	// The server may still be starting (a pod restart, a compose up): retry
	// the first connection until ctx ends.
	for {
		nc, err = nats.Connect(o.URL, opts...)
		if err == nil {
			break
		}
		log.Info("waiting for nats", "error", err.Error())
		select {
		case <-ctx.Done():
			// Wraps ctx's error too: a service stopped while waiting
			// has not failed.
			return nil, fmt.Errorf("connect to nats: %w (%w)", ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Conn{NC: nc, JS: js}, nil
}

// Close drains the connection so published messages are flushed.
func (c *Conn) Close() {
	if err := c.NC.Drain(); err != nil {
		c.NC.Close()
	}
}

// Healthy reports whether the connection is up; it is a readiness check.
func (c *Conn) Healthy() error {
	if !c.NC.IsConnected() {
		return errors.New("not connected to nats")
	}
	return nil
}

// EnsureStreams creates or updates every stream of events.Streams. Every
// service calls it at start-up, so no start order is needed.
func (c *Conn) EnsureStreams(ctx context.Context) error {
	for _, cfg := range events.Streams() {
		if _, err := c.JS.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// EnsureConsumer creates or updates a durable consumer on a stream.
func (c *Conn) EnsureConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	cons, err := c.JS.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s on %s: %w", cfg.Durable, stream, err)
	}
	return cons, nil
}

// JoinStream prepares a service's side of the bus: it creates or updates
// every stream (so services may start in any order) and the service's
// durable consumer on stream, configured by events.Consumer.
func (c *Conn) JoinStream(ctx context.Context, stream, consumer string, o events.ConsumerOptions) (jetstream.Consumer, error) {
	if err := c.EnsureStreams(ctx); err != nil {
		return nil, err
	}
	return c.EnsureConsumer(ctx, stream, events.Consumer(stream, consumer, o))
}
