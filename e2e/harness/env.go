package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	eventsv1alpha1 "github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// NATSOption authenticates a NATS client as identity (an events identity or
// natsserver.Admin).
func (e *Env) NATSOption(identity string) (nats.Option, error) {
	return nats.NkeyOptionFromSeed(e.NATSIdentities.SeedFiles[identity])
}

// Env is Headwater running on real parts. Start brings it up; Stop takes
// down, in reverse order, everything Start started.
type Env struct {
	// Config is what the Env was started with.
	Config Config
	// RESTConfig talks to the API server as a cluster admin.
	RESTConfig *rest.Config
	// Scheme knows the Kubernetes built-in types, Flux's source.toolkit.fluxcd.io/v1
	// and source.extensions.fluxcd.io/v1beta1 (ArtifactGenerator).
	Scheme *runtime.Scheme
	// Client is a typed client on Scheme.
	Client client.Client
	// Kubeconfig is the path of an admin kubeconfig file for the API server.
	Kubeconfig string
	// NATSURL is the embedded NATS server's client URL.
	NATSURL string
	// NATSMonitorAddr is the host:port of NATS's monitoring endpoint
	// (/varz) when NATS runs in a process of its own; "" otherwise.
	NATSMonitorAddr string
	// NATSIdentities are the keys of the bus identities: the server admits
	// only them, each with its permissions, as deployed.
	NATSIdentities *natsserver.Identities
	// StoragePath is the directory storage shared by the services.
	StoragePath string
	// ArtifactAddr is the artifact-server's advertised host:port, the
	// authority of every artifact URL.
	ArtifactAddr string
	// ReceiverAddr is where the webhook receiver serves /hook/<digest>
	// (host:port), with Config.Receivers.
	ReceiverAddr string
	// ArtifactServerAddrs are the addresses the artifact-server replicas
	// listen on, the first being ArtifactAddr; each serves every artifact.
	ArtifactServerAddrs []string
	// Git serves the repositories under GitRoot over smart HTTP.
	Git *gitserver.Server
	// GitRoot holds the served bare repositories.
	GitRoot string
	// AuditLogPath is kube-apiserver's audit log, with Config.AuditLog.
	AuditLogPath string

	controlPlane *envtest.Environment
	nats         *server.Server
	natsPort     int // the port of the embedded NATS server StopNATS stopped
	services     []*Service
	logFiles     []*os.File // the control plane's output
}

// Start brings up the control plane (with the CRDs installed), embedded
// NATS, the storage directory, the git server and the four services, in that
// order, and returns once every service is ready. On error it stops what it
// had started.
func Start(ctx context.Context, c Config) (_ *Env, err error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	e := &Env{Config: c}
	defer func() {
		if err != nil {
			_ = e.Stop()
		}
	}()
	for _, d := range []string{"kube", "nats", "storage", "git", "work", "logs"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
	}
	if err := e.startControlPlane(); err != nil {
		return nil, err
	}

	c.progress("starting NATS JetStream (embedded, a throwaway key per service)")
	keys := filepath.Join(c.Dir, "nats-keys")
	if err := os.MkdirAll(keys, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	if e.NATSIdentities, err = natsserver.NewIdentities(keys, c.pluginIdentities()...); err != nil {
		return nil, err
	}
	if c.NATSBin != "" {
		if err := e.startNATSProcess(ctx, keys); err != nil {
			return nil, err
		}
	} else {
		e.nats, err = natsserver.Start(e.natsOptions(0))
		if err != nil {
			return nil, err
		}
		e.NATSURL = e.nats.ClientURL()
	}

	e.StoragePath = filepath.Join(c.Dir, "storage")
	if c.S3 != nil {
		c.progress("using S3 storage " + c.S3.String())
	} else {
		c.progress("using directory storage " + e.StoragePath)
	}

	e.GitRoot = filepath.Join(c.Dir, "git")
	e.Git = &gitserver.Server{Root: e.GitRoot}
	if err := e.Git.Start("127.0.0.1:0"); err != nil {
		return nil, err
	}
	c.progress("serving git repositories at " + e.Git.URL())

	if c.NoServices {
		return e, nil
	}
	if err := e.defineServices(); err != nil {
		return nil, err
	}
	for _, s := range e.services {
		if s.Running() {
			continue // NATS, started above
		}
		c.progress(fmt.Sprintf("starting %s (log %s)", s.Name, s.LogPath))
		if err := s.Start(ctx); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// startNATSProcess runs NATS as `headwater-nats serve` (Config.NATSBin), a
// Service of its own, admitting the identities whose seeds are in keys.
func (e *Env) startNATSProcess(ctx context.Context, keys string) error {
	ports, err := FreePorts(2)
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	monitor := "127.0.0.1:" + strconv.Itoa(ports[1])
	s := &Service{
		Name: NATS,
		Path: e.Config.NATSBin,
		Args: []string{"serve", "-keys", keys, "-store", filepath.Join(e.Config.Dir, "nats"),
			"-addr", addr, "-monitor-addr", monitor, "-plugin-kinds", strings.Join(e.Config.pluginKinds(), ",")},
		Env:      serviceEnv(""),
		LogPath:  filepath.Join(e.Config.Dir, "logs", NATS+".log"),
		ReadyURL: "http://" + monitor + "/healthz?js-enabled-only=true",
	}
	e.Config.progress(fmt.Sprintf("starting NATS JetStream in its own process (log %s)", s.LogPath))
	if err := e.StartService(ctx, s); err != nil {
		return err
	}
	e.NATSURL = "nats://" + addr
	e.NATSMonitorAddr = monitor
	return nil
}

// StartService starts s beside the Env's own services and waits until it
// is ready; Stop stops it (before the services started earlier). Services
// and Service list it. The benchmark runs Flux's source-controller so.
func (e *Env) StartService(ctx context.Context, s *Service) error {
	e.services = append(e.services, s)
	return s.Start(ctx)
}

// startControlPlane starts etcd and kube-apiserver with envtest, installs
// the CRDs and writes an admin kubeconfig for the service processes.
func (e *Env) startControlPlane() error {
	c := e.Config
	c.progress("starting kube-apiserver and etcd")
	kubeDir := filepath.Join(c.Dir, "kube")
	apiLog, err := os.Create(filepath.Join(c.Dir, "logs", "kube-apiserver.log"))
	if err != nil {
		return fmt.Errorf("control plane log: %w", err)
	}
	etcdLog, err := os.Create(filepath.Join(c.Dir, "logs", "etcd.log"))
	if err != nil {
		_ = apiLog.Close()
		return fmt.Errorf("control plane log: %w", err)
	}
	e.logFiles = append(e.logFiles, apiLog, etcdLog)
	e.Scheme = runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(e.Scheme); err != nil {
		return fmt.Errorf("scheme: %w", err)
	}
	if err := eventsv1alpha1.AddToScheme(e.Scheme); err != nil {
		return fmt.Errorf("scheme: %w", err)
	}
	if err := sourcev1.AddToScheme(e.Scheme); err != nil {
		return fmt.Errorf("scheme: %w", err)
	}
	if err := swv1beta1.AddToScheme(e.Scheme); err != nil {
		return fmt.Errorf("scheme: %w", err)
	}
	crdDirs := []string{c.CRDDir}
	if c.HTTPSource {
		crdDirs = append(crdDirs, c.HTTPSourceCRDDir)
	}
	if len(c.PluginKinds) > 0 {
		crdDirs = append(crdDirs, c.PluginCRDDir)
	}
	if c.Receivers {
		if err := notificationv1.AddToScheme(e.Scheme); err != nil {
			return fmt.Errorf("scheme: %w", err)
		}
		crdDirs = append(crdDirs, c.ReceiverCRDDir)
	}
	useExisting := false
	e.controlPlane = &envtest.Environment{
		Scheme:                e.Scheme,
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: c.AssetsDir,
		UseExistingCluster:    &useExisting,
		ControlPlane: envtest.ControlPlane{
			APIServer: &envtest.APIServer{
				Path:    filepath.Join(c.AssetsDir, "kube-apiserver"),
				CertDir: filepath.Join(kubeDir, "pki"),
				Out:     apiLog,
				Err:     apiLog,
			},
			Etcd: &envtest.Etcd{
				Path:    filepath.Join(c.AssetsDir, "etcd"),
				DataDir: filepath.Join(kubeDir, "etcd"),
				Out:     etcdLog,
				Err:     etcdLog,
			},
			KubectlPath: filepath.Join(c.AssetsDir, "kubectl"),
		},
	}
	for _, d := range []string{"pki", "etcd"} {
		if err := os.MkdirAll(filepath.Join(kubeDir, d), 0o700); err != nil {
			return fmt.Errorf("control plane directory: %w", err)
		}
	}
	if c.AuditLog {
		if err := e.configureAuditLog(kubeDir); err != nil {
			return err
		}
	}
	e.RESTConfig, err = e.controlPlane.Start()
	if err != nil {
		return fmt.Errorf("start control plane (logs in %s): %w", filepath.Join(c.Dir, "logs"), err)
	}
	e.Client, err = client.New(e.RESTConfig, client.Options{Scheme: e.Scheme})
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	e.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := os.WriteFile(e.Kubeconfig, e.controlPlane.KubeConfig, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	c.progress("kube-apiserver is up at " + e.RESTConfig.Host)
	return nil
}

// auditPolicy logs every request once it has completed (and a watch once
// it has started too) at the Metadata level.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

// configureAuditLog makes kube-apiserver log every request to
// Env.AuditLogPath (Config.AuditLog).
func (e *Env) configureAuditLog(kubeDir string) error {
	policy := filepath.Join(kubeDir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return fmt.Errorf("audit policy: %w", err)
	}
	e.AuditLogPath = filepath.Join(e.Config.Dir, "logs", "kube-apiserver-audit.log")
	e.controlPlane.ControlPlane.APIServer.Configure().
		Set("audit-policy-file", policy).
		Set("audit-log-path", e.AuditLogPath).
		Set("audit-log-format", "json").
		// Written as each request completes, so a reader sees every request
		// of a window that has ended.
		Set("audit-log-mode", "blocking")
	return nil
}

// defineServices picks free ports and builds the command line of each service.
func (e *Env) defineServices() error {
	extraServers := 2 * e.Config.extraArtifactServers()
	extraWatchers := 2 * e.Config.extraWatchers()
	extraWorkers := max(e.Config.FetcherReplicas-1, 0) + max(e.Config.PackagerReplicas-1, 0)
	// The last two are the receiver's, the one before the dispatcher's.
	ports, err := FreePorts(9 + extraServers + extraWatchers + extraWorkers)
	if err != nil {
		return err
	}
	receiverPorts, ports := ports[len(ports)-2:], ports[:len(ports)-2]
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	e.ArtifactAddr = addr(0)
	telemetry := map[string]string{ArtifactServer: addr(1), Packager: addr(2), Fetcher: addr(3), Watcher: addr(4)}
	watcherHealth := addr(5)

	env := append(serviceEnv(e.Kubeconfig), e.Config.Env...)
	common := func(name string) []string {
		args := []string{"-nats-url", e.NATSURL, "-telemetry-addr", telemetry[name], "-log-format", "text"}
		if e.NATSIdentities != nil {
			args = append(args, "-nats-nkey", e.NATSIdentities.SeedFiles[name])
		}
		return args
	}
	args := map[string][]string{
		ArtifactServer: append(common(ArtifactServer),
			"-storage-path", e.StoragePath, "-storage-addr", e.ArtifactAddr, "-storage-adv-addr", e.ArtifactAddr),
		Packager: append(common(Packager), "-storage-path", e.StoragePath),
		Fetcher:  append(append(common(Fetcher), "-storage-path", e.StoragePath), e.egressArgs()...),
		Watcher:  append(common(Watcher), "-health-addr", watcherHealth),
	}
	if e.Config.Receivers {
		args[Watcher] = append(args[Watcher], "-receivers")
	}
	if kinds := e.Config.PluginKinds; e.Config.HTTPSource || len(kinds) > 0 {
		if e.Config.HTTPSource {
			kinds = append([]string{HTTPSourceKind}, kinds...)
		}
		args[Watcher] = append(args[Watcher], "-plugin-kinds", strings.Join(kinds, ","))
	}
	for _, name := range ServiceNames {
		ready := "http://" + telemetry[name] + "/readyz"
		if name == Watcher {
			ready = "http://" + watcherHealth + "/readyz"
		}
		e.services = append(e.services, &Service{
			Name:          name,
			Path:          filepath.Join(e.Config.BinDir, name),
			Args:          append(args[name], e.Config.ExtraArgs[name]...),
			Env:           env,
			LogPath:       filepath.Join(e.Config.Dir, "logs", name+".log"),
			ReadyURL:      ready,
			TelemetryAddr: telemetry[name],
		})
	}
	if e.Config.Receivers {
		e.addReceiver(receiverPorts, env, common)
	}
	if e.Config.HTTPSource {
		if err := e.addHTTPSourceFetcher(env); err != nil {
			return err
		}
	}
	if err := e.addArtifactServerReplicas(ports[6 : 6+extraServers]); err != nil {
		return err
	}
	if err := e.addWatcherReplicas(ports[6+extraServers : 6+extraServers+extraWatchers]); err != nil {
		return err
	}
	if err := e.addWorkerReplicas(ports[6+extraServers+extraWatchers : len(ports)-1]); err != nil {
		return err
	}
	if e.Config.Dispatcher {
		telemetry[Dispatcher] = "127.0.0.1:" + strconv.Itoa(ports[len(ports)-1])
		e.services = append(e.services, &Service{
			Name:          Dispatcher,
			Path:          filepath.Join(e.Config.BinDir, Dispatcher),
			Args:          slices.Concat(common(Dispatcher), e.egressArgs(), e.Config.ExtraArgs[Dispatcher]),
			Env:           env,
			LogPath:       filepath.Join(e.Config.Dir, "logs", Dispatcher+".log"),
			ReadyURL:      "http://" + telemetry[Dispatcher] + "/readyz",
			TelemetryAddr: telemetry[Dispatcher],
		})
	}
	e.useS3Storage()
	e.useOwnTempDirs()
	return nil
}

// egressArgs are the egress flags of the services that reach tenants'
// URLs: loopback allowed unless Config.AllowedDestinations says otherwise,
// and the artifact-server among Headwater's internals, never reached.
func (e *Env) egressArgs() []string {
	allowed := e.Config.AllowedDestinations
	if allowed == nil {
		allowed = []string{"127.0.0.0/8", "::1"}
	}
	args := []string{"-internal-destinations", e.ArtifactAddr}
	if len(allowed) > 0 {
		args = append(args, "-allowed-destinations", strings.Join(allowed, ","))
	}
	return args
}

// addReceiver defines the webhook receiver, started after the others: it
// serves /hook/<digest> on Env.ReceiverAddr.
func (e *Env) addReceiver(ports []int, env []string, common func(string) []string) {
	e.ReceiverAddr = "127.0.0.1:" + strconv.Itoa(ports[0])
	telemetry := "127.0.0.1:" + strconv.Itoa(ports[1])
	args := common(Receiver)
	for i := range args {
		if args[i] == "-telemetry-addr" {
			args[i+1] = telemetry
		}
	}
	args = append(args, "-receiver-addr", e.ReceiverAddr)
	e.services = append(e.services, &Service{
		Name:          Receiver,
		Path:          filepath.Join(e.Config.BinDir, Receiver),
		Args:          append(args, e.Config.ExtraArgs[Receiver]...),
		Env:           env,
		LogPath:       filepath.Join(e.Config.Dir, "logs", Receiver+".log"),
		ReadyURL:      "http://" + telemetry + "/readyz",
		TelemetryAddr: telemetry,
	})
}

// addHTTPSourceFetcher defines the fetcher of the HTTPSource plug-in kind,
// with its own bus identity, started before the watcher.
func (e *Env) addHTTPSourceFetcher(env []string) error {
	ports, err := FreePorts(1)
	if err != nil {
		return err
	}
	telemetry := "127.0.0.1:" + strconv.Itoa(ports[0])
	args := []string{"-nats-url", e.NATSURL, "-telemetry-addr", telemetry, "-log-format", "text", "-storage-path", e.StoragePath}
	args = append(args, e.egressArgs()...)
	if e.NATSIdentities != nil {
		args = append(args, "-nats-nkey", e.NATSIdentities.SeedFiles[events.PluginIdentity("HTTPSource")])
	}
	s := &Service{
		Name:          HTTPSourceFetcher,
		Path:          filepath.Join(e.Config.BinDir, HTTPSourceFetcher),
		Args:          append(args, e.Config.ExtraArgs[HTTPSourceFetcher]...),
		Env:           env,
		LogPath:       filepath.Join(e.Config.Dir, "logs", HTTPSourceFetcher+".log"),
		ReadyURL:      "http://" + telemetry + "/readyz",
		TelemetryAddr: telemetry,
	}
	i := slices.IndexFunc(e.services, func(s *Service) bool { return s.Name == Watcher })
	e.services = slices.Insert(e.services, max(i, 0), s)
	return nil
}

// useOwnTempDirs gives every service process a temporary directory of its
// own (TMPDIR, Service.TempDir) under the Env's directory, so what a
// process leaves there, a killed one included, can be told apart from the
// others'.
func (e *Env) useOwnTempDirs() {
	for _, s := range e.services {
		s.TempDir = filepath.Join(e.Config.Dir, "tmp", s.Name)
		s.Env = append(slices.Clone(s.Env), "TMPDIR="+s.TempDir)
	}
}

// RestartNATS stops the embedded NATS server and starts it again at once,
// on the same port with the same JetStream store and identities, as a
// restarted NATS pod on its persistent volume: the services' clients
// reconnect by themselves. NATS runs in this process, so "stop" is the
// server's shutdown, not a SIGKILL: every client loses its connection at
// once, and JetStream recovers what it had stored.
func (e *Env) RestartNATS() error {
	if err := e.StopNATS(); err != nil {
		return err
	}
	return e.StartNATS()
}

// StopNATS shuts the embedded NATS server down and keeps its port and
// store for StartNATS: until then the services find no server (the bus
// lost, as with every NATS server down or without a quorum) and keep
// trying to reconnect.
func (e *Env) StopNATS() error {
	if e.nats == nil {
		return errors.New("stop nats: not running")
	}
	addr, ok := e.nats.Addr().(*net.TCPAddr)
	if !ok {
		return errors.New("stop nats: no listening address")
	}
	e.natsPort = addr.Port
	e.nats.Shutdown()
	e.nats.WaitForShutdown()
	e.nats = nil
	return nil
}

// StartNATS starts the embedded NATS server StopNATS stopped, on the same
// port with the same JetStream store and identities.
func (e *Env) StartNATS() error {
	if e.nats != nil {
		return errors.New("start nats: already running")
	}
	if e.natsPort == 0 {
		return errors.New("start nats: never stopped by StopNATS")
	}
	// The port was just released; binding it again may take a moment.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var err error
	for range 50 {
		if e.nats, err = natsserver.Start(e.natsOptions(e.natsPort)); err == nil {
			return nil
		}
		<-tick.C
	}
	return fmt.Errorf("start nats on port %d: %w", e.natsPort, err)
}

// natsOptions are the embedded NATS server's options, on port (0: any
// free one).
func (e *Env) natsOptions(port int) natsserver.Options {
	return natsserver.Options{Port: port, StoreDir: filepath.Join(e.Config.Dir, "nats"), Users: e.NATSIdentities.Users}
}

// serviceEnv is the environment of the service processes: this process's,
// without any HEADWATER_* or POD_NAMESPACE setting that could reconfigure
// them behind the harness's back, and with KUBECONFIG set.
func serviceEnv(kubeconfig string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "HEADWATER_") || k == "KUBECONFIG" || k == "POD_NAMESPACE" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "KUBECONFIG="+kubeconfig)
}

// Stop stops the services (in reverse start order), the git server, NATS
// and the control plane. It leaves Config.Dir in place and returns every
// error it met, including a service's unclean exit.
func (e *Env) Stop() error {
	var errs []error
	for i := len(e.services) - 1; i >= 0; i-- {
		s := e.services[i]
		if !s.Running() {
			continue
		}
		e.Config.progress("stopping " + s.Name)
		if err := s.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if e.Git != nil {
		e.Config.progress("stopping the git server")
		if err := e.Git.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("git server: %w", err))
		}
	}
	if e.nats != nil {
		e.Config.progress("stopping NATS")
		e.nats.Shutdown()
		e.nats.WaitForShutdown()
		e.nats = nil
	}
	if e.controlPlane != nil {
		e.Config.progress("stopping kube-apiserver and etcd")
		if err := e.controlPlane.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("control plane: %w", err))
		}
		e.controlPlane = nil
	}
	for _, f := range e.logFiles {
		_ = f.Close()
	}
	e.logFiles = nil
	return errors.Join(errs...)
}

// Service returns the named service, or nil.
func (e *Env) Service(name string) *Service {
	for _, s := range e.services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// Services returns every service in start order.
func (e *Env) Services() []*Service {
	return append([]*Service(nil), e.services...)
}

// NewRepo creates a served repository <name>.git on branch, with its work
// tree under the Env's directory and no commits yet.
func (e *Env) NewRepo(name, branch string) (*gitserver.Repo, error) {
	return gitserver.NewRepo(e.GitRoot, name, filepath.Join(e.Config.Dir, "work", name), branch)
}

// ArtifactURL is the URL the artifact-server serves a storage key at.
func (e *Env) ArtifactURL(key string) string {
	return "http://" + e.ArtifactAddr + "/" + key
}

// Kubectl runs the control plane's kubectl against the Env and returns its
// combined output.
func (e *Env) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(e.Config.AssetsDir, "kubectl"), append([]string{"--kubeconfig", e.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// FreePorts returns n distinct free TCP ports on 127.0.0.1. They are free
// when this returns; a service binds them a moment later.
func FreePorts(n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
