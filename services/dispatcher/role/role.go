// Package role is the dispatcher's main (Main), importable so that the dispatcher
// command and the headwater command (headwater -target=dispatcher) run the same
// service; the dispatcher command's documentation says what it does.
package role

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/kubeconfig"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/dispatcher/internal/controller"
	"github.com/headwater-gitops/headwater/services/dispatcher/internal/deliver"
	"github.com/headwater-gitops/headwater/services/dispatcher/internal/dispatch"
)

// service names the dispatcher on the bus, in logs and in metrics.
const service = "dispatcher"

// options are the dispatcher's flags; every flag can also be set from
// HEADWATER_<FLAG> (see package flagenv).
type options struct {
	bus       bus.Options
	telemetry telemetry.Options

	kube           kubeconfig.Options
	concurrency    int
	reportInterval time.Duration
	// noCrossNamespaceRefs confines each Subscription to its namespace.
	noCrossNamespaceRefs bool
	// egress is the policy of the sinks' addresses.
	egress egress.Options
}

func (o *options) bindFlags(fs *flag.FlagSet) {
	o.bus.BindFlags(fs)
	o.egress.BindFlags(fs)
	o.telemetry.BindFlags(fs, ":9104")
	o.kube.BindFlags(fs, "Path to a kubeconfig; default: $KUBECONFIG, then in-cluster.")
	fs.IntVar(&o.concurrency, "concurrency", 4, "Events of one Subscription delivered at once, per replica.")
	fs.DurationVar(&o.reportInterval, "report-interval", 2*time.Second,
		"Longest a delivery report waits before it is sent to the watcher (a dead letter is sent at once).")
	fs.BoolVar(&o.noCrossNamespaceRefs, "no-cross-namespace-refs", false,
		"When set to true, a Subscription sees the events of its own namespace only, and one naming another namespace is refused (AccessDenied), as Flux's flag for Alerts; see docs/security.md.")
}

// Flags returns the role's flags as Main parses them (command.NewFlagSet),
// bound to options of their own: for tests and the flag reference
// (docs/flags.md).
func Flags() *flag.FlagSet {
	var o options
	return command.NewFlagSet(service, o.bindFlags)
}

// Main runs the dispatcher with args, the command line after the program's
// name (or after -target), and exits the process when it ends.
func Main(args []string) {
	var o options
	command.MainArgs(service, args, o.bindFlags, func() logr.Logger { return o.telemetry.NewLogger(service) },
		func(ctx context.Context) error { return run(ctx, o) })
}

// run watches the Subscriptions and delivers their events until ctx ends.
func run(ctx context.Context, o options) error {
	if o.concurrency < 1 {
		return errors.New("--concurrency must be at least 1")
	}
	if o.reportInterval <= 0 {
		return errors.New("--report-interval must be positive")
	}
	log := logr.FromContextOrDiscard(ctx)
	ctrl.SetLogger(log)

	// The endpoints answer before the service reaches Kubernetes and NATS:
	// alive at once, ready once it is on the bus (see package telemetry).
	// They stop when run returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ep, err := bus.ServeEndpoints(ctx, o.telemetry.Addr, service, log, bus.EndpointOptions{})
	if err != nil {
		return err
	}
	reg, onBus := ep.Registry, ep.Bus

	cfg, err := o.kube.Load()
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	// Every replica works: no leader election. Metrics are served by
	// telemetry.Serve with the service's own registry.
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Logger: log, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}

	conn, err := bus.Connect(ctx, o.bus, service, log, bus.ReportTo(onBus))
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.EnsureStreams(ctx); err != nil {
		return err
	}
	onBus.Up(conn)
	// Sinks are tenants' URLs: kept off the metadata endpoint, loopback
	// and the NATS server (package egress).
	policy := o.egress.Resolve(ctx, o.bus.URL)
	metrics, err := dispatch.NewMetrics(reg)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	reports := &dispatch.Reports{
		Publisher:  conn.NewPublisher(service),
		Dispatcher: host + "-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		Interval:   o.reportInterval,
		Log:        log.WithName("reports"),
	}
	d := &dispatch.Dispatcher{
		JS:          conn.JS,
		HTTP:        &deliver.Client{Policy: policy},
		Reports:     reports,
		Concurrency: o.concurrency,
		Metrics:     metrics,
		Jobs:        telemetry.NewJobMetrics(reg, service),
		Log:         log,
	}
	if err := mgr.Add(leaderless(d.Start)); err != nil {
		return err
	}
	if err := mgr.Add(leaderless(func(ctx context.Context) error { reports.Run(ctx); return nil })); err != nil {
		return err
	}
	r := &controller.Reconciler{Client: mgr.GetClient(), Secrets: mgr.GetAPIReader(), Dispatcher: d, NoCrossNamespaceRefs: o.noCrossNamespaceRefs}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up subscription controller: %w", err)
	}
	log.Info("dispatching", "concurrency", o.concurrency, "reportInterval", o.reportInterval.String())
	return mgr.Start(ctx)
}

// leaderless is a manager Runnable that runs on every replica.
type leaderless func(ctx context.Context) error

// Start runs the function.
func (f leaderless) Start(ctx context.Context) error { return f(ctx) }

// NeedLeaderElection is false: every replica delivers.
func (leaderless) NeedLeaderElection() bool { return false }
