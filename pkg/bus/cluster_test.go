package bus_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// TestStreamReplicasOnACluster runs a real 3-node JetStream cluster (as
// deploy/components/nats-cluster does) with -nats-stream-replicas 3: every
// stream is created with three copies, and a job published before the
// server leading its stream goes is still delivered after.
func TestStreamReplicasOnACluster(t *testing.T) {
	servers, err := natsserver.StartCluster(3, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for _, ns := range servers {
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		urls = append(urls, ns.ClientURL())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := bus.Connect(ctx, bus.Options{URL: strings.Join(urls, ","), StreamReplicas: 3}, events.WatcherIdentity, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	// The cluster elects its JetStream leader after it accepts clients;
	// until then a request goes unanswered.
	eventually(t, "the streams created on the cluster", func() bool {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return conn.EnsureStreams(actx) == nil
	})

	// The watcher makes the streams it uses, each with three copies.
	for _, name := range events.StreamsOf(events.WatcherIdentity) {
		s, err := conn.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info := s.CachedInfo()
		if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Fatalf("%s: %d replicas, cluster %+v: want a leader and two copies", name, info.Config.Replicas, info.Cluster)
		}
	}

	// A job, then the loss of the server that leads the fetch stream.
	j := job("survives")
	if err := conn.NewPublisher(events.WatcherIdentity).Publish(ctx, events.FetchSubject("GitRepository"),
		events.TypeFetchRequested, j, &events.FetchRequested{Job: j}); err != nil {
		t.Fatal(err)
	}
	s, err := conn.JS.Stream(ctx, events.FetchStream)
	if err != nil {
		t.Fatal(err)
	}
	leader := s.CachedInfo().Cluster.Leader
	var lost *server.Server
	for _, ns := range servers {
		if ns.Name() == leader {
			lost = ns
		}
	}
	if lost == nil {
		t.Fatalf("no server named %q leads %s", leader, events.FetchStream)
	}
	lost.Shutdown()
	lost.WaitForShutdown()

	var cons jetstream.Consumer
	eventually(t, "a new leader of the fetch stream", func() bool {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		cons, err = conn.EnsureConsumer(actx, events.FetchStream,
			events.Consumer(events.FetchStream, events.FetcherConsumer, events.ConsumerOptions{}))
		return err == nil
	})
	var got *events.Message
	eventually(t, "the job delivered after the loss", func() bool {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return false
		}
		for msg := range batch.Messages() {
			got, err = events.Decode(msg.Data())
			if err != nil {
				t.Fatal(err)
			}
			_ = msg.Ack()
		}
		return got != nil
	})
	if req, ok := got.Data.(*events.FetchRequested); !ok || req.Job.ID != j.ID {
		t.Fatalf("delivered %+v, want job %s", got.Data, j.ID)
	}
}

// TestStreamReplicasNeedACluster: asking a single server for replicated
// streams fails at start-up, where it is seen, not later.
func TestStreamReplicasNeedACluster(t *testing.T) {
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL(), StreamReplicas: 3}, events.WatcherIdentity, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if err := conn.EnsureStreams(ctx); err == nil {
		t.Fatal("replicated streams were created on a single server")
	}
	if _, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL(), StreamReplicas: 6}, events.WatcherIdentity, testr.New(t)); err == nil {
		t.Fatal("6 replicas accepted")
	}
}

// TestLostServerNoticed: a server that stops answering without closing
// the connection (its node lost: no reset, no FIN) is taken for dead
// within bus.StaleAfter, and the client reconnects to another server of the
// cluster by itself. With the NATS client's defaults it took minutes.
func TestLostServerNoticed(t *testing.T) {
	servers, err := natsserver.StartCluster(3, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range servers {
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	}
	// The client knows the cluster through one address, as through a
	// Service, and learns the others from the servers.
	hole := newBlackhole(t, strings.TrimPrefix(servers[0].ClientURL(), "nats://"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := bus.Connect(ctx, bus.Options{URL: "nats://" + hole.addr(), StreamReplicas: 3}, events.WatcherIdentity, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	eventually(t, "the other servers discovered", func() bool { return len(conn.NC.DiscoveredServers()) >= 2 })
	if got := conn.NC.ConnectedUrl(); !strings.Contains(got, hole.addr()) {
		t.Fatalf("connected to %s, want %s", got, hole.addr())
	}
	hole.swallow()
	lost := time.Now()
	eventuallyWithin(t, bus.StaleAfter+30*time.Second, "a connection to another server", func() bool {
		return conn.NC.IsConnected() && !strings.Contains(conn.NC.ConnectedUrl(), hole.addr())
	})
	t.Logf("reconnected to %s %s after the server went silent", conn.NC.ConnectedUrlRedacted(), time.Since(lost).Round(100*time.Millisecond))
}

// blackhole forwards TCP connections to a server until swallow, then
// drops every byte either way and keeps the connections open: what a
// client sees of a machine that lost its power.
type blackhole struct {
	ln     net.Listener
	target string
	dead   atomic.Bool
}

func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			if b.dead.Load() {
				go b.pipe(c, io.Discard)
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { up.Close() })
			go b.pipe(c, up)
			go b.pipe(up, c)
		}
	}()
	return b
}

func (b *blackhole) addr() string { return b.ln.Addr().String() }

func (b *blackhole) swallow() { b.dead.Store(true) }

// pipe copies from to to until swallow, then reads and drops.
func (b *blackhole) pipe(from net.Conn, to io.Writer) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if err != nil {
			return
		}
		if b.dead.Load() {
			continue
		}
		if _, err := to.Write(buf[:n]); err != nil {
			return
		}
	}
}
