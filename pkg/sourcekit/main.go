package sourcekit

import (
	"context"
	"errors"
	"flag"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/fetchjob"
	"github.com/headwater-gitops/headwater/pkg/kubeconfig"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// Options are a plug-in fetcher's flags (environment: HEADWATER_<FLAG>),
// the same as the built-in fetcher's where they mean the same.
type Options struct {
	Bus       bus.Options
	Storage   storage.Options
	Telemetry telemetry.Options
	Kube      kubeconfig.Options
	// Concurrency bounds the jobs fetched at once.
	Concurrency int
	// MaxAttempts bounds the attempts of one job.
	MaxAttempts int
	// Timeout bounds one job.
	Timeout time.Duration
	// MaxFileSize bounds each file of a staged tree (0: no bound).
	MaxFileSize int64
	// WorkDir holds the jobs' temporary directories.
	WorkDir string
	// VerifyInterval is how long an unchanged check trusts a stored
	// artifact found intact while storage describes it the same way
	// (storage.Verified); 0 reads it through at every check.
	VerifyInterval time.Duration
	// Egress is the policy of the addresses a kind's URLs may reach,
	// installed by Run (egress.Install): a FetchFunc's HTTP client
	// made with egress.Transport follows it.
	Egress egress.Options
}

// BindFlags registers the options on fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	o.Bus.BindFlags(fs)
	o.Storage.BindFlags(fs)
	o.Telemetry.BindFlags(fs, ":9100")
	o.Egress.BindFlags(fs)
	o.Kube.BindFlags(fs, "Path to a kubeconfig, to read the Secrets sources name; default: $KUBECONFIG, then in-cluster.")
	fs.IntVar(&o.Concurrency, "concurrency", 4, "Jobs fetched at once.")
	fs.IntVar(&o.MaxAttempts, "max-attempts", events.DefaultMaxDeliver, "Attempts of one job before its failure is final.")
	fs.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "Longest time one job may take (a kind's spec may ask for less).")
	fs.Int64Var(&o.MaxFileSize, "max-file-size", 512<<20, "Largest file of a staged tree, in bytes; 0 for no limit.")
	fs.StringVar(&o.WorkDir, "work-dir", os.TempDir(), "Directory of the jobs' temporary files.")
	fs.DurationVar(&o.VerifyInterval, "artifact-verify-interval", storage.DefaultVerifyInterval,
		"How long an unchanged check trusts a stored artifact this fetcher read and found intact, while storage reports the same size and modification time (ETag); 0 reads it through at every check, as Flux.")
}

// Kind is a plug-in kind's fetcher, as Main runs it.
type Kind struct {
	// Name is the kind, as in the objects' kind field ("HTTPSource").
	Name string
	// Fetch fetches one object.
	Fetch FetchFunc
	// BindFlags, when set, registers the kind's own flags beside the
	// kit's; they are parsed before Fetch is first called.
	BindFlags func(fs *flag.FlagSet)
}

// Main is the whole main of a plug-in fetcher: flags from args and the
// environment (HEADWATER_<FLAG>), then Run until SIGTERM.
func Main(k Kind, args []string) {
	var o Options
	service := ServiceName(k.Name)
	command.MainArgs(service, args, o.bind(k), func() logr.Logger { return o.Telemetry.NewLogger(service) },
		func(ctx context.Context) error { return Run(ctx, k.Name, k.Fetch, o) })
}

// Flags returns kind's fetcher's flags as Main parses them
// (command.NewFlagSet), bound to options of their own: for tests and the
// flag reference.
func Flags(k Kind) *flag.FlagSet {
	var o Options
	return command.NewFlagSet(ServiceName(k.Name), o.bind(k))
}

// bind registers the kit's flags and k's own on fs.
func (o *Options) bind(k Kind) func(fs *flag.FlagSet) {
	return func(fs *flag.FlagSet) {
		o.BindFlags(fs)
		if k.BindFlags != nil {
			k.BindFlags(fs)
		}
	}
}

// ServiceName is the name of kind's fetcher in logs, metrics and -version:
// "<kind>-fetcher", in lower case ("httpsource-fetcher").
func ServiceName(kind string) string { return strings.ToLower(kind) + "-fetcher" }

// Run fetches kind's jobs with fetch until ctx ends: it serves metrics and
// probes on Telemetry.Addr, opens the storage, connects to NATS as
// events.PluginIdentity(kind) and consumes events.PluginConsumer(kind).
func Run(ctx context.Context, kind string, fetch FetchFunc, o Options) error {
	if o.Concurrency < 1 || o.MaxAttempts < 1 || o.Timeout <= 0 {
		return errors.New("--concurrency, --max-attempts and --timeout must be positive")
	}
	if o.VerifyInterval < 0 {
		return errors.New("--artifact-verify-interval must not be negative")
	}
	service, identity := ServiceName(kind), events.PluginIdentity(kind)
	egress.Install(o.Egress.Resolve(ctx, o.Bus.URL))
	log := logr.FromContextOrDiscard(ctx)
	ctrllog.SetLogger(log)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ep, err := bus.ServeEndpoints(ctx, o.Telemetry.Addr, service, log, bus.EndpointOptions{Waiting: map[string]string{storage.ReadyName: "not opened yet"}})
	if err != nil {
		return err
	}
	store, err := o.Storage.OpenReady(ctx, log, ep.Ready)
	if err != nil {
		return err
	}
	defer storage.Close(store)
	secrets, err := secretReader(o.Kube)
	if err != nil {
		log.Info("no kubernetes cluster: sources that name a secret will fail", "error", err.Error())
	}

	conn, err := bus.Connect(ctx, o.Bus, identity, log, bus.ReportTo(ep.Bus))
	if err != nil {
		return err
	}
	defer conn.Close()
	join := conn.Joiner(events.FetchStream, events.PluginConsumer(kind), events.ConsumerOptions{
		MaxDeliver: o.MaxAttempts, MaxAckPending: 4 * o.Concurrency})
	consumer, err := join(ctx)
	if err != nil {
		return err
	}
	ep.Bus.Up(conn)
	h := newHandler(kind, fetch, store, conn.NewPublisher(service), secrets, o)
	w := &bus.Worker{
		Service:     service,
		Consumer:    consumer,
		Concurrency: o.Concurrency,
		Handler:     h.handle,
		Report:      h.report,
		Metrics:     telemetry.NewJobMetrics(ep.Registry, service),
		Log:         log,
		Rejoin:      join,
		Conn:        conn,
	}
	log.Info("fetching", "kind", kind, "concurrency", o.Concurrency, "subject", events.FetchSubject(kind))
	return w.Run(ctx)
}

// newHandler is the handler of kind's jobs, as o configures it.
func newHandler(kind string, fetch FetchFunc, store storage.Storage, pub fetchjob.Publisher, secrets client.Reader, o Options) *handler {
	return &handler{kind: kind, fetch: fetch, store: store, verified: &storage.Verified{Interval: o.VerifyInterval}, pub: pub,
		secrets: secrets, workDir: o.WorkDir, timeout: o.Timeout, maxSize: o.MaxFileSize}
}

// secretReader is an uncached reader of Secrets (a fetcher reads the few
// its sources name, when it fetches them).
func secretReader(o kubeconfig.Options) (client.Reader, error) {
	cfg, err := o.Load()
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}
