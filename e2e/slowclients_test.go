package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/e2e/harness"
)

// TestArtifactServerSlowClients is written as anything that reaches the
// artifact-server (a tenant's pod, a scanner) and tries to starve it: it
// opens as many connections as the server admits (-max-connections) and
// sends half a request on each, never the rest. The server counts them,
// a victim's download waits for a free connection rather than failing,
// the attacker's connections are closed by the server at
// -read-header-timeout, and the victim gets its whole artifact; the wait
// is counted (headwater_artifact_server_connections_waited_total) for
// the operator.
func TestArtifactServerSlowClients(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const maxConns = 4
	e := startPrivateEnv(t, "SlowClients", func(cfg *harness.Config) {
		cfg.ExtraArgs[harness.ArtifactServer] = append(cfg.ExtraArgs[harness.ArtifactServer],
			"-max-connections", strconv.Itoa(maxConns), "-read-header-timeout", "3s", "-idle-timeout", "3s")
	})
	_, c := e.newRepo(t, "slow-victim", map[string]string{"app.yaml": "kind: App\nname: victim\n"})
	e.createSource(t, "slow-victim", e.Git.RepoURL("slow-victim"))
	art := e.waitArtifact(t, "slow-victim", revision(c)).Status.Artifact
	telemetry := e.Service(harness.ArtifactServer).TelemetryAddr

	// The attacker takes every connection the server admits.
	conns := make([]net.Conn, maxConns)
	for i := range conns {
		conn, err := net.Dial("tcp", e.ArtifactAddr)
		if err != nil {
			t.Fatalf("attacker connection %d: %v", i, err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		if _, err := io.WriteString(conn, "GET /"+art.Path+" HTTP/1.1\r\nHost: x\r\n"); err != nil {
			t.Fatalf("attacker connection %d: %v", i, err)
		}
		conns[i] = conn
	}
	eventually(t, "the artifact-server holds the attacker's connections", func() error {
		if v, err := metricSum(telemetry, "headwater_artifact_server_connections"); err != nil || v != maxConns {
			return fmt.Errorf("headwater_artifact_server_connections %v (%v), want %d", v, err, maxConns)
		}
		return nil
	})
	waitedBefore, err := metricSum(telemetry, "headwater_artifact_server_connections_waited_total")
	if err != nil {
		t.Fatal(err)
	}

	// The victim's download waits for a connection, and gets its artifact.
	if got := sha256Digest(download(t, art.URL)); got != art.Digest {
		t.Errorf("the victim downloaded digest %s, want %s", got, art.Digest)
	}
	waited, err := metricSum(telemetry, "headwater_artifact_server_connections_waited_total")
	if err != nil {
		t.Fatal(err)
	}
	if waited <= waitedBefore {
		t.Errorf("headwater_artifact_server_connections_waited_total %v, was %v: the victim's wait was not counted", waited, waitedBefore)
	}

	// The server hung up on every half-sent request (Go's server answers a
	// timed-out header read with nothing, or a 408, then closes): none
	// holds a connection for longer than its read-header timeout.
	for i, conn := range conns {
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
		_, err := io.ReadAll(conn)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("attacker connection %d still open a minute on: the server never closed it", i)
		}
	}
}
