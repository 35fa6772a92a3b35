package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// The tests in this file disturb shared services, so they do not run in
// parallel (Go runs them before every parallel test).

// TestMalformedFetchJob publishes messages that are not fetch jobs on the
// fetch subject: the fetcher rejects and logs each one, does not crash, and
// later jobs still work.
func TestMalformedFetchJob(t *testing.T) {
	requireEnv(t)
	fetcher := env.Service(harness.Fetcher)
	pid := fetcher.Pid()

	auth, err := env.NATSOption(natsserver.Admin)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(env.NATSURL, auth)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	valid := func(eventType string, data any) string {
		b, err := events.Encode("e2e", eventType, "malformed-"+eventType, "gitrepository/default/malformed", data)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	bodies := []string{
		"not json at all",
		`{"specversion":"1.0"}`,
		`{"specversion":"1.0","id":"x","source":"e2e","type":"io.example.unknown.v1","datacontenttype":"application/json","data":{}}`,
		// A known type whose job names no object.
		valid(events.TypeFetchRequested, events.FetchRequested{Job: events.Job{ID: "malformed-job"}}),
	}
	before := strings.Count(logs(t, fetcher), "rejecting message")
	subject := events.FetchSubject("GitRepository")
	for _, b := range bodies {
		if _, err := js.Publish(t.Context(), subject, []byte(b)); err != nil {
			t.Fatalf("publish on %s: %v", subject, err)
		}
	}

	eventually(t, "fetcher settles every malformed message", func() error {
		c, err := js.Consumer(t.Context(), events.FetchStream, events.FetcherConsumer)
		if err != nil {
			return err
		}
		info, err := c.Info(t.Context())
		if err != nil {
			return err
		}
		if info.NumPending != 0 || info.NumAckPending != 0 {
			return fmt.Errorf("consumer %s: %d pending, %d awaiting ack", events.FetcherConsumer, info.NumPending, info.NumAckPending)
		}
		return nil
	})
	eventually(t, "fetcher logs every rejection", func() error {
		if n := strings.Count(logs(t, fetcher), "rejecting message") - before; n < len(bodies) {
			return fmt.Errorf("%d of %d rejections logged", n, len(bodies))
		}
		return nil
	})
	if !fetcher.Running() || fetcher.Pid() != pid {
		t.Fatalf("fetcher crashed on a malformed message (running %v, exit %v)", fetcher.Running(), fetcher.ExitErr())
	}

	const name = "after-malformed"
	_, commit := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	waitArtifact(t, name, revision(commit))
}

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
