package events_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	cenats "github.com/cloudevents/sdk-go/protocol/nats/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/nats-io/nats.go"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// The worked example of docs/events.md ("A subscriber in Go"), compiled and
// run here so that it cannot rot: TestSubscriberExampleInDocs checks that
// the docs show this code, between the markers, unchanged.

// example:begin

// printSourceChanges prints every new artifact Headwater stores until ctx
// ends: source, revision and download URL, one line each.
func printSourceChanges(ctx context.Context, natsURL string, out io.Writer, opts ...nats.Option) error {
	p, err := cenats.NewConsumer(natsURL, "headwater.events.>", cenats.NatsOptions(opts...))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", natsURL, err)
	}
	defer p.Close(context.Background())
	c, err := cloudevents.NewClient(p)
	if err != nil {
		return err
	}
	return c.StartReceiver(ctx, func(e cloudevents.Event) {
		if e.Type() != "io.headwater.artifact.stored.v1" {
			return // unchanged, failed and deleted sources
		}
		var data struct {
			Artifact struct {
				Revision string `json:"revision"`
				URL      string `json:"url"`
			} `json:"artifact"`
		}
		if err := e.DataAs(&data); err != nil {
			fmt.Fprintf(out, "%s: %v\n", e.ID(), err)
			return
		}
		fmt.Fprintf(out, "%s %s %s\n", e.Subject(), data.Artifact.Revision, data.Artifact.URL)
	})
}

// example:end

// lines is an io.Writer safe for concurrent use.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestSubscriberExample runs the worked example against a real NATS server
// and the events the artifact-server publishes: it prints the stored
// artifact and nothing for an unchanged source.
func TestSubscriberExample(t *testing.T) {
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })

	ctx, cancel := context.WithCancel(context.Background())
	out := &lines{}
	done := make(chan error, 1)
	go func() { done <- printSourceChanges(ctx, ns.ClientURL(), out) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("printSourceChanges: %v", err)
		}
	})

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	publish := func(eventType, name string, revision string) {
		job := events.Job{ID: name + "-job", Object: events.ObjectRef{Kind: "GitRepository", Namespace: "default", Name: name, UID: "u", Generation: 1}, RequestedAt: time.Now()}
		out := &events.Outcome{Job: job, Revision: revision}
		if eventType == events.TypeArtifactStored {
			out.Artifact = &meta.Artifact{
				Path:     "gitrepository/default/" + name + "/abc.tar.gz",
				URL:      "http://artifact-server/gitrepository/default/" + name + "/abc.tar.gz",
				Revision: revision, Digest: "sha256:ab12",
			}
		}
		body, err := events.Encode(events.ArtifactServerIdentity, eventType, events.MessageID(job, eventType), events.ObjectSubject(job.Object), out)
		if err != nil {
			t.Fatal(err)
		}
		msg := &nats.Msg{Subject: events.EventSubject(job.Object.Kind, job.Object.Namespace, job.Object.Name), Header: nats.Header{}, Data: body}
		msg.Header.Set("Content-Type", events.ContentType)
		if err := nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}

	// The subscription starts in the background: publish until the
	// first line arrives.
	want := "gitrepository/default/podinfo main@sha1:abc http://artifact-server/gitrepository/default/podinfo/abc.tar.gz\n"
	deadline := time.After(30 * time.Second)
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for !strings.Contains(out.String(), want) {
		publish(events.TypeArtifactUnchanged, "quiet", "main@sha1:def")
		publish(events.TypeArtifactStored, "podinfo", "main@sha1:abc")
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-poll.C:
		case <-deadline:
			t.Fatalf("the example printed %q, want a line %q", out.String(), want)
		}
	}
	for _, l := range strings.SplitAfter(out.String(), "\n") {
		if l != "" && l != want {
			t.Errorf("unexpected line %q (only stored artifacts are printed)", l)
		}
	}
}

// TestSubscriberExampleInDocs checks that docs/events.md shows the example
// as it is compiled and tested here.
func TestSubscriberExampleInDocs(t *testing.T) {
	src, err := os.ReadFile("subscriber_example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, code, _ := strings.Cut(string(src), "// example:begin\n\n")
	code, _, _ = strings.Cut(code, "\n// example:end")
	doc, err := os.ReadFile("../../docs/events.md")
	if err != nil {
		t.Fatal(err)
	}
	if code == "" || !strings.Contains(string(doc), code) {
		t.Errorf("docs/events.md does not show printSourceChanges as pkg/events/subscriber_example_test.go has it:\n%s", code)
	}
}
