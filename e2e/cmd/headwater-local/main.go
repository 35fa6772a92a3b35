// Command headwater-local is `make run`: Headwater on the embedded default.
// It starts a local API server, embedded NATS, directory storage, a git
// server and the services (built by make into -bin-dir, the webhook
// receiver included), applies the
// sample GitRepository, shows it become Ready, and runs until Ctrl-C, then
// stops everything it started. Its state lives in -state-dir (.run).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/headwater-gitops/headwater/e2e/cmd/headwater-local/internal/walkthrough"
	"github.com/headwater-gitops/headwater/pkg/flagenv"
)

// options are the runner's flags (environment: HEADWATER_<FLAG>).
type options struct {
	binDir string
	crdDir string
	// receiversCRDDir holds the Receiver CRD; set, the webhook receiver
	// runs too.
	receiversCRDDir string
	// httpSourceCRDDir holds the HTTPSource CRD; set, the HTTPSource
	// plug-in kind and its fetcher run too.
	httpSourceCRDDir string
	assetsDir        string
	stateDir         string
}

func (o *options) bindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.binDir, "bin-dir", "bin", "Directory of the service binaries (make build).")
	fs.StringVar(&o.crdDir, "crd-dir", "deploy/crds", "Directory of the CRD manifests (make manifests).")
	fs.StringVar(&o.receiversCRDDir, "receivers-crd-dir", "deploy/components/receivers/crd",
		"Directory of the Receiver CRD (make manifests): the webhook receiver runs too; empty leaves it out.")
	fs.StringVar(&o.httpSourceCRDDir, "httpsource-crd-dir", "deploy/components/httpsource/crd",
		"Directory of the HTTPSource CRD (make manifests): the HTTPSource plug-in kind and its fetcher run too; empty leaves them out.")
	fs.StringVar(&o.assetsDir, "assets-dir", os.Getenv("KUBEBUILDER_ASSETS"), "Directory of kube-apiserver, etcd and kubectl (default $KUBEBUILDER_ASSETS).")
	fs.StringVar(&o.stateDir, "state-dir", ".run", "Directory for the runner's state and logs; cleared at start.")
}

func main() {
	var o options
	fs := flag.NewFlagSet("headwater-local", flag.ExitOnError)
	o.bindFlags(fs)
	if err := flagenv.Parse(fs, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "headwater-local:", err)
		os.Exit(2)
	}
	// The signal stays caught until run returns, so a second Ctrl-C does
	// not interrupt the orderly stop of what was started.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, walkthrough.NewPrinter(os.Stdout)); err != nil {
		fmt.Fprintln(os.Stderr, "headwater-local:", err)
		stop()
		os.Exit(1)
	}
}
