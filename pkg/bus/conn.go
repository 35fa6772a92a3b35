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
	// CredsFile is an optional NATS credentials (.creds, JWT) file.
	CredsFile string
	// NKeyFile is an optional file holding the NKey seed of the service's
	// NATS user (see events.Permissions for what each user may do).
	NKeyFile string
	// CAFile, when set, is the CA that signs the server's TLS
	// certificate; the connection then requires TLS.
	CAFile string
	// CertFile and KeyFile are an optional client certificate for TLS.
	CertFile, KeyFile string
	// StreamReplicas is how many copies of each stream the service creates
	// (events.Streams): 1 on a single server, 3 on a clustered NATS.
	StreamReplicas int
}

// BindFlags registers the options on fs (environment: HEADWATER_NATS_URL,
// HEADWATER_NATS_CREDS, HEADWATER_NATS_NKEY, ..., see package flagenv).
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.URL, "nats-url", nats.DefaultURL, "NATS server URL(s), comma-separated.")
	fs.StringVar(&o.CredsFile, "nats-creds", "", "NATS credentials (.creds) file of the service's user.")
	fs.StringVar(&o.NKeyFile, "nats-nkey", "", "File holding the NKey seed of the service's NATS user.")
	fs.StringVar(&o.CAFile, "nats-ca", "", "CA certificate of the NATS server's TLS certificate; requires TLS when set.")
	fs.StringVar(&o.CertFile, "nats-cert", "", "Client certificate for TLS to NATS.")
	fs.StringVar(&o.KeyFile, "nats-key", "", "Private key of the client certificate for TLS to NATS.")
	fs.IntVar(&o.StreamReplicas, "nats-stream-replicas", 1,
		"Copies of each JetStream stream: 1 on a single NATS server, 3 on a 3-node cluster (at most 5). Every service must be given the same value.")
}

// natsOptions returns the authentication and TLS options of o.
func (o *Options) natsOptions() ([]nats.Option, error) {
	var opts []nats.Option
	if o.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if o.NKeyFile != "" {
		opt, err := nats.NkeyOptionFromSeed(o.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("nats nkey: %w", err)
		}
		opts = append(opts, opt)
	}
	if o.CAFile != "" {
		opts = append(opts, nats.RootCAs(o.CAFile))
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, errors.New("nats: a client certificate needs both --nats-cert and --nats-key")
	}
	if o.CertFile != "" {
		opts = append(opts, nats.ClientCert(o.CertFile, o.KeyFile))
	}
	return opts, nil
}

// Conn is a connection to NATS with its JetStream context.
type Conn struct {
	NC *nats.Conn
	JS jetstream.JetStream
	// identity is the bus identity the connection acts as.
	identity string
	// streamReplicas is Options.StreamReplicas.
	streamReplicas int
}

// Connect dials NATS and keeps reconnecting for as long as the connection is
// in use; identity names the service in the server's monitoring and is the
// bus identity it acts as (events.Identities): its replies come on its own
// inbox (events.InboxPrefix), and it updates only the stream it owns.
func Connect(ctx context.Context, o Options, identity string, log logr.Logger) (*Conn, error) {
	if o.StreamReplicas < 0 || o.StreamReplicas > maxStreamReplicas {
		return nil, fmt.Errorf("nats: -nats-stream-replicas %d: want 1 to %d", o.StreamReplicas, maxStreamReplicas)
	}
	auth, err := o.natsOptions()
	if err != nil {
		return nil, err
	}
	opts := []nats.Option{
		nats.Name("headwater-" + identity),
		nats.CustomInboxPrefix(events.InboxPrefix(identity)),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Info("nats disconnected", "error", err.Error())
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrlRedacted()) }),
	}
	opts = append(opts, auth...)
	var nc *nats.Conn
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
	return &Conn{NC: nc, JS: js, identity: identity, streamReplicas: o.StreamReplicas}, nil
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

// maxStreamReplicas is the most copies of a stream JetStream keeps.
const maxStreamReplicas = 5

// EnsureStreams creates every stream of events.Streams that does not exist
// and updates the one the connection's identity owns (events.StreamOwner),
// and creates or updates the key-value buckets it owns (events.Buckets).
// Every service calls it at start-up, so no start order is needed, while
// only a stream's consumer may change its configuration (its replicas
// included: raising -nats-stream-replicas on a cluster scales the streams
// up as their owners restart).
func (c *Conn) EnsureStreams(ctx context.Context) error {
	for _, cfg := range events.Streams(c.streamReplicas) {
		var err error
		if events.StreamOwner(cfg.Name) == c.identity {
			_, err = c.JS.CreateOrUpdateStream(ctx, cfg)
		} else if _, err = c.JS.CreateStream(ctx, cfg); errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// It exists; its owner keeps its configuration current.
			err = nil
		}
		if err != nil {
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
		}
	}
	return c.ensureBuckets(ctx)
}

// ensureBuckets creates or updates the key-value buckets of events.Buckets
// that the connection's identity owns (events.BucketOwner): no other
// identity may touch them.
func (c *Conn) ensureBuckets(ctx context.Context) error {
	for _, cfg := range events.Buckets(c.streamReplicas) {
		if events.BucketOwner(cfg.Bucket) != c.identity {
			continue
		}
		if _, err := c.JS.CreateOrUpdateKeyValue(ctx, cfg); err != nil {
			return fmt.Errorf("ensure key-value bucket %s: %w", cfg.Bucket, err)
		}
	}
	return nil
}

// EnsureConsumer creates or updates a durable consumer on a stream. A work
// queue's consumer that keeps its state elsewhere than cfg says (on disk,
// as a former release made it; JetStream cannot change that in place) is
// deleted and created again: its messages stay in the stream, and the
// ones it had delivered are delivered again.
func (c *Conn) EnsureConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	cons, err := c.JS.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil && events.IsWorkQueue(stream) {
		old, gerr := c.JS.Consumer(ctx, stream, cfg.Durable)
		if gerr == nil && old.CachedInfo().Config.MemoryStorage != cfg.MemoryStorage {
			if err = c.JS.DeleteConsumer(ctx, stream, cfg.Durable); err == nil {
				cons, err = c.JS.CreateOrUpdateConsumer(ctx, stream, cfg)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s on %s: %w", cfg.Durable, stream, err)
	}
	return cons, nil
}

// Joiner returns JoinStream for stream, consumer and o as a function, for
// a Worker's Rejoin: it joins at start and again if the consumer is lost.
func (c *Conn) Joiner(stream, consumer string, o events.ConsumerOptions) func(context.Context) (jetstream.Consumer, error) {
	return func(ctx context.Context) (jetstream.Consumer, error) {
		return c.JoinStream(ctx, stream, consumer, o)
	}
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
