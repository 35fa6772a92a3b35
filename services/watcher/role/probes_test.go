package role

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"

	"github.com/headwater-gitops/headwater/pkg/kubeconfig"
)

// probesChildEnv carries the options of the watcher TestProbesBeforeNATS
// runs in a child process: its NATS, health and telemetry addresses,
// kubeconfig and job key file, comma-separated.
const probesChildEnv = "HEADWATER_TEST_PROBES_CHILD"

// TestProbesBeforeNATS starts the watcher while nothing listens at its NATS
// URL: its probes answer at once on both addresses, alive and not ready,
// naming NATS, and its metrics are served. (The packager's TestRunWaitsForNATS
// sees readiness follow once NATS starts; here the watcher would go on to
// Kubernetes, which nobody serves.) It runs in a child process: the
// watcher registers its metrics in controller-runtime's global registry,
// once per process.
func TestProbesBeforeNATS(t *testing.T) {
	if opts := os.Getenv(probesChildEnv); opts != "" {
		runProbesChild(t, opts)
		return
	}
	natsAddr, healthAddr, telemetryAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	dir := t.TempDir()
	// A cluster nobody serves: the watcher reaches Kubernetes only once
	// it is on the bus.
	kubeconfigPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, []byte(`apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
`), 0o600); err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "job-key")
	if err := os.WriteFile(keyFile, []byte(strings.Repeat("k", 32)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestProbesBeforeNATS$", "-test.v")
	cmd.Env = append(os.Environ(), probesChildEnv+"="+strings.Join([]string{natsAddr, healthAddr, telemetryAddr, kubeconfigPath, keyFile}, ","))
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if testing.Verbose() {
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })

	probe := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	eventually := func(what string, cond func() bool) { t.Helper(); pollUntil(t, what, 30*time.Second, cond) }
	for _, addr := range []string{healthAddr, telemetryAddr} {
		eventually("alive on "+addr, func() bool { code, _ := probe("http://" + addr + "/healthz"); return code == http.StatusOK })
		eventually("not ready on "+addr, func() bool {
			code, body := probe("http://" + addr + "/readyz")
			return code == http.StatusServiceUnavailable && strings.Contains(body, "nats: connecting to nats://"+natsAddr+": ")
		})
	}
	if code, body := probe("http://" + telemetryAddr + "/metrics"); code != http.StatusOK ||
		!strings.Contains(body, `headwater_bus_ready{service="watcher"} 0`) || !strings.Contains(body, "headwater_build_info{") {
		t.Errorf("/metrics before NATS = %d, want the build information and headwater_bus_ready 0:\n%s", code, body)
	}
}

// runProbesChild is the child process of TestProbesBeforeNATS: the watcher
// with the NATS, health and telemetry addresses, kubeconfig and job key
// file in opts, until the parent kills it.
func runProbesChild(t *testing.T, opts string) {
	f := strings.Split(opts, ",")
	o := options{kube: kubeconfig.Options{Path: f[3]}, healthAddr: f[1], jobKeyFile: f[4],
		concurrency: 1, eventConcurrency: 1, requeueDependency: time.Second, sourceMetricsInterval: time.Minute}
	o.bus.URL = "nats://" + f[0]
	o.telemetry.Addr = f[2]
	if err := run(logrContext(t), o); err != nil {
		t.Fatal(err)
	}
}

// pollUntil fails the test unless cond turns true within d, asking every
// 20 ms.
func pollUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true within %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logrContext is a context carrying a test logger.
func logrContext(t *testing.T) context.Context {
	return logr.NewContext(context.Background(), testr.New(t))
}

// freeAddr is a local address nothing listens at.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
