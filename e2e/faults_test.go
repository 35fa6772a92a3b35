package e2e

import (
	"testing"

	"github.com/headwater-gitops/headwater/e2e/harness"
)

// The tests in this file disturb shared services, so they do not run in
// parallel (Go runs them before every parallel test).

// TestServiceRestart restarts the fetcher gracefully and kills the packager
// as a crash would, restarts it, and checks that a source still becomes
// Ready afterwards.
func TestServiceRestart(t *testing.T) {
	requireEnv(t)
	if err := env.Service(harness.Fetcher).Restart(t.Context()); err != nil {
		t.Fatalf("fetcher restart (it must exit cleanly on SIGTERM): %v", err)
	}
	packager := env.Service(harness.Packager)
	packager.Kill()
	if packager.Running() {
		t.Fatal("packager still running after Kill")
	}
	if err := packager.Start(t.Context()); err != nil {
		t.Fatal(err)
	}

	const name = "after-restart"
	_, commit := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	waitArtifact(t, name, revision(commit))
}

func logs(t *testing.T, s *harness.Service) string {
	t.Helper()
	l, err := s.Logs()
	if err != nil {
		t.Fatal(err)
	}
	return l
}
