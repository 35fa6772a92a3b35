// Package role is the packager's main (Main), importable so that the packager
// command and the headwater command (headwater -target=packager) run the same
// service; the packager command's documentation says what it does.
package role

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/packager/internal/housekeeping"
	"github.com/headwater-gitops/headwater/services/packager/internal/packager"
)

// service names the packager on the bus, in logs and in metrics.
const service = "packager"

// options are the packager's flags; every flag can also be set from
// HEADWATER_<FLAG> (see package flagenv).
type options struct {
	bus         bus.Options
	storage     storage.Options
	telemetry   telemetry.Options
	packager    packager.Options
	concurrency int
	maxAttempts int
	stagingTTL  time.Duration
	jobTimeout  time.Duration
}

func (o *options) bindFlags(fs *flag.FlagSet) {
	o.bus.BindFlags(fs)
	o.storage.BindFlags(fs)
	o.telemetry.BindFlags(fs, ":9102")
	o.packager.BindFlags(fs)
	fs.IntVar(&o.concurrency, "concurrency", 2, "Jobs packaged at once by this replica.")
	fs.IntVar(&o.maxAttempts, "max-attempts", events.DefaultMaxDeliver, "Attempts of a job that keeps failing transiently before its failure is final.")
	fs.DurationVar(&o.jobTimeout, "job-timeout", bus.DefaultJobTimeout,
		"The deadline of one job (packaging a fetch, building an ArtifactGenerator's outputs): past it the job fails with DeadlineExceeded and its slot serves the next.")
	fs.DurationVar(&o.stagingTTL, "staging-ttl", time.Hour,
		"Age after which staged content no pending job refers to, and the temporary file of a write its writer abandoned (directory storage), are removed; 0 disables the janitor.")
}

// Flags returns the role's flags as Main parses them (command.NewFlagSet),
// bound to options of their own: for tests and the flag reference
// (docs/flags.md).
func Flags() *flag.FlagSet {
	var o options
	return command.NewFlagSet(service, o.bindFlags)
}

// Main runs the packager with args, the command line after the program's
// name (or after -target), and exits the process when it ends.
func Main(args []string) {
	var o options
	command.MainArgs(service, args, o.bindFlags, func() logr.Logger { return o.telemetry.NewLogger(service) },
		func(ctx context.Context) error { return run(ctx, o) })
}

// run builds the packager's parts and handles jobs until ctx ends; it logs
// with ctx's logger.
func run(ctx context.Context, o options) error {
	if err := o.packager.Validate(); err != nil {
		return err
	}
	if o.concurrency < 1 {
		return errors.New("--concurrency must be at least 1")
	}
	if o.maxAttempts < 1 {
		return errors.New("--max-attempts must be at least 1")
	}
	if o.jobTimeout <= 0 {
		return errors.New("--job-timeout must be positive")
	}
	log := logr.FromContextOrDiscard(ctx)

	// The endpoints answer before the service reaches storage and NATS:
	// alive at once, ready once both are up (see package telemetry). They
	// stop when run returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ep, err := bus.ServeEndpoints(ctx, o.telemetry.Addr, service, log, bus.EndpointOptions{Waiting: map[string]string{storage.ReadyName: "not opened yet"}})
	if err != nil {
		return err
	}
	reg, ready, onBus := ep.Registry, ep.Ready, ep.Bus

	store, err := o.storage.OpenReady(ctx, log, ready)
	if err != nil {
		return err
	}
	defer storage.Close(store)
	conn, err := bus.Connect(ctx, o.bus, service, log, bus.ReportTo(onBus))
	if err != nil {
		return err
	}
	defer conn.Close()
	join := conn.Joiner(events.PackageStream, events.PackagerConsumer, events.ConsumerOptions{MaxDeliver: o.maxAttempts})
	consumer, err := join(ctx)
	if err != nil {
		return err
	}
	stream, err := conn.JS.Stream(ctx, events.PackageStream)
	if err != nil {
		return fmt.Errorf("package stream: %w", err)
	}
	onBus.Up(conn)

	janitor := &housekeeping.Janitor{
		Store:      store,
		StagingTTL: o.stagingTTL,
		CacheTTL:   o.packager.ContentCacheTTL,
		Pending:    housekeeping.StreamPending(stream, housekeeping.DefaultScanLimit),
		Log:        log.WithName("housekeeping"),
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { janitor.Run(ctx) })

	p := packager.New(store, conn.NewPublisher(service), o.packager, packager.NewMetrics(reg))
	worker := &bus.Worker{
		Service:     service,
		Consumer:    consumer,
		Rejoin:      join,
		Conn:        conn,
		Concurrency: o.concurrency,
		Handler:     p.Handle,
		Report:      p.Report,
		JobTimeout:  o.jobTimeout,
		// A job past its deadline fails as its kind's failures do.
		DeadlineCondition: packager.DeadlineCondition,
		Metrics:           telemetry.NewJobMetrics(reg, service),
		Log:               log,
	}
	log.Info("packaging", "concurrency", o.concurrency, "digest", o.packager.DigestAlgo,
		"contentCacheTTL", o.packager.ContentCacheTTL.String())
	return worker.Run(ctx)
}
