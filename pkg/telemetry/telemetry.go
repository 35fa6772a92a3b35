// Package telemetry gives every Headwater service the same structured
// logger, Prometheus metric families and /metrics, /healthz and /readyz
// endpoints.
package telemetry

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/headwater-gitops/headwater/pkg/buildinfo"
)

// Namespace prefixes every Headwater metric.
const Namespace = "headwater"

// Options configure logging and the telemetry endpoint.
type Options struct {
	// Addr serves /metrics, /healthz and /readyz; empty disables it.
	Addr string
	// LogLevel is trace, debug, info or error (LogLevels).
	LogLevel string
	// LogFormat is json, or text (console, Flux's name, is the same); see
	// LogFormats.
	LogFormat string
}

// LogLevels are the values of -log-level, as Flux's: debug logs logr's
// V(1), trace V(2) too, error only errors.
var LogLevels = map[string]slog.Level{
	"trace": slog.Level(-2),
	"debug": slog.Level(-1),
	"info":  slog.LevelInfo,
	"error": slog.LevelError,
}

// LogFormats are the values of -log-format: json writes the keys Flux's
// controllers write (ts, level, logger, msg, error), which `flux logs`
// reads; text (or console, Flux's name for it) is for people.
var LogFormats = []string{"json", "text", "console"}

// BindFlags registers the options on fs with the given default address.
// A -log-level or -log-format not listed (LogLevels, LogFormats) is an
// error naming the flag.
func (o *Options) BindFlags(fs *flag.FlagSet, defaultAddr string) {
	fs.StringVar(&o.Addr, "telemetry-addr", defaultAddr, "Address serving /metrics, /healthz and /readyz; empty disables it.")
	o.LogLevel, o.LogFormat = "info", "json"
	level := oneOf{p: &o.LogLevel, values: slices.Sorted(maps.Keys(LogLevels))}
	format := oneOf{p: &o.LogFormat, values: LogFormats}
	fs.Var(level, "log-level", "Log level: trace, debug, info or error.")
	fs.Var(format, "log-format", "Log format: json (Flux's keys, which `flux logs` reads) or text (console).")
}

// Validate says which option is not one of its values.
func (o *Options) Validate() error {
	var errs []error
	if _, ok := LogLevels[strings.ToLower(o.LogLevel)]; !ok {
		errs = append(errs, fmt.Errorf("log level %q: want one of trace, debug, info, error", o.LogLevel))
	}
	if !slices.Contains(LogFormats, strings.ToLower(o.LogFormat)) {
		errs = append(errs, fmt.Errorf("log format %q: want json or text (console)", o.LogFormat))
	}
	return errors.Join(errs...)
}

// oneOf is a string flag that takes one of values (in any case).
type oneOf struct {
	p      *string
	values []string
}

func (v oneOf) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v oneOf) Set(s string) error {
	if !slices.Contains(v.values, strings.ToLower(s)) {
		return fmt.Errorf("want one of %s", strings.Join(v.values, ", "))
	}
	*v.p = strings.ToLower(s)
	return nil
}

// NewLogger returns the service's structured logger, writing to stderr.
// Options that do not validate (set by a program, not by flags) log at
// info, in JSON.
func (o *Options) NewLogger(service string) logr.Logger {
	return o.newLogger(os.Stderr, service)
}

func (o *Options) newLogger(w io.Writer, service string) logr.Logger {
	level, ok := LogLevels[strings.ToLower(o.LogLevel)]
	if !ok {
		level = slog.LevelInfo
	}
	var h slog.Handler
	switch strings.ToLower(o.LogFormat) {
	case "text", "console":
		h = slog.NewTextHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: fluxLevels})
	default:
		h = slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: fluxKeys})
	}
	return logr.FromSlogHandler(h).WithValues("service", service)
}

// fluxTimeFormat is zap's ISO 8601 encoder's, Flux's "ts".
const fluxTimeFormat = "2006-01-02T15:04:05.000Z0700"

// fluxKeys writes slog's built-in attributes under the keys and in the
// form Flux's controllers write them (controller-runtime's zap JSON
// encoder, with fluxcd/pkg/runtime/logger's ISO 8601 time and lowercase
// level), which `flux logs` parses: "ts" a string, "level" one of trace,
// debug, info, error, and logr's error under "error".
func fluxKeys(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.TimeKey:
		return slog.Attr{Key: "ts", Value: slog.StringValue(a.Value.Time().Format(fluxTimeFormat))}
	case slog.LevelKey:
		return fluxLevels(groups, a)
	case "err":
		// logr's slog sink writes Error's error as "err".
		return slog.Attr{Key: "error", Value: a.Value}
	}
	return a
}

// fluxLevels names the levels of the text format as the JSON format's
// (logr's V(1) "debug" rather than slog's "INFO-1").
func fluxLevels(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.LevelKey {
		return slog.Attr{Key: slog.LevelKey, Value: slog.StringValue(fluxLevel(a.Value.Any().(slog.Level)))}
	}
	return a
}

// fluxLevel names a level as Flux's logger does: logr's V(1) is debug,
// V(2) and beyond trace.
func fluxLevel(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "error"
	case l >= slog.LevelWarn:
		return "warn"
	case l >= slog.LevelInfo:
		return "info"
	case l >= slog.Level(-1):
		return "debug"
	}
	return "trace"
}

// NewRegistry returns a registry with the Go and process collectors, the
// families every service exposes beside its own.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// RegisterBuildInfo registers headwater_build_info{service,version,revision,goversion},
// always 1, on reg: which build of service runs, from package buildinfo.
// Like MustRegister, it panics if reg already has it.
func RegisterBuildInfo(reg prometheus.Registerer, service string) {
	info := buildinfo.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help: "Which build of the service runs: its version, commit and Go release; always 1.",
		ConstLabels: prometheus.Labels{"service": service, "version": info.Version,
			"revision": info.Revision, "goversion": info.GoVersion},
	})
	g.Set(1)
	reg.MustRegister(g)
}

// Check is a health or readiness probe: nil means healthy.
type Check func() error

// Pending returns a Check that fails with reason: the readiness check of a
// part the service has not started yet ("not connected yet"), until the
// service sets the part's own check.
func Pending(reason string) Check {
	err := errors.New(reason)
	return func() error { return err }
}

// Checks are the named readiness checks /readyz runs. A service serves
// them (Serve) before it starts its parts, and sets each part's check as
// the part comes up, so the probe answers from the first second and says
// what the service waits for. Safe for concurrent use; the zero value
// holds no check, which is ready.
type Checks struct {
	mu     sync.RWMutex
	checks map[string]namedCheck
}

// namedCheck is one check of Checks.
type namedCheck struct {
	check Check
	// informs marks a check that is reported but does not decide
	// readiness (Checks.Inform).
	informs bool
}

// Set makes check the readiness check called name, in place of the one
// set before under that name. A nil check passes: a part that is up and
// has nothing to probe.
func (c *Checks) Set(name string, check Check) { c.set(name, namedCheck{check: check}) }

// Inform makes check the check called name, as Set does, but one that is
// only reported, by /readyz?verbose: the state of something the service
// keeps working without (the artifact-server's bus connection).
func (c *Checks) Inform(name string, check Check) {
	c.set(name, namedCheck{check: check, informs: true})
}

func (c *Checks) set(name string, nc namedCheck) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.checks == nil {
		c.checks = map[string]namedCheck{}
	}
	c.checks[name] = nc
}

// checkResult is the outcome of one check.
type checkResult struct {
	name    string
	informs bool
	err     error
}

// run runs every check, in name order, outside the lock: a slow check
// (a storage ping) does not hold up Set.
func (c *Checks) run() []checkResult {
	c.mu.RLock()
	results := make([]checkResult, 0, len(c.checks))
	checks := make([]Check, 0, len(c.checks))
	for _, name := range slices.Sorted(maps.Keys(c.checks)) {
		results = append(results, checkResult{name: name, informs: c.checks[name].informs})
		checks = append(checks, c.checks[name].check)
	}
	c.mu.RUnlock()
	for i, check := range checks {
		if check != nil {
			results[i].err = check()
		}
	}
	return results
}

// Err runs the checks and returns why the service is not ready, each
// failing check's error prefixed with its name ("nats: not connected
// yet"), or nil when it is. Checks set with Inform are run too, and never
// fail it.
func (c *Checks) Err() error {
	if c == nil {
		return nil
	}
	var errs []error
	for _, r := range c.run() {
		if r.err != nil && !r.informs {
			errs = append(errs, fmt.Errorf("%s: %w", r.name, r.err))
		}
	}
	return errors.Join(errs...)
}

// serveReadyz answers /readyz: 200 "ok" when every check passes, 503 with
// the failures otherwise; with ?verbose, one line per check as the
// Kubernetes API server writes them ("[+]storage ok", "[-]nats failed:
// ...").
func (c *Checks) serveReadyz(w http.ResponseWriter, r *http.Request) {
	if _, verbose := r.URL.Query()["verbose"]; !verbose || c == nil {
		if err := c.Err(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
		return
	}
	var b strings.Builder
	ready := true
	for _, res := range c.run() {
		switch {
		case res.err == nil:
			fmt.Fprintf(&b, "[+]%s ok\n", res.name)
		case res.informs:
			fmt.Fprintf(&b, "[-]%s failed (does not affect readiness): %v\n", res.name, res.err)
		default:
			ready = false
			fmt.Fprintf(&b, "[-]%s failed: %v\n", res.name, res.err)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
		b.WriteString("readyz check failed\n")
	} else {
		b.WriteString("readyz check passed\n")
	}
	_, _ = w.Write([]byte(b.String()))
}

// Serve serves /metrics from reg (none when reg is nil), /healthz (the
// process is alive: it never depends on NATS or storage, so their outage
// restarts no pod) and /readyz (every check of ready passes; see Checks)
// on addr until ctx ends. A service calls it as soon as its flags are
// valid, before it connects to anything, and sets its checks as its parts
// come up. It returns once the listener is bound, so a bad address is
// reported at start-up; an empty addr, or "0" (controller-runtime's and
// so Flux's --metrics-addr=0), serves nothing.
func Serve(ctx context.Context, addr string, reg prometheus.Gatherer, ready *Checks, log logr.Logger) error {
	if addr == "" || addr == "0" {
		return nil
	}
	mux := http.NewServeMux()
	if reg != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("GET /readyz", ready.serveReadyz)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("telemetry listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "telemetry server stopped")
		}
	}()
	context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	log.Info("serving telemetry", "addr", ln.Addr().String(), "metrics", reg != nil)
	return nil
}

// JobMetrics are the job families shared by every bus consumer:
// headwater_jobs_total{service,type,result},
// headwater_job_duration_seconds{service,type} and
// headwater_jobs_in_flight{service}; and the state of the service's
// durable consumers, as JetStream reports it when Prometheus scrapes
// (WatchConsumer): headwater_consumer_pending_messages,
// headwater_consumer_ack_pending_messages,
// headwater_consumer_redelivered_messages and
// headwater_consumer_ack_floor_sequence, each {service,stream,consumer}.
type JobMetrics struct {
	service   string
	total     *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	inFlight  prometheus.Gauge
	consumers *consumerCollector
}

// ConsumerState is what JetStream reports of a durable consumer.
type ConsumerState struct {
	// Stream and Consumer name it.
	Stream, Consumer string
	// Pending are the messages of the stream the consumer has not yet
	// delivered (its lag).
	Pending uint64
	// AckPending are delivered and not yet acknowledged.
	AckPending int
	// Redelivered are delivered more than once and not yet acknowledged.
	Redelivered int
	// AckFloor is the stream sequence up to which every message is
	// acknowledged: while messages are pending, a floor that does not
	// move means the queue is stuck.
	AckFloor uint64
}

// NewJobMetrics registers the job families for service on reg.
func NewJobMetrics(reg prometheus.Registerer, service string) *JobMetrics {
	m := &JobMetrics{
		service: service,
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "jobs_total",
			Help: "Bus messages handled, by CloudEvent type and result (success, retry, error, rejected, interrupted).",
		}, []string{"service", "type", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "job_duration_seconds",
			Help:    "Time to handle one bus message, by CloudEvent type.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"service", "type"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "jobs_in_flight",
			Help:        "Bus messages being handled now.",
			ConstLabels: prometheus.Labels{"service": service},
		}),
	}
	m.consumers = newConsumerCollector(service)
	reg.MustRegister(m.total, m.duration, m.inFlight, m.consumers)
	return m
}

// WatchConsumer makes the consumer gauges report the consumer read
// reads: at each scrape, a state younger than ConsumerStateMaxAge
// reused, each read bounded by ConsumerReadTimeout, a failed one
// reporting the last state read. Nothing is read while nobody scrapes.
// The returned func stops reporting the consumer.
func (m *JobMetrics) WatchConsumer(read ConsumerReader) (remove func()) {
	return m.consumers.watch(read)
}

// Start counts a message as in flight; call the returned func when done.
func (m *JobMetrics) Start() func() {
	m.inFlight.Inc()
	return m.inFlight.Dec
}

// Observe records one handled message.
func (m *JobMetrics) Observe(eventType, result string, d time.Duration) {
	m.total.WithLabelValues(m.service, eventType, result).Inc()
	m.duration.WithLabelValues(m.service, eventType).Observe(d.Seconds())
}
