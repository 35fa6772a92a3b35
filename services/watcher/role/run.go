package role

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/jitter"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	eventsv1alpha1 "github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/events"
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

// run builds the manager, its controllers and the bus consumers, one step
// after the other, and reconciles until ctx ends; it logs with ctx's
// logger.
func run(ctx context.Context, o options) error {
	log := logr.FromContextOrDiscard(ctx)
	ctrl.SetLogger(log)
	jitter.SetGlobalIntervalJitter(o.intervalJitter/100, rand.New(rand.NewSource(time.Now().UnixNano())))
	// The endpoints and the bus connection stop when run returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := &watcher{o: o, log: log}
	defer w.close()
	if err := command.Steps(ctx,
		w.loadKey,
		w.serveEndpoints,
		w.parseKinds,
		w.takeShard,
		w.newManager,
		w.checkPrerequisites,
		w.connect,
		w.waitForCRDs,
		w.addShared,
		w.setupSources,
		w.setupReceivers,
		w.setupGenerators,
		w.addConsumers,
		w.waitForFlux,
		w.addShardReporter,
	); err != nil {
		return err
	}
	log.Info("starting watcher", "shard", w.shard.Describe(), "lease", w.shard.LeaseName(leaseName), "leaderElection", o.leaderElect,
		"leaderElectionNamespace", w.leaseNamespace, "notifications", w.notifier != nil, "receivers", o.receivers, "pluginKinds", o.pluginKinds)
	return w.mgr.Start(ctx)
}

// watcher is what run builds before it starts the manager. Each of its
// methods that run lists is one step: it fills the fields the later steps
// use, and wraps its errors with what it was doing.
type watcher struct {
	o   options
	log logr.Logger

	key   *seal.Key
	onBus *bus.Status
	ready telemetry.Checks

	plugins []sourcekind.Registration
	kinds   sourcekind.Set
	shard   *shard.Shard
	// owns is nil for the unsharded watcher, which owns every source.
	owns func(client.Object) bool

	cfg            *rest.Config
	scheme         *runtime.Scheme
	leaseNamespace string
	mgr            ctrl.Manager
	guard          *fluxguard.Guard
	crds           *crdwait.Waiter

	conn *bus.Conn
	jobs *bus.Publisher
	// admission admits fetch jobs in turn between namespaces (package
	// fairshare); it runs on the leader, as the reconcilers, and each
	// shard has its own.
	admission *fairshare.Queue

	notifier         *notify.Forwarder
	jobMetrics       *telemetry.JobMetrics
	reconcileMetrics *controller.Metrics
	steady           *controller.Steady
	// kubeClient and liveReader read and write the plug-in kinds'
	// objects, unstructured in the cache, as sourcekind.PluginObjects.
	kubeClient client.Client
	liveReader client.Reader
	// triggers and retries are the source controllers', by kind name.
	triggers          map[string]*controller.Triggers
	retries           map[string]*controller.Retries
	externalArtifacts *externalartifact.Writer
	generators        *generator.Reconciler
}

// close closes the bus connection, if connect made one.
func (w *watcher) close() {
	if w.conn != nil {
		w.conn.Close()
	}
}

// loadKey loads the key jobs are sealed with. Every replica derives the
// same key from the same secret, so the outcomes of jobs issued before a
// restart or a failover are applied.
func (w *watcher) loadKey(context.Context) error {
	key, err := seal.LoadKey(w.o.jobKeyFile, w.o.bus.NKeyFile, w.o.bus.CredsFile)
	if err != nil {
		return fmt.Errorf("load the job key: %w", err)
	}
	w.key = key
	return nil
}

// serveEndpoints serves metrics and probes before the watcher reaches
// Kubernetes and NATS: alive at once, ready once it is on the bus (see
// package telemetry). The telemetry address serves controller-runtime's
// registry, which the manager's own servers would serve only from
// mgr.Start, after NATS; -health-addr serves the probes alone. They stop
// when ctx ends.
func (w *watcher) serveEndpoints(ctx context.Context) error {
	telemetry.RegisterBuildInfo(crmetrics.Registry, service)
	w.onBus = bus.NewStatus()
	w.onBus.Register(crmetrics.Registry, service)
	w.ready.Set("nats", w.onBus.Check)
	if err := telemetry.Serve(ctx, listenAddr(w.o.telemetry.Addr), crmetrics.Registry, &w.ready, w.log); err != nil {
		return fmt.Errorf("serve metrics and probes: %w", err)
	}
	if err := telemetry.Serve(ctx, listenAddr(w.o.healthAddr), nil, &w.ready, w.log.WithName("health")); err != nil {
		return fmt.Errorf("serve probes: %w", err)
	}
	return nil
}

// parseKinds reads the plug-in kinds (-plugin-kinds) and makes the set of
// kinds reconciled: Flux's and those.
func (w *watcher) parseKinds(context.Context) error {
	plugins, err := sourcekind.ParseRegistrations(w.o.pluginKinds)
	if err != nil {
		return fmt.Errorf("plug-in kinds: %w", err)
	}
	w.plugins, w.kinds = plugins, sourcekind.NewSet(plugins)
	return nil
}

// takeShard reads the watcher's share of the sources (package shard).
func (w *watcher) takeShard(context.Context) error {
	sh, err := shard.New(w.o.shard)
	if err != nil {
		return fmt.Errorf("shard: %w", err)
	}
	if w.o.receivers && sh.ID != "" {
		// The hooks are a work queue shared by every watcher: a shard
		// would take the hooks of the others' sources.
		return fmt.Errorf("-receivers serves every source: run it on an unsharded watcher, not with -%s or -%s=false (docs/sharding.md)",
			shard.LabelSelectorFlag, shard.AllNamespacesFlag)
	}
	w.shard = sh
	if sh.ID != "" {
		w.owns = sh.Owns
	}
	return nil
}

// newManager builds the scheme and the manager of the kinds reconciled,
// its cache limited to the shard's objects.
func (w *watcher) newManager(context.Context) error {
	cfg, err := w.o.kube.Load()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	w.cfg = cfg
	if w.scheme, err = newScheme(w.o.receivers); err != nil {
		return fmt.Errorf("scheme: %w", err)
	}
	w.leaseNamespace = w.o.leaderElectionNamespace
	if w.leaseNamespace == "" {
		w.leaseNamespace = os.Getenv("POD_NAMESPACE")
	}
	if w.leaseNamespace == "" {
		w.leaseNamespace = "default"
	}
	w.mgr, err = ctrl.NewManager(w.cfg, ctrl.Options{
		Scheme: w.scheme,
		Logger: w.log,
		// Metrics and probes are served by serveEndpoints, before NATS.
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// The watcher never reads managedFields: keeping them out of the
		// informer cache saves memory per object at thousands of sources.
		// A shard's cache holds its own sources alone, as Flux's.
		Cache:                         w.shard.CacheOptions(cache.Options{DefaultTransform: cache.TransformStripManagedFields()}, shardedObjects(w.kinds)),
		LeaderElection:                w.o.leaderElect,
		LeaderElectionID:              w.shard.LeaseName(leaseName),
		LeaderElectionNamespace:       w.leaseNamespace,
		LeaderElectionReleaseOnCancel: w.o.releaseOnCancel,
		LeaseDuration:                 positive(w.o.leaseDuration),
		RenewDeadline:                 positive(w.o.renewDeadline),
		RetryPeriod:                   positive(w.o.retryPeriod),
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	return nil
}

// newScheme is the scheme of every kind the watcher reads or writes:
// Flux's Receiver too with receivers.
func newScheme(receivers bool) (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	add := []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, sourcev1.AddToScheme,
		eventsv1alpha1.AddToScheme, swv1beta1.AddToScheme}
	if receivers {
		add = append(add, notificationv1.AddToScheme)
	}
	for _, f := range add {
		if err := f(scheme); err != nil {
			return nil, err
		}
	}
	return scheme, nil
}

// checkPrerequisites says on /readyz whether Flux's source-controller is
// scaled to 0 (it must not reconcile the same sources) and whether the
// kinds' CRDs are served; waitForCRDs and waitForFlux wait for them. What
// is missing (on an older Flux's CRDs, which kinds and which Flux release
// brought them) is also a Warning Event on the watcher's Pod, where
// `kubectl describe pod` and `kubectl get events` show it.
func (w *watcher) checkPrerequisites(context.Context) error {
	w.guard = &fluxguard.Guard{Reader: w.mgr.GetAPIReader(), Namespaces: namespaceList(w.o.fluxNamespaces),
		Selector: w.shard.Selector.Labels(), Namespace: w.shard.Namespace, Interval: fluxGuardInterval, Log: w.log.WithName("flux-guard")}
	w.ready.Set("flux-source-controller", w.guard.Ready)

	crds, err := kindsWaiter(w.cfg, w.scheme, w.kinds, w.o.receivers, w.log.WithName("crds"))
	if err != nil {
		return fmt.Errorf("CRD check: %w", err)
	}
	w.crds = crds
	w.ready.Set("crds", crds.Ready)
	if pod := os.Getenv("POD_NAME"); pod != "" {
		recorder := w.mgr.GetEventRecorder("headwater-watcher")
		self := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: w.leaseNamespace}}
		crds.Report = func(missing *crdwait.MissingError) {
			recorder.Eventf(self, nil, corev1.EventTypeWarning, "CRDsMissing", "WaitForCRDs", "%s", missing.Error())
		}
	}
	return nil
}

// connect joins the bus, makes sure of its streams and makes the job
// publisher.
func (w *watcher) connect(ctx context.Context) error {
	conn, err := bus.Connect(ctx, w.o.bus, service, w.log, bus.ReportTo(w.onBus))
	if err != nil {
		return fmt.Errorf("connect to the bus: %w", err)
	}
	w.conn = conn
	if err := conn.EnsureStreams(ctx); err != nil {
		return fmt.Errorf("bus streams: %w", err)
	}
	w.onBus.Up(conn)
	w.jobs = conn.NewPublisher(service)
	return nil
}

// waitForCRDs waits, on the bus, for every kind to be served. That must
// come before the controllers are set up (their field indexes need every
// kind mapped: an older Flux's CRDs lack the ArtifactGenerator, and the
// watcher exited) and before the manager starts its informers, which
// would otherwise give up after two minutes and exit.
func (w *watcher) waitForCRDs(ctx context.Context) error {
	if err := w.crds.Wait(ctx); err != nil {
		return fmt.Errorf("wait for the CRDs: %w", err)
	}
	return nil
}

// addShared adds what every controller shares: the notifier (every Event
// recorded is also posted to Flux's notification-controller when
// -events-addr is set, as Flux's source-controller does), the metrics,
// and the steady sources' announcements.
func (w *watcher) addShared(context.Context) error {
	notifier, err := notify.New(notify.Options{Addr: w.o.eventsAddr, Scheme: w.scheme, Registerer: crmetrics.Registry,
		Log: w.log.WithName("notify")})
	if err != nil {
		return fmt.Errorf("notifier: %w", err)
	}
	w.notifier = notifier
	if notifier != nil {
		if err := w.mgr.Add(notifier); err != nil {
			return fmt.Errorf("add the notifier: %w", err)
		}
	}
	w.jobMetrics = telemetry.NewJobMetrics(crmetrics.Registry, service)
	w.reconcileMetrics = controller.NewMetrics(crmetrics.Registry)
	sourceConditions := controller.NewSourceConditions(crmetrics.Registry, w.mgr.GetClient(), w.scheme, w.o.sourceMetricsInterval,
		w.log.WithName("source-conditions"))
	sourceConditions.Plugins = w.plugins
	if err := w.mgr.Add(sourceConditions); err != nil {
		return fmt.Errorf("add the source conditions: %w", err)
	}
	w.steady = controller.NewSteady(w.o.announceInterval)
	if _, err := w.steady.Listen(w.conn.NC, w.log.WithName("steady")); err != nil {
		return fmt.Errorf("steady sources: %w", err)
	}
	return nil
}

// setupSources sets up one controller per source kind.
func (w *watcher) setupSources(ctx context.Context) error {
	w.triggers = map[string]*controller.Triggers{}
	w.retries = map[string]*controller.Retries{}
	w.kubeClient, w.liveReader = sourcekind.PluginClient(w.mgr.GetClient()), sourcekind.PluginReader(w.mgr.GetAPIReader())
	fetchers := &controller.Fetchers{JS: w.conn.JS, Recheck: w.o.requeueDependency}
	w.admission = &fairshare.Queue{Next: w.jobs, Options: w.o.fairShare, Metrics: fairshare.NewMetrics(crmetrics.Registry),
		Backlog: fairshare.ConsumerBacklog{JS: w.conn.JS}, Log: w.log.WithName("fair-share")}
	if err := w.mgr.Add(w.admission); err != nil {
		return fmt.Errorf("fair share: %w", err)
	}
	for _, kind := range w.kinds {
		r := &controller.Reconciler{Client: w.kubeClient, Live: w.liveReader, Kind: kind, Jobs: w.jobs, Admission: w.admission, Seal: w.key,
			NewQueue:          w.o.fairShare.NewWorkQueue(),
			Recorder:          &notify.Recorder{Recorder: w.mgr.GetEventRecorder("headwater-watcher"), Forwarder: w.notifier},
			RequeueDependency: w.o.requeueDependency, Metrics: w.reconcileMetrics, Steady: w.steady, AlignRemotes: w.o.alignRemotes, Fetchers: fetchers,
			Retries: &controller.Retries{New: func() client.Object { return kind.New() }, Kind: kind.Name, Metrics: w.reconcileMetrics,
				Base: w.o.minRetryDelay, Max: w.o.maxRetryDelay}}
		w.retries[kind.Name] = r.Retries
		if w.o.receivers {
			r.Triggers = &controller.Triggers{MinInterval: w.o.hookMinInterval, New: func() client.Object { return kind.New() }}
			w.triggers[kind.Name] = r.Triggers
		}
		if err := r.SetupWithManager(ctx, w.mgr, w.o.concurrency); err != nil {
			return fmt.Errorf("set up %s controller: %w", kind.Name, err)
		}
	}
	return nil
}

// setupReceivers sets up Flux's Receivers and their hooks, with
// -receivers.
func (w *watcher) setupReceivers(context.Context) error {
	if !w.o.receivers {
		return nil
	}
	rr := &receiver.Reconciler{Client: w.mgr.GetClient(), Live: w.mgr.GetAPIReader(), Recorder: w.mgr.GetEventRecorder("headwater-watcher"),
		NoCrossNamespaceRefs: w.o.noCrossNamespaceRefs}
	if err := rr.SetupWithManager(w.mgr); err != nil {
		return fmt.Errorf("set up receiver controller: %w", err)
	}
	if err := w.mgr.Add(&receiver.Hooks{Conn: w.conn, Client: w.mgr.GetClient(), Scheme: w.scheme, Triggers: w.triggers,
		Recorder: w.mgr.GetEventRecorder("headwater-watcher"), Metrics: w.jobMetrics, Log: w.log.WithName("hooks"),
		NoCrossNamespaceRefs: w.o.noCrossNamespaceRefs}); err != nil {
		return fmt.Errorf("add the hooks consumer: %w", err)
	}
	return nil
}

// setupGenerators sets up ArtifactGenerators: composed by the packagers,
// published as ExternalArtifacts by the watcher.
func (w *watcher) setupGenerators(ctx context.Context) error {
	w.externalArtifacts = &externalartifact.Writer{Client: w.mgr.GetClient(), Metrics: externalartifact.NewMetrics(crmetrics.Registry)}
	w.generators = &generator.Reconciler{Client: w.mgr.GetClient(), Live: w.mgr.GetAPIReader(), Jobs: w.jobs, Seal: w.key, Owns: w.owns,
		Writer:   w.externalArtifacts,
		Recorder: &notify.Recorder{Recorder: w.mgr.GetEventRecorder("headwater-watcher"), Forwarder: w.notifier},
		Metrics:  generator.NewMetrics(crmetrics.Registry), NoCrossNamespaceRefs: w.o.noCrossNamespaceRefs,
		NewQueue: w.o.fairShare.NewWorkQueue()}
	if err := w.generators.SetupWithManager(ctx, w.mgr, w.o.concurrency); err != nil {
		return fmt.Errorf("set up ArtifactGenerator controller: %w", err)
	}
	return nil
}

// addConsumers adds the bus consumers: the jobs' outcomes (into the
// sources' and generators' status) and the dispatcher's delivery reports
// (into the Subscriptions' status).
func (w *watcher) addConsumers(ctx context.Context) error {
	host, _ := os.Hostname()
	// EnsureStreams made the bucket of the outcome order.
	orderKV, err := w.conn.JS.KeyValue(ctx, events.OrderBucket)
	if err != nil {
		return fmt.Errorf("key-value bucket %s: %w", events.OrderBucket, err)
	}
	if err := w.mgr.Add(&results.Consumer{
		Conn:        w.conn,
		Jobs:        w.jobs,
		Seal:        w.key,
		Client:      w.kubeClient,
		Live:        w.liveReader,
		Kinds:       w.kinds,
		Recorder:    &notify.Recorder{Recorder: w.mgr.GetEventRecorder(results.EventSource), Forwarder: w.notifier},
		Notify:      w.notifier,
		Instance:    results.EventSource + "-" + host,
		Concurrency: w.o.eventConcurrency,
		Metrics:     w.jobMetrics,
		Forged:      results.NewForgedCounter(crmetrics.Registry),
		Superseded:  results.NewSupersededCounter(crmetrics.Registry),
		OrderStore:  results.KVOrder{KV: orderKV},
		Steady:      w.steady,
		Retries:     w.retries,
		Producers:   map[string]results.OutcomeHandler{events.ArtifactGeneratorKind: w.generators},
		Log:         w.log.WithName("results"),
		Owns:        w.owns,
		Done:        w.admission.Done,
		Consumer:    events.WatcherShardConsumer(w.shard.ID),
		// A plug-in kind's artifact is published as an ExternalArtifact
		// of the object's name, so Flux's kustomize- and helm-controller
		// (feature gate ExternalArtifact) consume it unchanged.
		OnArtifact: func(ctx context.Context, obj sourcekind.Object, art *meta.Artifact) error {
			_, _, err := w.externalArtifacts.Write(ctx, obj, externalartifact.Output{
				Name: obj.GetName(), Artifact: art, Ready: externalartifact.Stored(art)})
			return err
		},
	}); err != nil {
		return fmt.Errorf("add the results consumer: %w", err)
	}
	// Subscriptions: the dispatcher reports, the watcher keeps status.
	if err := w.mgr.Add(&subscriptions.Consumer{
		Conn:        w.conn,
		Client:      w.mgr.GetClient(),
		Live:        w.mgr.GetAPIReader(),
		Concurrency: 2,
		Metrics:     w.jobMetrics,
		Log:         w.log.WithName("subscriptions"),
	}); err != nil {
		return fmt.Errorf("add the subscriptions consumer: %w", err)
	}
	return nil
}

// waitForFlux waits for Flux's source-controller to be scaled to 0 in the
// namespaces watched for it (-flux-source-controller-namespaces), then
// keeps watching: the watcher stops if it runs again.
func (w *watcher) waitForFlux(ctx context.Context) error {
	if len(w.guard.Namespaces) == 0 {
		return nil
	}
	if err := w.guard.Wait(ctx); err != nil {
		return fmt.Errorf("wait for Flux's source-controller to be scaled to 0: %w", err)
	}
	if err := w.mgr.Add(w.guard); err != nil {
		return fmt.Errorf("add the Flux guard: %w", err)
	}
	return nil
}

// addShardReporter reports the sources no shard of the fleet owns, with
// -fleet-selectors.
func (w *watcher) addShardReporter(context.Context) error {
	if len(w.o.shard.Fleet) == 0 {
		return nil
	}
	if err := w.mgr.Add(&shard.Reporter{Config: w.cfg, Scheme: w.scheme, Kinds: sourceGVKs(w.kinds, w.scheme), Namespace: w.shard.Namespace,
		Fleet: w.o.shard.Fleet, Unowned: shard.NewUnownedGauge(crmetrics.Registry), Log: w.log.WithName("unowned")}); err != nil {
		return fmt.Errorf("add the unowned sources reporter: %w", err)
	}
	return nil
}
