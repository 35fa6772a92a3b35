// Command packager turns the content fetchers stage into artifacts: it reads
// Fetched and DeleteRequested jobs from the package stream, writes canonical
// tar.gz artifacts with their digest to the shared storage, keeps the latest
// pointer and the retention policy, and publishes the results.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/flagenv"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/packager/internal/housekeeping"
	"github.com/headwater-gitops/headwater/services/packager/internal/packager"
)

const service = "packager"

// options are the packager's flags.
type options struct {
	bus         bus.Options
	storage     storage.Options
	telemetry   telemetry.Options
	packager    packager.Options
	concurrency int
	maxAttempts int
	stagingTTL  time.Duration
}

func (o *options) bindFlags(fs *flag.FlagSet) {
	o.bus.BindFlags(fs)
	o.storage.BindFlags(fs)
	o.telemetry.BindFlags(fs, ":9102")
	o.packager.BindFlags(fs)
	fs.IntVar(&o.concurrency, "concurrency", 2, "Jobs packaged at once by this replica.")
	fs.IntVar(&o.maxAttempts, "max-attempts", events.DefaultMaxDeliver, "Attempts of a job that keeps failing transiently before its failure is final.")
	fs.DurationVar(&o.stagingTTL, "staging-ttl", time.Hour,
		"Age after which staged content no pending job refers to is removed; 0 disables the janitor.")
}

func main() {
	fs := flag.NewFlagSet(service, flag.ExitOnError)
	var o options
	o.bindFlags(fs)
	if err := flagenv.Parse(fs, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	log := o.telemetry.NewLogger(service)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log, telemetry.NewRegistry()); err != nil {
		log.Error(err, "packager stopped")
		os.Exit(1)
	}
}

// run builds the packager's parts and handles jobs until ctx ends.
func run(ctx context.Context, o options, log logr.Logger, reg *prometheus.Registry) error {
	if err := o.packager.Validate(); err != nil {
		return err
	}
	if o.concurrency < 1 {
		return errors.New("--concurrency must be at least 1")
	}
	if o.maxAttempts < 1 {
		return errors.New("--max-attempts must be at least 1")
	}
	store, err := o.storage.OpenContext(ctx)
	if err != nil {
		return err
	}
	if c, ok := store.(io.Closer); ok {
		defer c.Close()
	}
	conn, err := bus.Connect(ctx, o.bus, service, log)
	if err != nil {
		return err
	}
	defer conn.Close()
	consumer, err := conn.JoinStream(ctx, events.PackageStream, events.PackagerConsumer, events.ConsumerOptions{MaxDeliver: o.maxAttempts})
	if err != nil {
		return err
	}
	stream, err := conn.JS.Stream(ctx, events.PackageStream)
	if err != nil {
		return fmt.Errorf("package stream: %w", err)
	}
	if err := telemetry.Serve(ctx, o.telemetry.Addr, reg, map[string]telemetry.Check{"nats": conn.Healthy}, log); err != nil {
		return err
	}

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
		Concurrency: o.concurrency,
		Handler:     p.Handle,
		Report:      p.Report,
		Metrics:     telemetry.NewJobMetrics(reg, service),
		Log:         log,
	}
	log.Info("packaging", "concurrency", o.concurrency, "digest", o.packager.DigestAlgo,
		"contentCacheTTL", o.packager.ContentCacheTTL.String())
	return worker.Run(ctx)
}
