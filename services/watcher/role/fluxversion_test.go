package role

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/headwater-gitops/headwater/pkg/kubeconfig"
)

// olderFluxChildEnv carries the options of the watcher TestOlderFluxCRDs
// runs in a child process: its NATS URL, health address, kubeconfig and
// job key file, comma-separated.
const olderFluxChildEnv = "HEADWATER_TEST_OLDER_FLUX_CHILD"

// TestOlderFluxCRDs runs the watcher on a cluster whose CRDs are Flux
// 2.6's (every source kind, but neither ExternalArtifact nor
// ArtifactGenerator): /readyz and a Warning Event on the watcher's Pod
// name the missing kinds and the Flux release that brought them; once the
// CRDs of a newer Flux are applied, /readyz no longer names them. The
// watcher runs in a child process (it registers its metrics in
// controller-runtime's global registry, once per process).
func TestOlderFluxCRDs(t *testing.T) {
	if opts := os.Getenv(olderFluxChildEnv); opts != "" {
		runOlderFluxChild(t, opts)
		return
	}
	crds := filepath.Join("..", "..", "..", "deploy", "crds")
	older := t.TempDir()
	entries, err := os.ReadDir(crds)
	if err != nil {
		t.Fatal(err)
	}
	var newer []string
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "source.") {
			continue
		}
		if strings.Contains(name, "externalartifacts") || strings.Contains(name, "artifactgenerators") {
			newer = append(newer, filepath.Join(crds, name))
			continue
		}
		b, err := os.ReadFile(filepath.Join(crds, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(older, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, kubeconfigPath := startControlPlane(t, older)
	keyFile := writeJobKey(t)
	natsURL := startNATS(t)

	healthAddr := freeAddr(t)
	const pod = "headwater-watcher-0"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestOlderFluxCRDs$", "-test.v")
	cmd.Env = append(os.Environ(), "POD_NAME="+pod, "POD_NAMESPACE=default",
		olderFluxChildEnv+"="+strings.Join([]string{natsURL, healthAddr, kubeconfigPath, keyFile}, ","))
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if testing.Verbose() {
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })

	readyz := func() string {
		resp, err := http.Get("http://" + healthAddr + "/readyz")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	eventually := func(what string, cond func() bool) { t.Helper(); pollUntil(t, what, 60*time.Second, cond) }
	const wantMissing = "ArtifactGenerator (source.extensions.fluxcd.io/v1beta1, Flux 2.7 and later), " +
		"ExternalArtifact (source.toolkit.fluxcd.io/v1, Flux 2.7 and later); Headwater works with the CRDs of Flux 2.7 and later"
	eventually("/readyz names the kinds of Flux 2.7", func() bool { return strings.Contains(readyz(), wantMissing) })

	k8s, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var event corev1.Event
	eventually("a CRDsMissing Event on the watcher's Pod", func() bool {
		var list corev1.EventList
		if err := k8s.List(ctx, &list, client.InNamespace("default")); err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.InvolvedObject.Kind == "Pod" && e.InvolvedObject.Name == pod && e.Reason == "CRDsMissing" {
				event = e
				return true
			}
		}
		return false
	})
	if event.Type != corev1.EventTypeWarning || !strings.Contains(event.Message, wantMissing) {
		t.Errorf("Event %s %q, want a Warning naming %q", event.Type, event.Message, wantMissing)
	}

	// The CRDs of Flux 2.7: the watcher stops naming them.
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: newer, ErrorIfPathMissing: true}); err != nil {
		t.Fatal(err)
	}
	eventually("/readyz no longer names missing kinds", func() bool {
		body := readyz()
		return !strings.Contains(body, "does not serve") && !strings.Contains(body, "connection refused")
	})
}

// runOlderFluxChild is the child process of TestOlderFluxCRDs: the watcher
// with the NATS URL, health address, kubeconfig and job key file in opts,
// until the parent kills it.
func runOlderFluxChild(t *testing.T, opts string) {
	f := strings.Split(opts, ",")
	o := options{kube: kubeconfig.Options{Path: f[2]}, healthAddr: f[1], jobKeyFile: f[3], leaderElectionNamespace: "default",
		concurrency: 1, eventConcurrency: 1, requeueDependency: time.Second, sourceMetricsInterval: time.Minute}
	o.bus.URL = f[0]
	o.telemetry.Addr = "0"
	if err := run(logrContext(t), o); err != nil {
		t.Fatal(err)
	}
}
