// Package command is what the main of every Headwater service does the same
// way: read the flags from the command line and the environment, answer
// -version, log the build it runs, run until SIGTERM or an interrupt, and
// report a failed run. A service's main reads:
//
//	func main() {
//		var o options
//		fs := flag.NewFlagSet(service, flag.ContinueOnError)
//		o.bindFlags(fs)
//		command.Parse(fs, os.Args[1:])
//		ctx, stop := command.Start(o.telemetry.NewLogger(service))
//		defer stop()
//		command.Exit(ctx, run(ctx, o))
//	}
package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/buildinfo"
	"github.com/headwater-gitops/headwater/pkg/flagenv"
	"github.com/headwater-gitops/headwater/pkg/fluxflags"
	"github.com/headwater-gitops/headwater/pkg/tracing"
)

// versionFlag prints the build information and exits. It is read from the
// command line only: a HEADWATER_VERSION in a container's environment (an
// image tag, say) must not turn a service into a version printer.
const versionFlag = "version"

// Main is the whole main of a service: a flag set named after the service,
// bound by bind and Flux's flags (NewFlagSet) and parsed (Parse), a logger made by logger from the parsed
// flags, the signal context (Start), and run's end (Exit).
//
// Flux's flags that have no effect in the service (see package fluxflags)
// are logged once, after "starting".
//
// Every service also gets -pprof-addr (HEADWATER_PPROF_ADDR): when set, Go's
// runtime profiles are served there (ServeProfiles). It is off by default:
// profiles show what a process holds, so the address is for an operator
// on the host or a port-forward, never a Service.
//
// Every service traces when the standard OTEL_* variables name an OTLP
// endpoint (see package tracing): the tracer provider is installed before
// run starts and flushed, within 5 seconds, after it returns.
func Main(service string, bind func(*flag.FlagSet), logger func() logr.Logger, run func(context.Context) error) {
	MainArgs(service, os.Args[1:], bind, logger, run)
}

// MainArgs is Main with the arguments given rather than the process's: the
// headwater command runs a role with what follows its -target flag.
func MainArgs(service string, args []string, bind func(*flag.FlagSet), logger func() logr.Logger, run func(context.Context) error) {
	fs := NewFlagSet(service, bind)
	Parse(fs, args)
	ctx, stop := Start(logger())
	defer stop()
	fluxflags.LogNoEffect(fs, logr.FromContextOrDiscard(ctx))
	if err := ServeProfiles(ctx, fs.Lookup(PprofFlag).Value.String()); err != nil {
		Exit(ctx, err)
		return
	}
	shutdown, err := tracing.StartFromEnv(ctx, service, logr.FromContextOrDiscard(ctx).WithName("otel"))
	if err != nil {
		Exit(ctx, err)
		return
	}
	err = run(ctx)
	// The run's context has ended: the last spans get a context of their own.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := shutdown(sctx); serr != nil {
		logr.FromContextOrDiscard(ctx).Error(serr, "flushing traces")
	}
	Exit(ctx, err)
}

// NewFlagSet returns the flags of service as Main parses them: a flag set
// named after the service, with bind's flags, then Flux's source-controller
// flags that bind did not define (fluxflags.Bind), then -pprof-addr. A
// role's tests and documentation read its flags from here.
func NewFlagSet(service string, bind func(*flag.FlagSet)) *flag.FlagSet {
	fs := flag.NewFlagSet(service, flag.ContinueOnError)
	bind(fs)
	fluxflags.Bind(fs)
	fs.String(PprofFlag, "", "Address serving Go's runtime profiles at /debug/pprof/ (off when empty); for an operator's port-forward, never a Service.")
	return fs
}

// PprofFlag is the flag Main adds for ServeProfiles' address.
const PprofFlag = "pprof-addr"

// ServeProfiles serves net/http/pprof's handlers on addr under
// /debug/pprof/ until ctx ends; an empty addr serves nothing. It returns
// once the listener is bound, so a bad address fails at start-up.
func ServeProfiles(ctx context.Context, addr string) error {
	if addr == "" {
		return nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("pprof listen %s: %w", addr, err)
	}
	// WriteTimeout stays unset: a CPU profile or trace streams for as long
	// as its seconds parameter asks.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log := logr.FromContextOrDiscard(ctx)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "pprof server stopped")
		}
	}()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	log.Info("serving profiles", "addr", ln.Addr().String())
	return nil
}

// Serve serves srv on ln until ctx ends, then shuts it down gracefully,
// waiting at most timeout for the requests in progress. It returns early,
// with the error, if the server fails; otherwise what the shutdown
// returned.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, timeout time.Duration) error {
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		// ctx is still running: the server failed on its own.
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var shutErr error
	if err := srv.Shutdown(sctx); err != nil {
		shutErr = fmt.Errorf("http shutdown: %w", err)
	}
	err := <-serveErr
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, shutErr)
}

// ErrVersion is what ParseArgs returns once it has printed the version for
// -version: the caller exits, successfully.
var ErrVersion = errors.New("version printed")

// Parse is ParseArgs for main, writing the version to stdout: it returns
// only when the service should run, and otherwise exits, 0 after -version
// or -help and 2 after a bad flag or environment variable.
func Parse(fs *flag.FlagSet, args []string) {
	switch err := ParseArgs(fs, args, os.Stdout); {
	case err == nil:
	case errors.Is(err, ErrVersion), errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	default:
		os.Exit(2)
	}
}

// ParseArgs adds -version to fs (named after the service), then parses args
// into it. With -version it writes "<service> version <build information>"
// to stdout and returns ErrVersion. Otherwise it sets the flags args did not
// give from the environment (see package flagenv). Errors are printed to
// fs.Output() and returned.
func ParseArgs(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	version := fs.Bool(versionFlag, false, "Print the version and build information, then exit.")
	if err := fs.Parse(args); err != nil {
		return err // the flag package has printed it
	}
	if *version {
		fmt.Fprintf(stdout, "%s version %s\n", fs.Name(), buildinfo.Get())
		return ErrVersion
	}
	if err := flagenv.FromEnv(fs, versionFlag); err != nil {
		fmt.Fprintln(fs.Output(), err)
		return err
	}
	return nil
}

// Start logs that the service starts, with its build information, and
// returns the context it runs in: it carries log (see logr.FromContext)
// and ends on SIGTERM or an interrupt. stop releases the signals.
func Start(log logr.Logger) (ctx context.Context, stop context.CancelFunc) {
	info := buildinfo.Get()
	log.Info("starting", "version", info.Version, "revision", info.Revision, "modified", info.Modified,
		"buildDate", info.BuildDate, "goVersion", info.GoVersion)
	return signal.NotifyContext(logr.NewContext(context.Background(), log), syscall.SIGTERM, os.Interrupt)
}

// Exit ends a service whose run(ctx) returned err. A nil err, or a run
// stopped by a signal before it was up (its error wraps ctx's
// cancellation), returns to main, which exits 0. Any other error is logged
// as one line with ctx's logger and the process exits 1.
func Exit(ctx context.Context, err error) {
	if err == nil || (ctx.Err() != nil && errors.Is(err, context.Canceled)) {
		return
	}
	logr.FromContextOrDiscard(ctx).Error(err, "stopped")
	os.Exit(1)
}

// Steps runs a service's start-up steps in order with ctx, and returns the
// first one's error, running none after it. A run function lists its
// steps, each a small function that wraps its own errors, and Steps keeps
// the list free of error plumbing.
func Steps(ctx context.Context, steps ...func(context.Context) error) error {
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}
