// Package role is the watcher's main (Main), importable so that the watcher
// command and the headwater command (headwater -target=watcher) run the same
// service; the watcher command's documentation says what it does.
package role

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/jitter"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	eventsv1alpha1 "github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/kubeconfig"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/watcher/internal/controller"
	"github.com/headwater-gitops/headwater/services/watcher/internal/crdwait"
	"github.com/headwater-gitops/headwater/services/watcher/internal/externalartifact"
	"github.com/headwater-gitops/headwater/services/watcher/internal/fairshare"
	"github.com/headwater-gitops/headwater/services/watcher/internal/fluxguard"
	"github.com/headwater-gitops/headwater/services/watcher/internal/generator"
	"github.com/headwater-gitops/headwater/services/watcher/internal/notify"
	"github.com/headwater-gitops/headwater/services/watcher/internal/receiver"
	"github.com/headwater-gitops/headwater/services/watcher/internal/results"
	"github.com/headwater-gitops/headwater/services/watcher/internal/seal"
	"github.com/headwater-gitops/headwater/services/watcher/internal/shard"
	"github.com/headwater-gitops/headwater/services/watcher/internal/sourcekind"
	"github.com/headwater-gitops/headwater/services/watcher/internal/subscriptions"
)

// service names the watcher on the bus, in logs and in metrics.
const service = "watcher"

// options are the watcher's flags; every flag can also be set from
// HEADWATER_<FLAG> (see package flagenv).
type options struct {
	bus       bus.Options
	telemetry telemetry.Options

	kube                    kubeconfig.Options
	healthAddr              string
	leaderElect             bool
	leaderElectionNamespace string
	leaseDuration           time.Duration
	renewDeadline           time.Duration
	retryPeriod             time.Duration
	releaseOnCancel         bool
	minRetryDelay           time.Duration
	maxRetryDelay           time.Duration
	concurrency             int
	eventConcurrency        int
	intervalJitter          float64
	requeueDependency       time.Duration
	jobKeyFile              string
	eventsAddr              string
	// receivers serves Flux's Receivers (the receivers component).
	receivers             bool
	hookMinInterval       time.Duration
	sourceMetricsInterval time.Duration
	announceInterval      time.Duration
	alignRemotes          bool
	// fluxNamespaces are where Flux's source-controller must not run
	// (package fluxguard), comma-separated.
	fluxNamespaces string
	// pluginKinds are the plug-in source kinds reconciled besides Flux's
	// (sourcekind.ParseRegistrations), comma-separated.
	pluginKinds string
	// noCrossNamespaceRefs refuses references to another namespace
	// (ArtifactGenerator sources, Receiver resources), as Flux's flag.
	noCrossNamespaceRefs bool
	// shard is the watcher's share of the sources (package shard).
	shard shard.Options
	// fairShare bounds each namespace's fetch jobs on the bus (package
	// fairshare).
	fairShare fairshare.Options
}

func (o *options) bindFlags(fs *flag.FlagSet) {
	o.bus.BindFlags(fs)
	o.telemetry.BindFlags(fs, ":9100")
	o.kube.BindFlags(fs, "Path to a kubeconfig; default: $KUBECONFIG, then in-cluster.")
	o.shard.BindFlags(fs)
	o.fairShare.BindFlags(fs)
	fs.StringVar(&o.healthAddr, "health-addr", ":9110", "Address serving /healthz and /readyz; empty or 0 serves none. Both answer from start-up, before NATS is reached.")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "Elect a leader among replicas; only the leader reconciles.")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "",
		"Namespace of the leader election lease; default: $POD_NAMESPACE, then \"default\".")
	fs.DurationVar(&o.leaseDuration, "leader-election-lease-duration", 35*time.Second,
		"How long a standby waits before taking over a lease its leader stopped renewing (a leader that stops cleanly releases it at once); as Flux.")
	fs.DurationVar(&o.renewDeadline, "leader-election-renew-deadline", 30*time.Second,
		"How long the leader keeps trying to renew its lease before it gives up leading; as Flux.")
	fs.DurationVar(&o.retryPeriod, "leader-election-retry-period", 5*time.Second,
		"How often the leader renews its lease, and a standby tries to take it: each renewal is a write to the API server; as Flux.")
	fs.BoolVar(&o.releaseOnCancel, "leader-election-release-on-cancel", true,
		"The leader releases its lease when it stops, so a standby takes over at once; as Flux.")
	fs.DurationVar(&o.minRetryDelay, "min-retry-delay", controller.DefaultRetryBase,
		"Delay before the first retry of a source whose fetch failed for a reason that passes; it doubles with each failure (Flux's flag, whose default is 750ms).")
	fs.DurationVar(&o.maxRetryDelay, "max-retry-delay", controller.DefaultRetryMax,
		"Longest delay between two retries of a source whose fetch keeps failing for a reason that passes (Flux's flag, whose default is 15m).")
	fs.IntVar(&o.concurrency, "concurrency", 4, "Objects reconciled at once, per kind.")
	fs.IntVar(&o.eventConcurrency, "event-concurrency", 8, "Job outcomes applied to status at once.")
	o.intervalJitter = 5
	fs.Func("interval-jitter-percentage", "Jitter applied to every interval, in percent, when -align-remotes is false: at least 0 and less than 100, as Flux (default 5).",
		func(s string) error {
			p, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return errors.New("parse error")
			}
			if p < 0 || p >= 100 {
				return errors.New("must be at least 0 and less than 100")
			}
			o.intervalJitter = p
			return nil
		})
	fs.DurationVar(&o.requeueDependency, "requeue-dependency", 30*time.Second,
		"How often a source waiting for another one (an include without an artifact) looks again (as Flux).")
	fs.StringVar(&o.jobKeyFile, "job-key-file", "",
		"File holding the secret (32 bytes or more) every watcher replica seals its jobs with; default: the bus identity's -nats-nkey, then -nats-creds.")
	fs.StringVar(&o.eventsAddr, "events-addr", "",
		"URL of Flux's notification-controller events receiver (as Flux's flag): every Event recorded is also posted there in Flux's format; empty posts none.")
	fs.BoolVar(&o.receivers, "receivers", false,
		"Serve Flux's Receivers (notification.toolkit.fluxcd.io/v1) with the receiver service: write their status and turn their hooks into fetch jobs. "+
			"Needs the Receiver CRD (deploy/components/receivers); leave off where Flux's notification-controller serves them.")
	fs.DurationVar(&o.hookMinInterval, "hook-min-interval", controller.DefaultHookInterval,
		"Least time between two webhook-triggered fetches of one source; hooks within it are coalesced into one fetch at its end.")
	fs.DurationVar(&o.announceInterval, "unchanged-announce-interval", controller.DefaultAnnounceInterval,
		"Longest time between two reconciles of a steady source that are reported on the bus when nothing changed "+
			"(an artifact.unchanged event, Flux's no-change trace Event); the others cost the fetch job alone. 0 reports every one.")
	fs.BoolVar(&o.alignRemotes, "align-remotes", true,
		"Check the sources that share a remote (URL and credentials) at the same moments of their interval, so that one listing answers them all; "+
			"false spreads each source by -interval-jitter-percentage instead, as Flux.")
	fs.DurationVar(&o.sourceMetricsInterval, "source-metrics-interval", 30*time.Second,
		"How often the leader exports every source's Ready condition (headwater_source_condition), from its cache.")
	fs.StringVar(&o.fluxNamespaces, "flux-source-controller-namespaces", "flux-system",
		"Namespaces (comma-separated) where Flux's source-controller Deployment must be scaled to 0 before the watcher reconciles: "+
			"it waits, not ready, until it is, and stops if it runs again. Empty checks none.")
	fs.BoolVar(&o.noCrossNamespaceRefs, "no-cross-namespace-refs", false,
		"When set to true, references between custom resources are allowed only if the reference and the referee are in the same namespace (ArtifactGenerator sources, Receiver resources), as Flux's flag; see docs/security.md.")
	fs.StringVar(&o.pluginKinds, "plugin-kinds", "",
		"Plug-in source kinds to reconcile besides Flux's, comma-separated, each <group>/<version>/<Kind>[:<interval field>] "+
			"(e.g. source.headwater.dev/v1alpha1/HTTPSource); their jobs go to each kind's own fetcher. "+
			"The watcher needs RBAC for them (docs/writing-a-source-kind.md).")
}

// fluxGuardInterval is how often the watcher looks for Flux's
// source-controller.
const fluxGuardInterval = 30 * time.Second

// namespaceList splits a comma-separated list, dropping empty and
// repeated names.
func namespaceList(s string) []string {
	var out []string
	for _, ns := range strings.Split(s, ",") {
		if ns = strings.TrimSpace(ns); ns != "" && !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return out
}

// Flags returns the role's flags as Main parses them (command.NewFlagSet),
// bound to options of their own: for tests and the flag reference
// (docs/flags.md).
func Flags() *flag.FlagSet {
	var o options
	return command.NewFlagSet(service, o.bindFlags)
}

// Main runs the watcher with args, the command line after the program's
// name (or after -target), and exits the process when it ends.
func Main(args []string) {
	var o options
	command.MainArgs(service, args, o.bindFlags, func() logr.Logger { return o.telemetry.NewLogger(service) },
		func(ctx context.Context) error { return run(ctx, o) })
}

// run builds the manager, its controllers and the results consumer, and
// reconciles until ctx ends; it logs with ctx's logger.
func run(ctx context.Context, o options) error {
	log := logr.FromContextOrDiscard(ctx)
	ctrl.SetLogger(log)
	jitter.SetGlobalIntervalJitter(o.intervalJitter/100, rand.New(rand.NewSource(time.Now().UnixNano())))

	// Every replica derives the same key from the same secret, so the
	// outcomes of jobs issued before a restart or a failover are applied.
	key, err := seal.LoadKey(o.jobKeyFile, o.bus.NKeyFile, o.bus.CredsFile)
	if err != nil {
		return err
	}

	// The endpoints answer before the watcher reaches Kubernetes and NATS:
	// alive at once, ready once it is on the bus (see package telemetry).
	// The telemetry address serves controller-runtime's registry, which
	// the manager's own servers would serve only from mgr.Start, after
	// NATS; -health-addr serves the probes alone. They stop when run
	// returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	telemetry.RegisterBuildInfo(crmetrics.Registry, service)
	onBus := bus.NewStatus()
	onBus.Register(crmetrics.Registry, service)
	var ready telemetry.Checks
	ready.Set("nats", onBus.Check)
	if err := telemetry.Serve(ctx, listenAddr(o.telemetry.Addr), crmetrics.Registry, &ready, log); err != nil {
		return err
	}
	if err := telemetry.Serve(ctx, listenAddr(o.healthAddr), nil, &ready, log.WithName("health")); err != nil {
		return err
	}

	plugins, err := sourcekind.ParseRegistrations(o.pluginKinds)
	if err != nil {
		return err
	}
	kinds := sourcekind.NewSet(plugins)
	sh, err := shard.New(o.shard)
	if err != nil {
		return err
	}
	if o.receivers && sh.ID != "" {
		// The hooks are a work queue shared by every watcher: a shard
		// would take the hooks of the others' sources.
		return fmt.Errorf("-receivers serves every source: run it on an unsharded watcher, not with -%s or -%s=false (docs/sharding.md)",
			shard.LabelSelectorFlag, shard.AllNamespacesFlag)
	}
	// owns is nil for the unsharded watcher, which owns every source.
	var owns func(client.Object) bool
	if sh.ID != "" {
		owns = sh.Owns
	}

	cfg, err := o.kube.Load()
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := sourcev1.AddToScheme(scheme); err != nil {
		return err
	}
	if err := eventsv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	if err := swv1beta1.AddToScheme(scheme); err != nil {
		return err
	}
	if o.receivers {
		if err := notificationv1.AddToScheme(scheme); err != nil {
			return err
		}
	}
	ns := o.leaderElectionNamespace
	if ns == "" {
		ns = os.Getenv("POD_NAMESPACE")
	}
	if ns == "" {
		ns = "default"
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		Logger: log,
		// Metrics and probes are served above, before NATS.
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// The watcher never reads managedFields: keeping them out of the
		// informer cache saves memory per object at thousands of sources.
		// A shard's cache holds its own sources alone, as Flux's.
		Cache:                         sh.CacheOptions(cache.Options{DefaultTransform: cache.TransformStripManagedFields()}, shardedObjects(kinds)),
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              sh.LeaseName(leaseName),
		LeaderElectionNamespace:       ns,
		LeaderElectionReleaseOnCancel: o.releaseOnCancel,
		LeaseDuration:                 positive(o.leaseDuration),
		RenewDeadline:                 positive(o.renewDeadline),
		RetryPeriod:                   positive(o.retryPeriod),
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}

	// Flux's source-controller must not reconcile the same sources: say
	// so on /readyz while waiting for it to be scaled to 0 (below).
	guard := &fluxguard.Guard{Reader: mgr.GetAPIReader(), Namespaces: namespaceList(o.fluxNamespaces),
		Selector: sh.Selector.Labels(), Namespace: sh.Namespace, Interval: fluxGuardInterval, Log: log.WithName("flux-guard")}
	ready.Set("flux-source-controller", guard.Ready)

	crds, err := kindsWaiter(cfg, scheme, kinds, o.receivers, log.WithName("crds"))
	if err != nil {
		return err
	}
	ready.Set("crds", crds.Ready)
	// What is missing (on an older Flux's CRDs, which kinds and which Flux
	// release brought them) is also a Warning Event on the watcher's Pod,
	// where `kubectl describe pod` and `kubectl get events` show it.
	if pod := os.Getenv("POD_NAME"); pod != "" {
		recorder := mgr.GetEventRecorder("headwater-watcher")
		self := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ns}}
		crds.Report = func(missing *crdwait.MissingError) {
			recorder.Eventf(self, nil, corev1.EventTypeWarning, "CRDsMissing", "WaitForCRDs", "%s", missing.Error())
		}
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
	jobs := conn.NewPublisher(service)
	// Once on the bus, the kinds must be served before the controllers
	// are set up (their field indexes need every kind mapped: an older
	// Flux's CRDs lack the ArtifactGenerator, and the watcher exited) and
	// before the manager starts its informers, which would otherwise give
	// up after two minutes and exit.
	if err := crds.Wait(ctx); err != nil {
		return err
	}

	// Every Event recorded is also posted to Flux's notification-controller
	// when -events-addr is set, as Flux's source-controller does.
	notifier, err := notify.New(notify.Options{Addr: o.eventsAddr, Scheme: scheme, Registerer: crmetrics.Registry,
		Log: log.WithName("notify")})
	if err != nil {
		return err
	}
	if notifier != nil {
		if err := mgr.Add(notifier); err != nil {
			return err
		}
	}
	jobMetrics := telemetry.NewJobMetrics(crmetrics.Registry, service)
	reconcileMetrics := controller.NewMetrics(crmetrics.Registry)
	sourceConditions := controller.NewSourceConditions(crmetrics.Registry, mgr.GetClient(), scheme, o.sourceMetricsInterval,
		log.WithName("source-conditions"))
	sourceConditions.Plugins = plugins
	if err := mgr.Add(sourceConditions); err != nil {
		return err
	}
	steady := controller.NewSteady(o.announceInterval)
	if _, err := steady.Listen(conn.NC, log.WithName("steady")); err != nil {
		return err
	}
	triggers := map[string]*controller.Triggers{}
	retries := map[string]*controller.Retries{}
	// The plug-in kinds' objects are unstructured in the cache: these
	// read and write them as sourcekind.PluginObjects.
	kubeClient, liveReader := sourcekind.PluginClient(mgr.GetClient()), sourcekind.PluginReader(mgr.GetAPIReader())
	fetchers := &controller.Fetchers{JS: conn.JS, Recheck: o.requeueDependency}
	// Fetch jobs are admitted in turn between namespaces; the queue runs
	// on the leader, as the reconcilers, and each shard has its own.
	admission := &fairshare.Queue{Next: jobs, Options: o.fairShare, Metrics: fairshare.NewMetrics(crmetrics.Registry),
		Log: log.WithName("fair-share")}
	if err := mgr.Add(admission); err != nil {
		return err
	}
	for _, kind := range kinds {
		r := &controller.Reconciler{Client: kubeClient, Live: liveReader, Kind: kind, Jobs: jobs, Admission: admission, Seal: key,
			Recorder:          &notify.Recorder{Recorder: mgr.GetEventRecorder("headwater-watcher"), Forwarder: notifier},
			RequeueDependency: o.requeueDependency, Metrics: reconcileMetrics, Steady: steady, AlignRemotes: o.alignRemotes, Fetchers: fetchers,
			Retries: &controller.Retries{New: func() client.Object { return kind.New() }, Kind: kind.Name, Metrics: reconcileMetrics,
				Base: o.minRetryDelay, Max: o.maxRetryDelay}}
		retries[kind.Name] = r.Retries
		if o.receivers {
			r.Triggers = &controller.Triggers{MinInterval: o.hookMinInterval, New: func() client.Object { return kind.New() }}
			triggers[kind.Name] = r.Triggers
		}
		if err := r.SetupWithManager(ctx, mgr, o.concurrency); err != nil {
			return fmt.Errorf("set up %s controller: %w", kind.Name, err)
		}
	}
	if o.receivers {
		rr := &receiver.Reconciler{Client: mgr.GetClient(), Live: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("headwater-watcher"),
			NoCrossNamespaceRefs: o.noCrossNamespaceRefs}
		if err := rr.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("set up receiver controller: %w", err)
		}
		if err := mgr.Add(&receiver.Hooks{Conn: conn, Client: mgr.GetClient(), Scheme: scheme, Triggers: triggers,
			Recorder: mgr.GetEventRecorder("headwater-watcher"), Metrics: jobMetrics, Log: log.WithName("hooks"),
			NoCrossNamespaceRefs: o.noCrossNamespaceRefs}); err != nil {
			return err
		}
	}
	// ArtifactGenerators: composed by the packagers, published as
	// ExternalArtifacts by the watcher.
	externalArtifacts := &externalartifact.Writer{Client: mgr.GetClient(), Metrics: externalartifact.NewMetrics(crmetrics.Registry)}
	generators := &generator.Reconciler{Client: mgr.GetClient(), Live: mgr.GetAPIReader(), Jobs: jobs, Seal: key, Owns: owns,
		Writer:   externalArtifacts,
		Recorder: &notify.Recorder{Recorder: mgr.GetEventRecorder("headwater-watcher"), Forwarder: notifier},
		Metrics:  generator.NewMetrics(crmetrics.Registry), NoCrossNamespaceRefs: o.noCrossNamespaceRefs}
	if err := generators.SetupWithManager(ctx, mgr, o.concurrency); err != nil {
		return fmt.Errorf("set up ArtifactGenerator controller: %w", err)
	}
	host, _ := os.Hostname()
	instance := results.EventSource + "-" + host
	if err := mgr.Add(&results.Consumer{
		Conn:        conn,
		Jobs:        jobs,
		Seal:        key,
		Client:      kubeClient,
		Live:        liveReader,
		Kinds:       kinds,
		Recorder:    &notify.Recorder{Recorder: mgr.GetEventRecorder(results.EventSource), Forwarder: notifier},
		Notify:      notifier,
		Instance:    instance,
		Concurrency: o.eventConcurrency,
		Metrics:     jobMetrics,
		Forged:      results.NewForgedCounter(crmetrics.Registry),
		Steady:      steady,
		Retries:     retries,
		Producers:   map[string]results.OutcomeHandler{events.ArtifactGeneratorKind: generators},
		Log:         log.WithName("results"),
		Owns:        owns,
		Done:        admission.Done,
		Consumer:    events.WatcherShardConsumer(sh.ID),
		// A plug-in kind's artifact is published as an ExternalArtifact
		// of the object's name, so Flux's kustomize- and helm-controller
		// (feature gate ExternalArtifact) consume it unchanged.
		OnArtifact: func(ctx context.Context, obj sourcekind.Object, art *meta.Artifact) error {
			_, _, err := externalArtifacts.Write(ctx, obj, externalartifact.Output{
				Name: obj.GetName(), Artifact: art, Ready: externalartifact.Stored(art)})
			return err
		},
	}); err != nil {
		return err
	}
	// Subscriptions: the dispatcher reports, the watcher keeps status.
	if err := mgr.Add(&subscriptions.Consumer{
		Conn:        conn,
		Client:      mgr.GetClient(),
		Live:        mgr.GetAPIReader(),
		Concurrency: 2,
		Metrics:     jobMetrics,
		Log:         log.WithName("subscriptions"),
	}); err != nil {
		return err
	}
	if len(guard.Namespaces) > 0 {
		if err := guard.Wait(ctx); err != nil {
			return err
		}
		if err := mgr.Add(guard); err != nil {
			return err
		}
	}
	if len(o.shard.Fleet) > 0 {
		if err := mgr.Add(&shard.Reporter{Config: cfg, Scheme: scheme, Kinds: sourceGVKs(kinds, scheme), Namespace: sh.Namespace,
			Fleet: o.shard.Fleet, Unowned: shard.NewUnownedGauge(crmetrics.Registry), Log: log.WithName("unowned")}); err != nil {
			return err
		}
	}
	log.Info("starting watcher", "shard", sh.Describe(), "lease", sh.LeaseName(leaseName), "leaderElection", o.leaderElect, "leaderElectionNamespace", ns,
		"notifications", notifier != nil, "receivers", o.receivers, "pluginKinds", o.pluginKinds)
	return mgr.Start(ctx)
}

// leaseName is the unsharded watcher's leader election lease; a shard's
// is suffixed with its ID (shard.Shard.LeaseName).
const leaseName = "headwater-watcher"

// shardedObjects are the objects a shard's selector applies to: the
// source kinds (Flux's five, as its main.go, and the plug-in kinds) and
// ArtifactGenerators, which the watcher reconciles as Flux's
// source-watcher does, with the same flag.
func shardedObjects(kinds sourcekind.Set) []client.Object {
	objs := []client.Object{&swv1beta1.ArtifactGenerator{}}
	for _, kind := range kinds {
		if reg := kind.Plugin; reg != nil {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(reg.GVK)
			objs = append(objs, u)
			continue
		}
		objs = append(objs, kind.New())
	}
	return objs
}

// sourceGVKs are the kinds' groups, versions and kinds, by name.
func sourceGVKs(kinds sourcekind.Set, scheme *runtime.Scheme) map[string]schema.GroupVersionKind {
	gvks := map[string]schema.GroupVersionKind{}
	for _, kind := range kinds {
		if reg := kind.Plugin; reg != nil {
			gvks[kind.Name] = reg.GVK
			continue
		}
		if gvk, err := apiutil.GVKForObject(kind.New(), scheme); err == nil {
			gvks[kind.Name] = gvk
		}
	}
	return gvks
}

// crdInterval is how often a watcher whose kinds are not served yet looks
// again.
const crdInterval = 10 * time.Second

// kindsWaiter is a crdwait.Waiter for the kinds the watcher reconciles:
// every source kind, the plug-in kinds among them, and Flux's Receiver
// with receivers.
func kindsWaiter(cfg *rest.Config, scheme *runtime.Scheme, kinds sourcekind.Set, receivers bool, log logr.Logger) (*crdwait.Waiter, error) {
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	objs := []runtime.Object{}
	var plugins []schema.GroupVersionKind
	for _, kind := range kinds {
		if kind.Plugin != nil {
			plugins = append(plugins, kind.Plugin.GVK)
			continue
		}
		objs = append(objs, kind.New())
	}
	objs = append(objs, &sourcev1.ExternalArtifact{}, &swv1beta1.ArtifactGenerator{})
	hint := "install the CRDs (kubectl apply -k deploy/crds, or Flux's own; a plug-in kind's with its component)"
	if receivers {
		objs = append(objs, &notificationv1.Receiver{})
		hint = "install the CRDs (kubectl apply -k deploy/crds, or Flux's own; the Receiver's with components/receivers)"
	}
	w := &crdwait.Waiter{Discovery: disco, Hint: hint, Interval: crdInterval, Log: log}
	for _, obj := range objs {
		gvk, err := apiutil.GVKForObject(obj, scheme)
		if err != nil {
			return nil, err
		}
		w.Kinds = append(w.Kinds, gvk)
	}
	w.Kinds = append(w.Kinds, plugins...)
	return w, nil
}

// positive is &d, or nil (controller-runtime's default) for a d that is
// not positive.
func positive(d time.Duration) *time.Duration {
	if d <= 0 {
		return nil
	}
	return &d
}

// listenAddr is addr for telemetry.Serve: "0", which turns a
// controller-runtime server off, is no address either.
func listenAddr(addr string) string {
	if addr == "0" {
		return ""
	}
	return addr
}
