package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/headwater-gitops/headwater/e2e/cmd/headwater-local/internal/statedir"
	"github.com/headwater-gitops/headwater/e2e/cmd/headwater-local/internal/walkthrough"
	"github.com/headwater-gitops/headwater/e2e/harness"
)

// run starts Headwater, shows the walkthrough and waits for ctx to end (or a
// service to die), then stops everything it started.
func run(ctx context.Context, o options, p *walkthrough.Printer) (err error) {
	cfg := harness.Config{ExtraArgs: map[string][]string{}, Progress: p.Step, Dispatcher: true}
	for _, d := range []struct {
		dst *string
		src string
	}{{&cfg.Dir, o.stateDir}, {&cfg.BinDir, o.binDir}, {&cfg.CRDDir, o.crdDir}, {&cfg.AssetsDir, o.assetsDir},
		{&cfg.ReceiverCRDDir, o.receiversCRDDir}, {&cfg.HTTPSourceCRDDir, o.httpSourceCRDDir}} {
		if d.src == "" {
			continue
		}
		if *d.dst, err = filepath.Abs(d.src); err != nil {
			return fmt.Errorf("path %s: %w", d.src, err)
		}
	}
	cfg.Receivers = cfg.ReceiverCRDDir != ""
	cfg.HTTPSource = cfg.HTTPSourceCRDDir != ""
	if err := cfg.Check(); err != nil {
		return fmt.Errorf("%w\n(`make run` builds everything first)", err)
	}
	// envtest logs through controller-runtime's logger; only its errors
	// are worth showing here.
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))

	release, err := statedir.Prepare(cfg.Dir)
	if err != nil {
		return err
	}
	defer release()

	p.Step("starting Headwater on the embedded default; state and logs in " + cfg.Dir)
	env, err := harness.Start(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while starting; Start stopped what it had started
		}
		return err
	}
	defer func() {
		p.Step("stopping everything that was started")
		if serr := env.Stop(); serr != nil {
			err = errors.Join(err, serr)
		}
		p.Step("stopped")
	}()

	stopEvents, err := walkthrough.Run(ctx, env, p)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer stopEvents()
	return wait(ctx, env)
}

// wait returns nil when ctx ends, or an error as soon as a service exits on
// its own.
func wait(ctx context.Context, env *harness.Env) error {
	exited := make(chan *harness.Service, len(harness.ServiceNames))
	for _, s := range env.Services() {
		go func() {
			select {
			case <-s.Done():
				exited <- s
			case <-ctx.Done():
			}
		}()
	}
	select {
	case <-ctx.Done():
		return nil
	case s := <-exited:
		status := "exit status 0"
		if err := s.ExitErr(); err != nil {
			status = err.Error()
		}
		return fmt.Errorf("%s exited unexpectedly (%s); its log is %s", s.Name, status, s.LogPath)
	}
}
