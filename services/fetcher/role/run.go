package role

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"
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
	"github.com/headwater-gitops/headwater/services/fetcher/internal/provenance"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/registrylogin"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workdir"
)

// kinds are the source kinds the fetcher fetches.
var kinds = []string{gitfetch.Kind, bucketfetch.Kind, ocifetch.Kind, helmfetch.Kind, helmchartfetch.Kind}

// run builds the fetcher, one step after the other, and handles jobs
// until ctx ends; it logs with ctx's logger.
func run(ctx context.Context, o options) error {
	rules, err := o.check()
	if err != nil {
		return err
	}
	log := logr.FromContextOrDiscard(ctx)
	ctrllog.SetLogger(log)
	// The endpoints stop, and what the steps opened is closed, when run
	// returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f := &fetcher{o: o, log: log, rules: rules}
	defer f.close()
	if err := command.Steps(ctx,
		f.serveEndpoints,
		f.openWorkDir,
		f.openStorage,
		f.readSecrets,
		f.connect,
		f.shareFetches,
		f.limitHosts,
		f.newHandler,
	); err != nil {
		return err
	}
	f.ep.Bus.Up(f.conn)
	log.Info("fetching", "concurrency", o.concurrency, "kinds", kinds,
		"refCacheTTL", o.refCacheTTL.String(), "contentCache", o.contentCache, "rateLimits", rules.String())
	return f.worker.Run(ctx)
}

// DefaultMaxJobTimeout is -max-job-timeout's default: longer than any
// spec.timeout Flux users give a large repository, short enough that a
// source whose server trickles its answer holds a fetcher's slot for an
// hour at most, however long its spec.timeout.
const DefaultMaxJobTimeout = time.Hour

// jobDeadline is the deadline of a job whose source needs need
// (fetch.Handler.JobTimeout: its spec.timeout plus a minute): at least
// -job-timeout, at most -max-job-timeout. spec.timeout is the tenant's to
// choose; without the cap, a source at a server that trickles its answer
// with spec.timeout of days would hold a slot of the shared fetcher for
// days.
func (o options) jobDeadline(need time.Duration) time.Duration {
	return min(max(o.jobTimeout, need), o.maxJobTimeout)
}

// check says which flag is out of its range, and parses -rate-limits.
func (o options) check() (hostlimit.Rules, error) {
	if o.concurrency < 1 {
		return nil, errors.New("--concurrency must be at least 1")
	}
	if o.maxAttempts < 1 {
		return nil, errors.New("--max-attempts must be at least 1")
	}
	if o.jobTimeout <= 0 {
		return nil, errors.New("--job-timeout must be positive")
	}
	if o.maxJobTimeout < o.jobTimeout {
		return nil, errors.New("--max-job-timeout must be at least --job-timeout")
	}
	if o.bucketConcurrency < 1 {
		return nil, errors.New("--bucket-concurrency must be at least 1")
	}
	if o.helmIndexMaxSize < 1 || o.helmChartMaxSize < 1 || o.helmChartFileMaxSize < 1 {
		return nil, errors.New("--helm-index-max-size, --helm-chart-max-size and --helm-chart-file-max-size must be positive")
	}
	if o.refCacheTTL < 0 {
		return nil, errors.New("--ref-cache-ttl must not be negative")
	}
	if o.tokenCacheSize < 0 {
		return nil, errors.New("--token-cache-max-size must not be negative")
	}
	if o.tokenCacheMaxDuration < 0 {
		return nil, errors.New("--token-cache-max-duration must not be negative")
	}
	rules, err := hostlimit.ParseRules(o.rateLimits)
	if err != nil {
		return nil, fmt.Errorf("--rate-limits: %w", err)
	}
	if o.rateLimitMaxWait < 0 {
		return nil, errors.New("--rate-limit-max-wait must not be negative")
	}
	if o.verifyInterval < 0 {
		return nil, errors.New("--artifact-verify-interval must not be negative")
	}
	return rules, nil
}

// fetcher is what run builds before it handles jobs. Each of its methods
// that run lists is one step: it fills the fields the later steps use,
// and wraps its errors with what it was doing.
type fetcher struct {
	o     options
	log   logr.Logger
	rules hostlimit.Rules

	ep           *bus.Endpoints
	work         *workdir.Dir
	store        storage.Storage
	secretReader secrets.Reader
	// checker checks jobs against their objects; nil without a cluster.
	checker  *provenance.Checker
	conn     *bus.Conn
	join     func(context.Context) (jetstream.Consumer, error)
	consumer jetstream.Consumer
	// leases combine identical fetches across replicas, with
	// -content-cache.
	leases  *fetch.Leases
	limiter *hostlimit.Limiter
	recent  *helmfetch.Recent
	worker  *bus.Worker
}

// close closes what the steps opened, the last first.
func (f *fetcher) close() {
	if f.recent != nil {
		f.recent.Close()
	}
	if f.conn != nil {
		f.conn.Close()
	}
	if f.store != nil {
		storage.Close(f.store)
	}
	if f.work != nil {
		if err := f.work.Close(); err != nil {
			f.log.Error(err, "removing the work directory")
		}
	}
}

// serveEndpoints serves metrics and probes before the service reaches
// storage and NATS: alive at once, ready once both are up (see package
// telemetry). They stop when ctx ends.
func (f *fetcher) serveEndpoints(ctx context.Context) error {
	ep, err := bus.ServeEndpoints(ctx, f.o.telemetry.Addr, service, f.log, bus.EndpointOptions{Waiting: map[string]string{storage.ReadyName: "not opened yet"}})
	if err != nil {
		return fmt.Errorf("serve metrics and probes: %w", err)
	}
	f.ep = ep
	return nil
}

// openWorkDir opens the process's run directory in -work-dir. Every
// temporary file of the process, its libraries' and the git processes' it
// starts included, goes there, and the next fetcher to start removes it
// if this process is killed.
func (f *fetcher) openWorkDir(context.Context) error {
	work, err := workdir.Open(f.o.workDir)
	if err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	f.work = work
	if len(work.Removed) > 0 {
		f.log.Info("removed the scratch data of fetchers that died", "directories", work.Removed)
	}
	if err := os.Setenv("TMPDIR", work.Path); err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	return nil
}

// openStorage opens the artifact storage, waiting for the object store
// (and saying so on /readyz) until it answers.
func (f *fetcher) openStorage(ctx context.Context) error {
	store, err := f.o.storage.OpenReady(ctx, f.log, f.ep.Ready)
	if err != nil {
		return fmt.Errorf("open the storage: %w", err)
	}
	f.store = store
	return nil
}

// readSecrets makes the readers of the sources' secrets and of the jobs'
// objects. Without a cluster the fetcher still runs: sources that name a
// secret fail, and jobs are not checked against their objects.
func (f *fetcher) readSecrets(context.Context) error {
	secretReader, err := f.o.secrets.NewReader()
	if err != nil {
		f.log.Info("no kubernetes cluster: sources that name a secret will fail, and jobs are not checked against their objects",
			"error", err.Error())
	}
	f.secretReader = secretReader
	f.checker, _ = f.o.secrets.NewProvenance() // nil without a cluster, as logged above
	return nil
}

// connect joins the bus and the fetch jobs' consumer.
func (f *fetcher) connect(ctx context.Context) error {
	// Sources' URLs are tenants': every client of one dials through the
	// egress policy (the providers' credential requests do not).
	egress.Install(f.o.egress.Resolve(ctx, f.o.bus.URL))
	conn, err := bus.Connect(ctx, f.o.bus, service, f.log, bus.ReportTo(f.ep.Bus))
	if err != nil {
		return fmt.Errorf("connect to the bus: %w", err)
	}
	f.conn = conn
	f.join = conn.Joiner(events.FetchStream, events.FetcherConsumer, events.ConsumerOptions{MaxDeliver: f.o.maxAttempts})
	if f.consumer, err = f.join(ctx); err != nil {
		return fmt.Errorf("join the fetch jobs: %w", err)
	}
	return nil
}

// shareFetches makes the leases through which identical fetches in
// flight in every replica combine (the bucket JoinStream created), with
// -content-cache.
func (f *fetcher) shareFetches(ctx context.Context) error {
	if !f.o.contentCache {
		return nil
	}
	kv, err := f.conn.JS.KeyValue(ctx, events.FlightBucket)
	if err != nil {
		return fmt.Errorf("key-value bucket %s: %w", events.FlightBucket, err)
	}
	host, _ := os.Hostname()
	f.leases = &fetch.Leases{KV: kv, Holder: fmt.Sprintf("%s/%d", host, os.Getpid())}
	return nil
}

// limitHosts makes the limiter of requests to each upstream host, whose
// holds and limits every replica shares through the bucket JoinStream
// created, and has Git's HTTP transport go through it.
func (f *fetcher) limitHosts(ctx context.Context) error {
	hostKV, err := f.conn.JS.KeyValue(ctx, events.HostBucket)
	if err != nil {
		return fmt.Errorf("key-value bucket %s: %w", events.HostBucket, err)
	}
	hosts := &hostlimit.KVStore{KV: hostKV}
	if err := hosts.Watch(ctx); err != nil {
		return fmt.Errorf("watch the host limits: %w", err)
	}
	f.limiter = &hostlimit.Limiter{Rules: f.rules, Store: hosts, MaxWait: f.o.rateLimitMaxWait,
		Metrics: hostlimit.NewMetrics(f.ep.Registry), Log: f.log.WithName("hostlimit")}
	gitfetch.LimitHTTP(f.limiter)
	return nil
}

// newHandler makes the sources of every kind, the job handler and the
// worker that feeds it jobs.
func (f *fetcher) newHandler(context.Context) error {
	sources, err := f.sources()
	if err != nil {
		return err
	}
	reg := f.ep.Registry
	handler := &fetch.Handler{
		Sources:      sources,
		Storage:      f.store,
		Publisher:    f.conn.NewPublisher(service),
		MaxFileSize:  f.o.maxFileSize,
		Metrics:      fetch.NewMetrics(reg),
		ContentCache: f.o.contentCache,
		Leases:       f.leases,
		Provenance:   f.checker,
		Verified:     &storage.Verified{Interval: f.o.verifyInterval},
	}
	f.worker = &bus.Worker{
		Service:           service,
		Consumer:          f.consumer,
		Rejoin:            f.join,
		Conn:              f.conn,
		Concurrency:       f.o.concurrency,
		Handler:           handler.Handle,
		Report:            handler.Report,
		TimeoutOf:         func(m *events.Message) time.Duration { return f.o.jobDeadline(handler.JobTimeout(m)) },
		DeadlineCondition: fetch.DeadlineCondition,
		Metrics:           telemetry.NewJobMetrics(reg, service),
		Log:               f.log,
	}
	return nil
}

// sources are the fetcher's sources, by kind.
func (f *fetcher) sources() (map[string]source.Source, error) {
	reg := f.ep.Registry
	var tokens *providertoken.Cache // nil mints a token for every fetch
	if f.o.tokenCacheSize > 0 {
		tokens = providertoken.NewCache(f.o.tokenCacheSize, reg).WithMaxDuration(f.o.tokenCacheMaxDuration)
	}
	cloud := &registrylogin.Login{Tokens: tokens, Limiter: f.limiter}
	helmchartfetch.SetMaxChartFileSize(f.o.helmChartFileMaxSize)
	helmSource := helmfetch.NewSource(f.secretReader, f.o.helmIndexMaxSize, helmfetch.NewValidators(helmfetch.DefaultValidatorEntries), reg)
	recent, err := helmfetch.NewRecent("", helmfetch.DefaultRecentTTL, helmfetch.DefaultRecentEntries)
	if err != nil {
		return nil, fmt.Errorf("helm index cache: %w", err)
	}
	helmSource.Recent, f.recent = recent, recent
	helmSource.Limit(f.limiter)
	chartSource := &helmchartfetch.Source{Secrets: f.secretReader, Storage: f.store, MaxChartSize: f.o.helmChartMaxSize, Indexes: helmSource, Cloud: cloud}
	chartSource.Limit(f.limiter)
	return map[string]source.Source{
		gitfetch.Kind: &gitfetch.Source{Secrets: f.secretReader,
			RefCache: gitfetch.NewRefCache(f.o.refCacheTTL, gitfetch.DefaultRefCacheEntries, reg), Tokens: tokens, Limiter: f.limiter},
		bucketfetch.Kind: &bucketfetch.Source{Secrets: f.secretReader, Concurrency: f.o.bucketConcurrency,
			MaxFileSize: f.o.maxFileSize, Limiter: f.limiter},
		ocifetch.Kind:       &ocifetch.Source{Secrets: f.secretReader, MaxFileSize: f.o.maxFileSize, Limiter: f.limiter, Cloud: cloud},
		helmfetch.Kind:      helmSource,
		helmchartfetch.Kind: chartSource,
	}, nil
}
