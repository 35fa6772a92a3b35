package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/headwater-gitops/headwater/e2e/harness"
)

// System is a source controller the benchmark measures.
type System string

// The systems, in the order a scenario runs them.
const (
	// Headwater is the four services and NATS, each its own process.
	Headwater System = "Headwater"
	// Flux is Flux's source-controller, one process, run as its docs run
	// it outside a cluster (FluxSourceController).
	Flux System = "Flux"
)

// FluxSourceController is the name of Flux's process in the measurements.
const FluxSourceController = "source-controller"

// fluxConcurrency is Flux's --concurrent: what the side-by-side
// measurements used (Flux's default is 2; its Helm chart sets 4 or more).
const fluxConcurrency = 10

// systems returns the systems o can run: Headwater, and Flux when its
// binary was built.
func (o Options) systems() []System {
	if o.FluxBin == "" {
		return []System{Headwater}
	}
	return []System{Headwater, Flux}
}

// startEnv starts a fresh Env in its own state directory, running sys:
// Headwater's services (and NATS in a process of its own, when
// o.Harness.NATSBin is set), or only the control plane and git server with
// Flux's source-controller beside them. stop stops it and removes the
// directory, which it keeps (and names) if the stop failed.
func startEnv(ctx context.Context, o Options, name string, sys System) (*harness.Env, func() error, error) {
	cfg := o.Harness
	parent := cfg.Dir
	if parent == "" {
		parent = os.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "headwater-bench-"+name+"-"+string(sys)+"-")
	if err != nil {
		return nil, nil, fmt.Errorf("state directory: %w", err)
	}
	cfg.Dir = dir
	if sys == Flux {
		cfg.NoServices = true
		cfg.NATSBin = "" // NATS idles in the benchmark process: Flux does not use it
		cfg.S3 = nil
	}
	o.progress("starting a fresh Env for %s in %s", sys, dir)
	sctx, cancel := context.WithTimeout(ctx, envStartTimeout)
	defer cancel()
	env, err := harness.Start(sctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("start (state kept in %s): %w", dir, err)
	}
	stop := func() error {
		if err := env.Stop(); err != nil {
			return fmt.Errorf("stop (state kept in %s): %w", dir, err)
		}
		return os.RemoveAll(dir)
	}
	if sys == Flux {
		if err := startFlux(sctx, env, o.FluxBin); err != nil {
			return nil, nil, errors.Join(err, stop())
		}
	}
	return env, stop, nil
}

// startFlux runs Flux's source-controller on env with the flags its
// documentation gives for a run outside a cluster: its own storage
// directory and artifact server, no leader election, no events sink.
func startFlux(ctx context.Context, env *harness.Env, bin string) error {
	ports, err := harness.FreePorts(3)
	if err != nil {
		return err
	}
	storage := filepath.Join(env.Config.Dir, "flux-storage")
	if err := os.MkdirAll(storage, 0o755); err != nil {
		return fmt.Errorf("flux storage: %w", err)
	}
	metrics, health := ports[1], ports[2]
	storageAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	// Later entries win over the inherited ones.
	environ := append(os.Environ(), "KUBECONFIG="+env.Kubeconfig, "RUNTIME_NAMESPACE="+namespace)
	s := &harness.Service{
		Name: FluxSourceController,
		Path: bin,
		Args: []string{
			"--storage-path=" + storage,
			"--storage-addr=" + storageAddr,
			"--storage-adv-addr=" + storageAddr,
			"--concurrent=" + strconv.Itoa(fluxConcurrency),
			"--enable-leader-election=false",
			"--metrics-addr=127.0.0.1:" + strconv.Itoa(metrics),
			"--health-addr=127.0.0.1:" + strconv.Itoa(health),
			"--events-addr=",
		},
		Env:           environ,
		LogPath:       filepath.Join(env.Config.Dir, "logs", FluxSourceController+".log"),
		ReadyURL:      "http://127.0.0.1:" + strconv.Itoa(health) + "/readyz",
		TelemetryAddr: "127.0.0.1:" + strconv.Itoa(metrics),
	}
	if err := env.StartService(ctx, s); err != nil {
		return fmt.Errorf("flux source-controller: %w", err)
	}
	return nil
}
