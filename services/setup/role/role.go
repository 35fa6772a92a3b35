// Package role is the setup's main (Main), importable so that the setup
// command and the headwater command (headwater -target=setup) run the same
// service; the setup command's documentation says what it does.
package role

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/headwater-gitops/headwater/pkg/buildinfo"
	"github.com/headwater-gitops/headwater/pkg/flagenv"
	"github.com/headwater-gitops/headwater/pkg/kubeconfig"
	"github.com/headwater-gitops/headwater/services/setup/internal/secrets"
)

// usage is the command line in short.
const usage = `usage: setup ensure [-namespace NS] [-kubeconfig F] [-s3-secret S -s3-endpoint E -s3-bucket B]
       setup print  [-namespace NS] [-s3-secret S -s3-endpoint E -s3-bucket B]
       setup version`

// options are setup's flags.
type options struct {
	// namespace holds the Secrets.
	namespace string
	// s3 describes the S3 Secret; s3.Secret empty asks for none.
	s3   secrets.S3
	kube kubeconfig.Options
	// pluginKinds are the plug-in source kinds whose fetchers get a bus
	// identity, comma-separated.
	pluginKinds string
}

// bindFlags registers the flags of command ("ensure" or "print") on fs.
func (o *options) bindFlags(fs *flag.FlagSet, command string) {
	fs.StringVar(&o.namespace, "namespace", "headwater-system", "Namespace of the Secrets.")
	fs.StringVar(&o.s3.Secret, "s3-secret", "", "Name of the S3 storage Secret to make too (e.g. headwater-s3); empty for none.")
	fs.StringVar(&o.s3.Endpoint, "s3-endpoint", "", "The S3 Secret's endpoint, host[:port] or http(s)://host[:port].")
	fs.StringVar(&o.s3.Bucket, "s3-bucket", "headwater-artifacts", "The S3 Secret's bucket.")
	fs.StringVar(&o.s3.Region, "s3-region", "", "The S3 Secret's region (left out when empty).")
	fs.BoolVar(&o.s3.Insecure, "s3-insecure", false, "Mark the S3 Secret's endpoint as plain HTTP (insecure: \"true\").")
	fs.StringVar(&o.pluginKinds, "plugin-kinds", "",
		"Plug-in source kinds (e.g. HTTPSource) whose fetchers get a bus identity too (Secret headwater-nats-plugin-<kind>), comma-separated.")
	if command == "ensure" {
		o.kube.BindFlags(fs, "Path to a kubeconfig; default: $KUBECONFIG, then in-cluster.")
	}
}

// spec is what the options ask for.
func (o *options) spec() secrets.Spec {
	spec := secrets.Spec{Namespace: o.namespace}
	for _, k := range strings.Split(o.pluginKinds, ",") {
		if k = strings.TrimSpace(k); k != "" {
			spec.PluginKinds = append(spec.PluginKinds, k)
		}
	}
	if o.s3.Secret != "" {
		spec.S3 = &o.s3
	}
	return spec
}

// Main runs the setup with args, the command line after the program's
// name (or after -target), and exits the process when it ends.
func Main(args []string) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, args, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "setup:", err)
		os.Exit(1)
	}
}

// parse reads the flags of command from args and the environment.
func parse(command string, args []string, stderr io.Writer) (*options, error) {
	var o options
	fs := flag.NewFlagSet("setup "+command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.bindFlags(fs, command)
	if err := flagenv.Parse(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q\n%s", fs.Args(), usage)
	}
	return &o, nil
}

// run runs the command of args, printing to stdout what it prints and to
// stderr what it did.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("no command\n%s", usage)
	}
	switch args[0] {
	case "ensure":
		o, err := parse(args[0], args[1:], stderr)
		if err != nil {
			return err
		}
		fmt.Fprintln(stderr, "setup", buildinfo.Get())
		return ensure(ctx, o, stderr)
	case "print":
		o, err := parse(args[0], args[1:], stderr)
		if err != nil {
			return err
		}
		return printSecrets(o, stdout)
	case "version", "-version", "--version":
		_, err := fmt.Fprintln(stdout, buildinfo.Get())
		return err
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}
