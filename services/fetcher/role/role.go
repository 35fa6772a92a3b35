// Package role is the fetcher's main (Main), importable so that the fetcher
// command and the headwater command (headwater -target=fetcher) run the same
// service; the fetcher command's documentation says what it does.
package role

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/bucketfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/fetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/gitfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/helmchartfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/helmfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/ocifetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workdir"
)

// service names the fetcher on the bus, in logs and in metrics.
const service = "fetcher"

// options are the fetcher's flags; every flag can also be set from
// HEADWATER_<FLAG> (see package flagenv).
type options struct {
	bus bus.Options
	// egress is the policy of the addresses sources' URLs may reach.
	egress      egress.Options
	storage     storage.Options
	telemetry   telemetry.Options
	secrets     secrets.Options
	concurrency int
	maxAttempts int
	maxFileSize int64
	// jobTimeout is the least deadline of a job (fetch.Handler.JobTimeout).
	jobTimeout time.Duration
	// bucketConcurrency bounds the objects of one Bucket downloaded at once.
	bucketConcurrency int
	// refCacheTTL is how long a Git remote's reference listing is shared.
	refCacheTTL time.Duration
	// tokenCacheSize bounds the provider access tokens kept; 0 keeps none.
	tokenCacheSize int
	// contentCache reuses the artifacts of identical content.
	contentCache bool
	// verifyInterval is how long a verified stored artifact is trusted.
	verifyInterval time.Duration
	// helmIndexMaxSize bounds a Helm repository index.
	helmIndexMaxSize int64
	// helmChartMaxSize bounds a chart archive, helmChartFileMaxSize a file
	// in it.
	helmChartMaxSize, helmChartFileMaxSize int64
	// workDir holds the run directories of the fetcher processes that
	// share it (see package workdir).
	workDir string
	// rateLimits are the per-host token buckets (see package hostlimit).
	rateLimits string
	// rateLimitMaxWait bounds a request's wait for its host's bucket.
	rateLimitMaxWait time.Duration
}

func (o *options) bindFlags(fs *flag.FlagSet) {
	o.bus.BindFlags(fs)
	o.egress.BindFlags(fs)
	o.storage.BindFlags(fs)
	o.telemetry.BindFlags(fs, ":9101")
	o.secrets.BindFlags(fs)
	fs.StringVar(&o.workDir, "work-dir", filepath.Join(os.TempDir(), "headwater-fetcher"),
		"Directory for the scratch data of jobs (clones, downloads); a process works in a directory of its own in it and, starting, removes those of processes that died.")
	fs.IntVar(&o.concurrency, "concurrency", 4, "Jobs handled at once (and pulled ahead from the bus).")
	fs.IntVar(&o.maxAttempts, "max-attempts", events.DefaultMaxDeliver, "Attempts of a job that keeps failing transiently before its failure is final.")
	fs.DurationVar(&o.jobTimeout, "job-timeout", bus.DefaultJobTimeout,
		"The least deadline of one job; a source whose spec.timeout is longer has that plus a minute. Past it the job fails with DeadlineExceeded and its slot serves the next.")
	fs.Int64Var(&o.maxFileSize, "max-file-size", 0, "Largest file a source may contain, in bytes; 0 means no limit.")
	fs.IntVar(&o.bucketConcurrency, "bucket-concurrency", bucketfetch.DefaultConcurrency, "Objects of one Bucket downloaded at once.")
	fs.DurationVar(&o.refCacheTTL, "ref-cache-ttl", gitfetch.DefaultRefCacheTTL,
		"How long a Git remote's reference listing answers other fetches of the same remote with the same credentials; 0 disables sharing.")
	fs.IntVar(&o.tokenCacheSize, "token-cache-max-size", providertoken.DefaultCacheEntries,
		"Most access tokens of Git providers (GitHub App installations, the Azure workload identity) kept until shortly before they expire, as Flux's flag of that name; 0 mints a token for every fetch.")
	fs.DurationVar(&o.verifyInterval, "artifact-verify-interval", storage.DefaultVerifyInterval,
		"How long an unchanged reconcile trusts a stored artifact this fetcher read and found intact, while storage reports the same size and modification time (ETag); 0 reads it through on every reconcile, as Flux.")
	fs.BoolVar(&o.contentCache, "content-cache", true,
		"Reuse the stored artifact of identical content (same upstream, revision and content-affecting spec) instead of fetching it again, and combine identical fetches in flight across the fetcher replicas.")
	fs.Int64Var(&o.helmIndexMaxSize, "helm-index-max-size", helmfetch.DefaultMaxIndexSize, "Largest Helm repository index fetched, in bytes.")
	fs.Int64Var(&o.helmChartMaxSize, "helm-chart-max-size", helmchartfetch.DefaultMaxChartSize, "Largest Helm chart archive fetched, in bytes.")
	fs.StringVar(&o.rateLimits, "rate-limits", hostlimit.DefaultRules,
		"Requests per second and burst allowed per upstream host, shared by every fetcher replica, as comma-separated host=rate/burst; "+
			"a host is matched by name (with or without port) or shell pattern (*.example.com), the first match applies, * matches every host, a rate of 0 sets no limit. "+
			"A host that answers 429 or 503 with Retry-After is left alone until then whatever its limit.")
	fs.DurationVar(&o.rateLimitMaxWait, "rate-limit-max-wait", hostlimit.DefaultMaxWait,
		"Longest a request waits for a slot of its host's rate limit; longer, and the fetch answers that the source is rate limited, with when to try again.")
	fs.Int64Var(&o.helmChartFileMaxSize, "helm-chart-file-max-size", helmchartfetch.DefaultMaxChartFileSize,
		"Largest file in a Helm chart, decompressed, in bytes.")
}

// Flags returns the role's flags as Main parses them (command.NewFlagSet),
// bound to options of their own: for tests and the flag reference
// (docs/flags.md).
func Flags() *flag.FlagSet {
	var o options
	return command.NewFlagSet(service, o.bindFlags)
}

// Main runs the fetcher with args, the command line after the program's
// name (or after -target), and exits the process when it ends.
func Main(args []string) {
	var o options
	command.MainArgs(service, args, o.bindFlags, func() logr.Logger { return o.telemetry.NewLogger(service) },
		func(ctx context.Context) error { return run(ctx, o) })
}

// run builds the fetcher and handles jobs until ctx ends; it logs with
// ctx's logger.
func run(ctx context.Context, o options) error {
	if o.concurrency < 1 {
		return errors.New("--concurrency must be at least 1")
	}
	if o.maxAttempts < 1 {
		return errors.New("--max-attempts must be at least 1")
	}
	if o.jobTimeout <= 0 {
		return errors.New("--job-timeout must be positive")
	}
	if o.bucketConcurrency < 1 {
		return errors.New("--bucket-concurrency must be at least 1")
	}
	if o.helmIndexMaxSize < 1 || o.helmChartMaxSize < 1 || o.helmChartFileMaxSize < 1 {
		return errors.New("--helm-index-max-size, --helm-chart-max-size and --helm-chart-file-max-size must be positive")
	}
	helmchartfetch.SetMaxChartFileSize(o.helmChartFileMaxSize)
	if o.refCacheTTL < 0 {
		return errors.New("--ref-cache-ttl must not be negative")
	}
	if o.tokenCacheSize < 0 {
		return errors.New("--token-cache-max-size must not be negative")
	}
	rules, err := hostlimit.ParseRules(o.rateLimits)
	if err != nil {
		return fmt.Errorf("--rate-limits: %w", err)
	}
	if o.rateLimitMaxWait < 0 {
		return errors.New("--rate-limit-max-wait must not be negative")
	}
	if o.verifyInterval < 0 {
		return errors.New("--artifact-verify-interval must not be negative")
	}
	log := logr.FromContextOrDiscard(ctx)
	ctrllog.SetLogger(log)

	// The endpoints answer before the service reaches storage and NATS:
	// alive at once, ready once both are up (see package telemetry). They
	// stop when run returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ep, err := bus.ServeEndpoints(ctx, o.telemetry.Addr, service, log, bus.EndpointOptions{Waiting: map[string]string{"storage": "not opened yet"}})
	if err != nil {
		return err
	}
	reg, ready, onBus := ep.Registry, ep.Ready, ep.Bus

	// Every temporary file of the process, its libraries' and the git
	// processes' it starts included, goes to its run directory, which the
	// next fetcher to start removes if this process is killed.
	work, err := workdir.Open(o.workDir)
	if err != nil {
		return err
	}
	defer func() {
		if err := work.Close(); err != nil {
			log.Error(err, "removing the work directory")
		}
	}()
	if len(work.Removed) > 0 {
		log.Info("removed the scratch data of fetchers that died", "directories", work.Removed)
	}
	if err := os.Setenv("TMPDIR", work.Path); err != nil {
		return fmt.Errorf("work directory: %w", err)
	}

	store, err := o.storage.OpenWait(ctx, log, func(err error) {
		ready.Set("storage", func() error { return fmt.Errorf("waiting for the object store: %w", err) })
	})
	if err != nil {
		return err
	}
	defer storage.Close(store)
	ready.Set("storage", storage.ReadyCheck(store, 5*time.Second))
	secretReader, err := o.secrets.NewReader()
	if err != nil {
		log.Info("no kubernetes cluster: sources that name a secret will fail, and jobs are not checked against their objects",
			"error", err.Error())
	}
	checker, _ := o.secrets.NewProvenance() // nil without a cluster, as logged above

	// Sources' URLs are tenants': every client of one dials through the
	// egress policy (the providers' credential requests do not).
	egress.Install(o.egress.Resolve(ctx, o.bus.URL))
	conn, err := bus.Connect(ctx, o.bus, service, log, bus.ReportTo(onBus))
	if err != nil {
		return err
	}
	defer conn.Close()
	join := conn.Joiner(events.FetchStream, events.FetcherConsumer, events.ConsumerOptions{MaxDeliver: o.maxAttempts})
	consumer, err := join(ctx)
	if err != nil {
		return err
	}

	var leases *fetch.Leases
	if o.contentCache {
		// Identical fetches in flight in every replica combine through
		// the bucket JoinStream created.
		kv, err := conn.JS.KeyValue(ctx, events.FlightBucket)
		if err != nil {
			return fmt.Errorf("key-value bucket %s: %w", events.FlightBucket, err)
		}
		host, _ := os.Hostname()
		leases = &fetch.Leases{KV: kv, Holder: fmt.Sprintf("%s/%d", host, os.Getpid())}
	}

	var tokens *providertoken.Cache // nil mints a token for every fetch
	if o.tokenCacheSize > 0 {
		tokens = providertoken.NewCache(o.tokenCacheSize, reg)
	}

	// Every replica shares each upstream host's holds and limit through
	// the bucket JoinStream created.
	hostKV, err := conn.JS.KeyValue(ctx, events.HostBucket)
	if err != nil {
		return fmt.Errorf("key-value bucket %s: %w", events.HostBucket, err)
	}
	hosts := &hostlimit.KVStore{KV: hostKV}
	if err := hosts.Watch(ctx); err != nil {
		return err
	}
	limiter := &hostlimit.Limiter{Rules: rules, Store: hosts, MaxWait: o.rateLimitMaxWait,
		Metrics: hostlimit.NewMetrics(reg), Log: log.WithName("hostlimit")}
	gitfetch.LimitHTTP(limiter)

	helmSource := helmfetch.NewSource(secretReader, o.helmIndexMaxSize, helmfetch.NewValidators(helmfetch.DefaultValidatorEntries), reg)
	if helmSource.Recent, err = helmfetch.NewRecent("", helmfetch.DefaultRecentTTL, helmfetch.DefaultRecentEntries); err != nil {
		return err
	}
	defer helmSource.Recent.Close()
	helmSource.Limit(limiter)
	chartSource := &helmchartfetch.Source{Secrets: secretReader, Storage: store, MaxChartSize: o.helmChartMaxSize, Indexes: helmSource}
	chartSource.Limit(limiter)
	handler := &fetch.Handler{
		Sources: map[string]source.Source{
			gitfetch.Kind: &gitfetch.Source{Secrets: secretReader,
				RefCache: gitfetch.NewRefCache(o.refCacheTTL, gitfetch.DefaultRefCacheEntries, reg), Tokens: tokens, Limiter: limiter},
			bucketfetch.Kind: &bucketfetch.Source{Secrets: secretReader, Concurrency: o.bucketConcurrency,
				MaxFileSize: o.maxFileSize, Limiter: limiter},
			ocifetch.Kind:       &ocifetch.Source{Secrets: secretReader, MaxFileSize: o.maxFileSize, Limiter: limiter},
			helmfetch.Kind:      helmSource,
			helmchartfetch.Kind: chartSource,
		},
		Storage:      store,
		Publisher:    conn.NewPublisher(service),
		MaxFileSize:  o.maxFileSize,
		Metrics:      fetch.NewMetrics(reg),
		ContentCache: o.contentCache,
		Leases:       leases,
		Provenance:   checker,
		Verified:     &storage.Verified{Interval: o.verifyInterval},
	}
	worker := &bus.Worker{
		Service:           service,
		Consumer:          consumer,
		Rejoin:            join,
		Conn:              conn,
		Concurrency:       o.concurrency,
		Handler:           handler.Handle,
		Report:            handler.Report,
		TimeoutOf:         func(m *events.Message) time.Duration { return max(o.jobTimeout, handler.JobTimeout(m)) },
		DeadlineCondition: fetch.DeadlineCondition,
		Metrics:           telemetry.NewJobMetrics(reg, service),
		Log:               log,
	}
	onBus.Up(conn)
	log.Info("fetching", "concurrency", o.concurrency, "kinds", []string{gitfetch.Kind, bucketfetch.Kind, ocifetch.Kind, helmfetch.Kind, helmchartfetch.Kind},
		"refCacheTTL", o.refCacheTTL.String(), "contentCache", o.contentCache, "rateLimits", rules.String())
	return worker.Run(ctx)
}
