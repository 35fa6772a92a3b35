// Package harness runs Headwater on real parts on one machine: a local
// Kubernetes control plane (kube-apiserver and etcd, the binaries envtest
// uses), NATS JetStream embedded in-process, directory storage, a smart-HTTP
// git server, and the four service binaries as separate processes.
//
// The end-to-end tests and `make run` (cmd/headwater-local) start the same
// Env, so what the tests check is what a user sees. The harness builds
// nothing: the Makefile builds the services into bin/ and the control-plane
// binaries into bin/k8s first.
package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// Service names, which are also the names of their binaries.
const (
	Watcher        = "watcher"
	Fetcher        = "fetcher"
	Packager       = "packager"
	ArtifactServer = "artifact-server"
	// Receiver is the webhook receiver, run with Config.Receivers.
	Receiver = "receiver"
	// Dispatcher delivers events to Subscriptions; it runs when
	// Config.Dispatcher is set.
	Dispatcher = "dispatcher"
	// NATS is the name of the NATS server's Service when it runs in a
	// process of its own (Config.NATSBin).
	NATS = "nats"
	// HTTPSourceFetcher fetches HTTPSources, the plug-in source kind
	// shipped as the example; it runs with Config.HTTPSource.
	HTTPSourceFetcher = "httpsource-fetcher"
)

// HTTPSourceKind is the registration of the HTTPSource plug-in kind the
// watcher gets with Config.HTTPSource (its -plugin-kinds).
const HTTPSourceKind = "source.headwater.dev/v1alpha1/HTTPSource"

// ServiceNames lists the services in start order: downstream first, so a
// job never waits for the service that takes it. They stop in reverse.
var ServiceNames = []string{ArtifactServer, Packager, Fetcher, Watcher}

// controlPlaneBinaries are the binaries envtest and the harness need in
// Config.AssetsDir.
var controlPlaneBinaries = []string{"kube-apiserver", "etcd", "kubectl"}

// ErrNotBuilt is wrapped by Config.Check errors about binaries or manifests
// that are missing: the Makefile builds them (`make kube-tools build
// manifests`, or simply `make test` / `make run`).
var ErrNotBuilt = errors.New("not built")

// Config says where an Env finds what it runs and where it keeps its state.
type Config struct {
	// Dir holds the Env's state: kubeconfig, control-plane data, NATS
	// store, artifact storage, git repositories and logs. It is created
	// if missing and left in place by Stop.
	Dir string
	// BinDir holds the four service binaries (`make build`).
	BinDir string
	// AssetsDir holds kube-apiserver, etcd and kubectl
	// (KUBEBUILDER_ASSETS, `make kube-tools`).
	AssetsDir string
	// CRDDir holds the CRD manifests (`make manifests`).
	CRDDir string
	// Progress, when set, is told about each step of Start and Stop.
	Progress func(msg string)
	// Env is added to the environment of every Headwater service
	// ("KEY=value"), after the caller's own: the OTEL_* variables that
	// turn tracing on, say.
	Env []string
	// ExtraArgs are appended to a service's command line, by service name.
	ExtraArgs map[string][]string
	// AllowedDestinations are the fetchers' and the dispatcher's
	// -allowed-destinations: nil lets them reach loopback, where every
	// server of an Env listens (the egress policy refuses it by
	// default); an empty, non-nil list leaves the default.
	AllowedDestinations []string
	// S3, when set, makes the fetcher, the packager and the artifact-server
	// share this bucket as their storage instead of the directory storage
	// (which is then left empty).
	S3 *S3Storage
	// ArtifactServerReplicas is the number of artifact-server processes;
	// 0 means 1. Every replica serves the same storage on an address of its
	// own (Env.ArtifactServerAddrs) and advertises the first's, so artifact
	// URLs name the first. More than one needs shared storage the replicas
	// all reach, as the directory on one machine or S3 are.
	ArtifactServerReplicas int
	// NATSBin, when set, is the headwater-nats binary (e2e/cmd/headwater-nats):
	// NATS then runs as `headwater-nats serve` in a process of its own, a
	// Service named NATS started before the others, instead of inside the
	// calling process, so that its CPU and memory can be measured apart.
	NATSBin string
	// NoServices starts the control plane, NATS and the git server only:
	// the caller runs the controller under test itself (StartService), as
	// the benchmark runs Flux's source-controller side by side.
	NoServices bool
	// WatcherReplicas is the number of watcher processes; 0 means 1. Every
	// replica has telemetry and health addresses and a log of its own and
	// the same command line otherwise, so with leader election (the
	// watcher's default) one leads and the others stand by.
	WatcherReplicas int
	// WatcherArgs are further arguments of each watcher replica, the
	// i-th's for the i-th (watcher, watcher-2, ...), after ExtraArgs: a
	// watcher shard per replica with -watch-label-selector
	// (docs/sharding.md).
	WatcherArgs [][]string
	// FetcherReplicas and PackagerReplicas are the numbers of fetcher and
	// packager processes; 0 means 1. Every replica has a telemetry address
	// and a log of its own and the same command line otherwise; they share
	// their service's durable consumer, so each job goes to one of them.
	FetcherReplicas, PackagerReplicas int
	// Receivers serves Flux's Receivers, as the receivers component does:
	// the Receiver CRD from ReceiverCRDDir is installed, the watcher runs
	// with -receivers, and the receiver service starts after the others,
	// on Env.ReceiverAddr.
	Receivers bool
	// ReceiverCRDDir holds the Receiver CRD (`make manifests`), with
	// Receivers.
	ReceiverCRDDir string
	// Dispatcher runs the dispatcher too (Subscriptions), started last
	// and stopped first; the tests and scenarios that need no
	// Subscription leave it out.
	Dispatcher bool
	// HTTPSource runs the HTTPSource plug-in kind, as the httpsource
	// component deploys it: its CRD from HTTPSourceCRDDir is installed,
	// the watcher reconciles it (-plugin-kinds HTTPSourceKind), the NATS
	// server admits its fetcher's identity (plugin-httpsource) and the
	// httpsource-fetcher runs with it.
	HTTPSource bool
	// HTTPSourceCRDDir holds the HTTPSource CRD (`make manifests`), with
	// HTTPSource.
	HTTPSourceCRDDir string
	// PluginKinds are further plug-in kinds the watcher reconciles
	// (-plugin-kinds registrations) whose fetchers the Env does not run,
	// their CRDs in PluginCRDDir.
	PluginKinds []string
	// PluginCRDDir holds the CRDs of PluginKinds.
	PluginCRDDir string
	// AuditLog makes kube-apiserver write an audit event of every request,
	// at the Metadata level (who, which user agent, which verb and object,
	// when; no bodies), to Env.AuditLogPath as JSON lines: the benchmark
	// counts each system's requests by user agent with it.
	AuditLog bool
}

// Check reports every binary or manifest the Env needs that is missing; the
// error wraps ErrNotBuilt.
func (c Config) Check() error {
	var missing []string
	// need notes each of names missing from dir, with the make target
	// that builds it.
	need := func(dir, what, target string, names []string) {
		if dir == "" {
			missing = append(missing, fmt.Sprintf("%s is not set (run `make %s`)", what, target))
			return
		}
		for _, name := range names {
			fi, err := os.Stat(filepath.Join(dir, name))
			if err != nil || fi.IsDir() {
				missing = append(missing, fmt.Sprintf("%s not found in %s (%s; run `make %s`)", name, dir, what, target))
			}
		}
	}
	need(c.AssetsDir, "KUBEBUILDER_ASSETS", "kube-tools", controlPlaneBinaries)
	if !c.NoServices {
		need(c.BinDir, "the service bin directory", "build", ServiceNames)
		if c.Receivers {
			need(c.BinDir, "the service bin directory", "build", []string{Receiver})
		}
		if c.Dispatcher {
			need(c.BinDir, "the service bin directory", "build", []string{Dispatcher})
		}
		if c.HTTPSource {
			need(c.BinDir, "the service bin directory", "build", []string{HTTPSourceFetcher})
		}
	}
	if c.HTTPSource {
		if m, _ := filepath.Glob(filepath.Join(c.HTTPSourceCRDDir, "*.yaml")); len(m) == 0 {
			missing = append(missing, "no HTTPSource CRD in "+c.HTTPSourceCRDDir)
		}
	}
	if c.Receivers {
		if m, _ := filepath.Glob(filepath.Join(c.ReceiverCRDDir, "*.yaml")); len(m) == 0 {
			missing = append(missing, "no Receiver CRD in "+c.ReceiverCRDDir)
		}
	}
	if c.CRDDir == "" {
		missing = append(missing, "the CRD directory is not set")
	} else if m, _ := filepath.Glob(filepath.Join(c.CRDDir, "*.yaml")); len(m) == 0 {
		missing = append(missing, "no CRD manifests in "+c.CRDDir)
	}
	if c.Dir == "" {
		missing = append(missing, "the state directory is not set")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s", ErrNotBuilt, strings.Join(missing, "; "))
	}
	return nil
}

// progress reports a step, if anyone listens.
func (c Config) progress(msg string) {
	if c.Progress != nil {
		c.Progress(msg)
	}
}

// pluginKinds are the plug-in kinds the Env runs, by kind name.
func (c Config) pluginKinds() []string {
	if c.HTTPSource {
		return []string{"HTTPSource"}
	}
	return nil
}

// pluginIdentities are the bus identities of their fetchers.
func (c Config) pluginIdentities() []string {
	var ids []string
	for _, k := range c.pluginKinds() {
		ids = append(ids, events.PluginIdentity(k))
	}
	return ids
}
