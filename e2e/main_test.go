package e2e

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/testsupport/otlpreceiver"
)

// e2eMaxFileSize is the fetcher's -max-file-size in these tests: larger
// than any file a test commits, except the one that checks the limit.
const e2eMaxFileSize = 1 << 20

// One Env serves the whole package; every test works on objects and
// repositories of its own name, so tests run in parallel.
var (
	env      *harness.Env
	recorder = &eventRecorder{}
	// notifications receives what the watcher posts to -events-addr, as
	// Flux's notification-controller would (notify_test.go).
	notifications *notificationReceiver
	// traces receives the spans every service exports by OTLP.
	traces *otlpreceiver.Receiver
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runTests(m))
}

// runTests starts the Env, runs the tests, checks that no service died
// during them and stops the Env. It builds nothing: `make test` builds the
// services and the control-plane binaries first. Missing binaries fail the
// run (a CI must not pass by skipping); only -short skips.
func runTests(m *testing.M) int {
	if testing.Short() {
		return m.Run() // every test skips itself; see requireEnv
	}
	cfg, err := testConfig()
	if err == nil {
		err = cfg.Check()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n"+
			"The end-to-end tests run the service binaries against a real kube-apiserver and etcd.\n"+
			"Run them with `make test`, which builds both (or `make kube-tools build` first).\n", err)
		return 1
	}
	// Every public CloudEvent also goes to an HTTP sink, as a user's would.
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusAccepted)
	}))
	defer sink.Close()
	cfg.ExtraArgs[harness.ArtifactServer] = append(cfg.ExtraArgs[harness.ArtifactServer], "-event-sink-url", sink.URL)
	cfg.Dir, err = os.MkdirTemp("", "headwater-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	notifications = startNotificationReceiver()
	defer notifications.Close()
	cfg.ExtraArgs[harness.Watcher] = append(cfg.ExtraArgs[harness.Watcher], "-events-addr", notifications.URL)
	// Every service traces to an OTLP receiver here, as to a collector
	// (tracing_test.go): the standard variables, a short batch delay.
	traces, err = otlpreceiver.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	defer traces.Close()
	cfg.Env = append(cfg.Env, "OTEL_EXPORTER_OTLP_ENDPOINT="+traces.HTTPEndpoint(), "OTEL_BSP_SCHEDULE_DELAY=200")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	env, err = harness.Start(ctx, cfg)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: start: %v\n", err)
		dumpServiceLogs(os.Stderr, cfg.Dir)
		fmt.Fprintf(os.Stderr, "e2e: state and logs kept in %s\n", cfg.Dir)
		return 1
	}
	code := func() int {
		tap, err := startTap(env)
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			return 1
		}
		stop, err := harness.SubscribeEvents(env.NATSURL, subscriberAuth(env), recorder.record)
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			return 1
		}
		defer stop()
		code := m.Run()
		// No credential of any test crossed the bus in any message.
		full := flag.Lookup("test.run").Value.String() == ""
		if err := tap.checkNoCredentials(context.Background(), env, full); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			code = 1
		}
		return code
	}()

	// Whatever the tests did, every service must still be up.
	for _, s := range env.Services() {
		if !s.Running() {
			fmt.Fprintf(os.Stderr, "e2e: %s exited during the tests (%v); its log:\n%s\n", s.Name, s.ExitErr(), s.LogTail(100))
			code = 1
		}
	}
	if err := env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: stop (every service must exit cleanly on SIGTERM): %v\n", err)
		code = 1
	}
	if code == 0 {
		_ = os.RemoveAll(cfg.Dir)
	} else {
		fmt.Fprintf(os.Stderr, "e2e: state and logs kept in %s\n", cfg.Dir)
	}
	return code
}

// testConfig finds what the Env runs: KUBEBUILDER_ASSETS and
// HEADWATER_BIN_DIR as exported by make, or the repository's bin/k8s and
// bin/ when run by hand after `make kube-tools build`.
func testConfig() (harness.Config, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return harness.Config{}, err
	}
	cfg := harness.Config{
		BinDir:    os.Getenv("HEADWATER_BIN_DIR"),
		AssetsDir: os.Getenv("KUBEBUILDER_ASSETS"),
		CRDDir:    filepath.Join(root, "deploy", "crds"),
		// The webhook receiver runs too (TestWebhookReceiver), as the
		// receivers component deploys it.
		Receivers:      true,
		ReceiverCRDDir: filepath.Join(root, "deploy", "components", "receivers", "crd"),
		Dir:            os.TempDir(), // replaced by a fresh directory once checked
		ExtraArgs: map[string][]string{
			harness.Fetcher: {"-max-file-size", strconv.Itoa(e2eMaxFileSize), "-helm-index-max-size", strconv.Itoa(e2eHelmIndexMaxSize)},
			harness.Watcher: {"-source-metrics-interval", "2s"},
			// Reports at once, so Subscription status follows quickly.
			harness.Dispatcher: {"-report-interval", "200ms"},
			// A replay window a test can outwait (TestReplayRefused).
			harness.Receiver: {"-signature-tolerance", replayWindow.String()},
		},
		Dispatcher: true,
		// The HTTPSource plug-in kind runs too (TestHTTPSource), as its
		// component deploys it, and a plug-in kind whose fetcher is never
		// deployed.
		HTTPSource:       true,
		HTTPSourceCRDDir: filepath.Join(root, "deploy", "components", "httpsource", "crd"),
		PluginKinds:      []string{unservedKind},
		PluginCRDDir:     filepath.Join(root, "e2e", "testdata", "crds"),
	}
	if cfg.BinDir == "" {
		cfg.BinDir = filepath.Join(root, "bin")
	}
	if cfg.AssetsDir == "" {
		cfg.AssetsDir = filepath.Join(root, "bin", "k8s")
	}
	return cfg, nil
}

// dumpServiceLogs prints the tail of every log in a failed start's state.
func dumpServiceLogs(w *os.File, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, l := range logs {
		s := &harness.Service{Name: filepath.Base(l), LogPath: l}
		fmt.Fprintf(w, "--- %s\n%s\n", l, s.LogTail(60))
	}
}
