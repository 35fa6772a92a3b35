// Package bus connects Headwater services to NATS JetStream: the connection,
// the streams and consumers of package events, idempotent publishing of
// CloudEvents, and the bounded worker loop every consumer runs.
package bus

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
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
	// ConnectTimeout bounds how long Connect keeps trying to reach NATS
	// the first time; 0 tries until the service is stopped.
	ConnectTimeout time.Duration
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
	fs.DurationVar(&o.ConnectTimeout, "nats-connect-timeout", 0,
		"How long to keep trying to reach NATS at start-up before giving up; 0 tries until the service is stopped. The health endpoints answer meanwhile, /readyz saying why it waits.")
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
	// log and status are Connect's, for the waits of EnsureStreams.
	log    logr.Logger
	status *Status
}

// ConnectOption changes how Connect connects.
type ConnectOption func(*connectConfig)

// connectConfig is what the ConnectOptions set.
type connectConfig struct {
	status *Status
}

// ReportTo makes Connect report each attempt of its first connection to s,
// the service's readiness check.
func ReportTo(s *Status) ConnectOption {
	return func(c *connectConfig) { c.status = s }
}

// maxConnectWait caps the wait between two attempts of the first
// connection: a NATS server that comes up late is found within it.
const maxConnectWait = 5 * time.Second

// PingInterval is how often a connection pings its server, and
// MaxPingsOutstanding how many pings may go unanswered before the
// connection is taken for dead and the client reconnects (to another server
// of a cluster): a lost server is noticed within StaleAfter.
const (
	PingInterval        = 10 * time.Second
	MaxPingsOutstanding = 3
	StaleAfter          = PingInterval * (MaxPingsOutstanding + 1)
)

// Connect dials NATS and keeps reconnecting for as long as the connection is
// in use; identity names the service in the server's monitoring and is the
// bus identity it acts as (events.Identities): its replies come on its own
// inbox (events.InboxPrefix), and it updates only the stream it owns.
//
// The server may still be starting (a pod restart, a compose up, a NATS
// pod scheduled last), so the first connection is tried again, with a
// backoff of 1s doubling up to 5s, each failure logged, until ctx ends or
// Options.ConnectTimeout passes. With ReportTo, each attempt's outcome is
// what the service's readiness check says.
func Connect(ctx context.Context, o Options, identity string, log logr.Logger, opts ...ConnectOption) (*Conn, error) {
	var cfg connectConfig
	for _, opt := range opts {
		opt(&cfg)
	}
	if o.StreamReplicas < 0 || o.StreamReplicas > maxStreamReplicas {
		return nil, fmt.Errorf("nats: -nats-stream-replicas %d: want 1 to %d", o.StreamReplicas, maxStreamReplicas)
	}
	if o.ConnectTimeout < 0 {
		return nil, fmt.Errorf("nats: -nats-connect-timeout %s: must not be negative", o.ConnectTimeout)
	}
	auth, err := o.natsOptions()
	if err != nil {
		return nil, err
	}
	natsOpts := []nats.Option{
		nats.Name("headwater-" + identity),
		nats.CustomInboxPrefix(events.InboxPrefix(identity)),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		// A server whose node is lost answers nothing, not even a
		// reset: only unanswered pings tell. The client's defaults (a
		// ping every 2 minutes, 2 unanswered) kept a service on a dead
		// connection for minutes; these notice within StaleAfter.
		nats.PingInterval(PingInterval),
		nats.MaxPingsOutstanding(MaxPingsOutstanding),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Info("nats disconnected", "error", err.Error())
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrlRedacted()) }),
	}
	natsOpts = append(natsOpts, auth...)
	url := RedactURLs(o.URL)
	var giveUp <-chan time.Time
	if o.ConnectTimeout > 0 {
		t := time.NewTimer(o.ConnectTimeout)
		defer t.Stop()
		giveUp = t.C
	}
	var nc *nats.Conn
	for attempt := uint64(1); ; attempt++ {
		nc, err = nats.Connect(o.URL, natsOpts...)
		if err == nil {
			break
		}
		err = &connectError{url: url, err: err}
		cfg.status.set(err)
		wait := min(Backoff(attempt), maxConnectWait)
		log.Info("waiting for nats", "url", url, "attempt", attempt, "retryIn", wait.String(), "error", err.Error())
		select {
		case <-ctx.Done():
			// Wraps ctx's error too: a service stopped while waiting
			// has not failed.
			return nil, fmt.Errorf("connect to nats: %w (%w)", ctx.Err(), err)
		case <-giveUp:
			return nil, fmt.Errorf("nats: gave up after -nats-connect-timeout %s: %w", o.ConnectTimeout, err)
		case <-time.After(wait):
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	log.Info("connected to nats", "url", nc.ConnectedUrlRedacted())
	cfg.status.set(errJoining)
	return &Conn{NC: nc, JS: js, identity: identity, streamReplicas: o.StreamReplicas, log: log, status: cfg.status}, nil
}

// connectError is a failed attempt to connect to NATS: its message names
// the URLs without credentials, and carries no URL the error itself quotes
// with them.
type connectError struct {
	url string
	err error
}

func (e *connectError) Error() string {
	return "connecting to " + e.url + ": " + failure.Redact(e.err.Error())
}

func (e *connectError) Unwrap() error { return e.err }

// RedactURLs returns a comma-separated list of NATS URLs (-nats-url)
// without user-info, query strings and fragments: fit for a log or an
// error.
func RedactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, u := range parts {
		parts[i] = failure.RedactURL(strings.TrimSpace(u))
	}
	return strings.Join(parts, ",")
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

// EnsureStreams creates the streams the connection's identity publishes to
// or consumes (events.StreamsOf) that do not exist, updates those it owns
// (events.StreamOwner), and creates or updates the key-value buckets it
// owns (events.Buckets). Every service calls it at start-up, so no start
// order is needed, while only a stream's consumer may change its
// configuration (its replicas included: raising -nats-stream-replicas on a
// cluster scales the streams up as their owners restart). A stream no
// deployed component uses is not made.
//
// A JetStream that is not serving yet (a cluster still electing its meta
// leader, a server that has not enabled JetStream yet) is waited for, with
// each attempt logged and reported to the service's readiness; a refusal
// (a permission, a bad configuration) fails at once.
func (c *Conn) EnsureStreams(ctx context.Context) error {
	return c.untilJetStream(ctx, c.ensureStreams)
}

func (c *Conn) ensureStreams(ctx context.Context) error {
	for _, name := range events.StreamsOf(c.identity) {
		if err := c.ensureStream(ctx, name); err != nil {
			return err
		}
	}
	return c.ensureBuckets(ctx)
}

// ensureStream creates the stream of events.Streams named name if it does
// not exist, or updates it if the connection's identity owns it.
func (c *Conn) ensureStream(ctx context.Context, name string) error {
	i := slices.IndexFunc(events.Streams(c.streamReplicas), func(cfg jetstream.StreamConfig) bool { return cfg.Name == name })
	if i < 0 {
		return fmt.Errorf("ensure stream %s: not a Headwater stream", name)
	}
	cfg := events.Streams(c.streamReplicas)[i]
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
	return nil
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
// the streams it uses (EnsureStreams, so services may start in any order)
// and stream itself, one of its optional streams included, and the
// service's durable consumer on stream, configured by events.Consumer.
// Unless o says otherwise, the consumer takes the subjects
// events.ConsumerFilter gives the connection's identity on stream (a
// fetcher only its kinds' jobs).
func (c *Conn) JoinStream(ctx context.Context, stream, consumer string, o events.ConsumerOptions) (jetstream.Consumer, error) {
	if err := c.EnsureStreams(ctx); err != nil {
		return nil, err
	}
	if len(o.FilterSubjects) == 0 {
		o.FilterSubjects = events.ConsumerFilter(c.identity, stream)
	}
	var cons jetstream.Consumer
	err := c.untilJetStream(ctx, func(ctx context.Context) (err error) {
		if !slices.Contains(events.StreamsOf(c.identity), stream) {
			if err := c.ensureStream(ctx, stream); err != nil {
				return err
			}
		}
		cons, err = c.EnsureConsumer(ctx, stream, events.Consumer(stream, consumer, o))
		return err
	})
	return cons, err
}

// WaitForStream returns once stream exists, or with ctx's error: it looks
// at once, when JetStream announces the stream's creation
// (events.StreamCreatedAdvisory), and every recheck (a backstop for an
// announcement missed while disconnected). A service waits so for an
// optional stream, made by the component that feeds it, before joining
// it; while it waits, it costs the bus nothing but the rechecks.
func (c *Conn) WaitForStream(ctx context.Context, stream string, recheck time.Duration) error {
	created := make(chan *nats.Msg, 1)
	sub, err := c.NC.ChanSubscribe(events.StreamCreatedAdvisory(stream), created)
	if err != nil {
		return fmt.Errorf("listen for the creation of stream %s: %w", stream, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	t := time.NewTicker(recheck)
	defer t.Stop()
	for {
		// The subscription is in place before the look, so a stream
		// created in between is announced.
		found, err := c.streamExists(ctx, sub, stream)
		if found {
			return nil
		}
		if err != nil && ctx.Err() == nil {
			c.log.V(1).Info("looking for a stream failed", "stream", stream, "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-created:
		case <-t.C:
		}
	}
}

// streamExists tells whether stream exists, once the server has the
// subscription sub.
func (c *Conn) streamExists(ctx context.Context, sub *nats.Subscription, stream string) (bool, error) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.NC.FlushWithContext(lctx); err != nil {
		return false, fmt.Errorf("subscribe to %s: %w", sub.Subject, err)
	}
	_, err := c.JS.Stream(lctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, nil
	}
	return err == nil, err
}

// untilJetStream runs fn until it succeeds, fails for another reason than
// a JetStream that does not serve yet, or ctx ends, waiting between
// attempts as Connect does.
func (c *Conn) untilJetStream(ctx context.Context, fn func(context.Context) error) error {
	for attempt := uint64(1); ; attempt++ {
		err := fn(ctx)
		if err == nil || ctx.Err() != nil || !jetStreamUnavailable(err) {
			return err
		}
		c.status.set(fmt.Errorf("waiting for jetstream: %w", err))
		wait := min(Backoff(attempt), maxConnectWait)
		c.log.Info("waiting for jetstream", "attempt", attempt, "retryIn", wait.String(), "error", err.Error())
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (%w)", ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// jetStreamUnavailable tells whether err says JetStream does not serve yet
// (or for a moment): no responder, a timeout, a 503, or a cluster with no
// peers to place a stream on while it forms.
func jetStreamUnavailable(err error) bool {
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code == 503 || apiErr.ErrorCode == jsErrCodeClusterNoPeers
	}
	return false
}

// jsErrCodeClusterNoPeers is JetStream's "no suitable peers for
// placement", which a cluster answers until enough servers have joined.
const jsErrCodeClusterNoPeers jetstream.ErrorCode = 10005
