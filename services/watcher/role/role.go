// Package role is the watcher's main (Main), importable so that the watcher
// command and the headwater command (headwater -target=watcher) run the same
// service; the watcher command's documentation says what it does.
package role

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/kubeconfig"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/watcher/internal/controller"
	"github.com/headwater-gitops/headwater/services/watcher/internal/crdwait"
	"github.com/headwater-gitops/headwater/services/watcher/internal/fairshare"
	"github.com/headwater-gitops/headwater/services/watcher/internal/shard"
	"github.com/headwater-gitops/headwater/services/watcher/internal/sourcekind"
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
		"How often a source waiting for another one (an include without an artifact) looks again (as Flux), and a source whose fetch job the bus refused (NATS down, JetStream without quorum) tries again.")
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
