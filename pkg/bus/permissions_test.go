package bus_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// secureBus starts a real NATS server that knows only Headwater's
// identities, with the permissions events.Permissions gives them.
func secureBus(t *testing.T) (url string, ids *natsserver.Identities) {
	t.Helper()
	ids, err := natsserver.NewIdentities(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir(), Users: ids.Users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns.ClientURL(), ids
}

// connectAs connects with identity's key; it fails the test when refused.
func connectAs(t *testing.T, url string, ids *natsserver.Identities, identity string) *bus.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bus.Connect(ctx, bus.Options{URL: url, NKeyFile: ids.SeedFiles[identity]}, identity, logr.Discard())
	if err != nil {
		t.Fatalf("connect as %s: %v", identity, err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestServicesWorkWithinTheirPermissions checks that each service can do
// what it does at start-up and at work with only its own permissions: join
// its stream (creating every stream, updating its own), publish its jobs
// or results, and pull, heartbeat and acknowledge its messages.
func TestServicesWorkWithinTheirPermissions(t *testing.T) {
	url, ids := secureBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	flow := []struct {
		identity, stream, consumer string
		// publishes is what the service publishes once it has its job.
		publishSubject, publishType string
	}{
		{events.WatcherIdentity, events.EventStream, events.WatcherConsumer, events.FetchSubject("GitRepository"), events.TypeFetchRequested},
		{events.FetcherIdentity, events.FetchStream, events.FetcherConsumer, events.PackageSubject("GitRepository"), events.TypeFetched},
		{events.PackagerIdentity, events.PackageStream, events.PackagerConsumer, events.PublishSubject("GitRepository"), events.TypePackaged},
		{events.ArtifactServerIdentity, events.PublishStream, events.ArtifactServerConsumer,
			events.EventSubject("GitRepository", "default", "podinfo"), events.TypeArtifactStored},
	}
	conns := map[string]*bus.Conn{}
	for _, f := range flow {
		c := connectAs(t, url, ids, f.identity)
		if _, err := c.JoinStream(ctx, f.stream, f.consumer, events.ConsumerOptions{DeliverNew: f.stream == events.EventStream}); err != nil {
			t.Fatalf("%s joins %s: %v", f.identity, f.stream, err)
		}
		conns[f.identity] = c
	}
	// Each publishes on its own subject, and the next service in line
	// pulls it, heartbeats and acknowledges it.
	next := map[string]string{events.WatcherIdentity: events.FetcherIdentity, events.FetcherIdentity: events.PackagerIdentity,
		events.PackagerIdentity: events.ArtifactServerIdentity, events.ArtifactServerIdentity: events.WatcherIdentity}
	for _, f := range flow {
		job := events.Job{ID: "job-" + f.identity, Object: events.ObjectRef{Kind: "GitRepository", Namespace: "default", Name: "podinfo"}}
		if err := conns[f.identity].NewPublisher(f.identity).Publish(ctx, f.publishSubject, f.publishType, job, &events.Outcome{Job: job}); err != nil {
			t.Fatalf("%s publishes %s: %v", f.identity, f.publishType, err)
		}
		var consumerOf struct{ stream, consumer string }
		for _, g := range flow {
			if g.identity == next[f.identity] {
				consumerOf.stream, consumerOf.consumer = g.stream, g.consumer
			}
		}
		cons, err := conns[next[f.identity]].JS.Consumer(ctx, consumerOf.stream, consumerOf.consumer)
		if err != nil {
			t.Fatalf("%s looks up its consumer: %v", next[f.identity], err)
		}
		msg, err := cons.Next(jetstreamWait())
		if err != nil {
			t.Fatalf("%s pulls from %s: %v", next[f.identity], consumerOf.stream, err)
		}
		if err := msg.InProgress(); err != nil {
			t.Errorf("%s heartbeats: %v", next[f.identity], err)
		}
		if err := msg.DoubleAck(ctx); err != nil {
			t.Errorf("%s acknowledges: %v", next[f.identity], err)
		}
	}
	// Without a receiver or a dispatcher, their streams are not made.
	var streams []string
	names := connectAs(t, url, ids, natsserver.Admin).JS.StreamNames(ctx)
	for n := range names.Name() {
		if !strings.HasPrefix(n, "KV_") {
			streams = append(streams, n)
		}
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(streams)
	if want := []string{events.EventStream, events.FetchStream, events.PackageStream, events.PublishStream}; !slices.Equal(streams, want) {
		t.Errorf("streams %q, want %q", streams, want)
	}
}

// TestWatcherWaitsForTheDeliveryStream: the watcher joins the delivery
// reports' stream only once a dispatcher has made it, told by JetStream's
// announcement of its creation rather than by looking again.
func TestWatcherWaitsForTheDeliveryStream(t *testing.T) {
	url, ids := secureBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	watcher := connectAs(t, url, ids, events.WatcherIdentity)
	if err := watcher.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	found := make(chan error, 1)
	go func() { found <- watcher.WaitForStream(ctx, events.DeliveryStream, time.Hour) }()
	select {
	case err := <-found:
		t.Fatalf("WaitForStream returned before any dispatcher made the stream: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	dispatcher := connectAs(t, url, ids, events.DispatcherIdentity)
	if err := dispatcher.EnsureStreams(ctx); err != nil {
		t.Fatalf("dispatcher ensures its streams: %v", err)
	}
	select {
	case err := <-found:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream's creation was not noticed (the recheck is an hour away)")
	}
	if _, err := watcher.JoinStream(ctx, events.DeliveryStream, events.WatcherConsumer, events.ConsumerOptions{}); err != nil {
		t.Fatalf("watcher joins %s: %v", events.DeliveryStream, err)
	}
	// A stream that exists is found at once.
	if err := watcher.WaitForStream(ctx, events.DeliveryStream, time.Hour); err != nil {
		t.Fatal(err)
	}
}

// TestReceiverHooksReachTheWatcher checks the webhook path within the
// permissions: the receiver creates the streams and publishes a hook, and
// the watcher, on its second stream, pulls and acknowledges it.
func TestReceiverHooksReachTheWatcher(t *testing.T) {
	url, ids := secureBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	receiver := connectAs(t, url, ids, events.ReceiverIdentity)
	if err := receiver.EnsureStreams(ctx); err != nil {
		t.Fatalf("receiver ensures the streams: %v", err)
	}
	watcher := connectAs(t, url, ids, events.WatcherIdentity)
	cons, err := watcher.JoinStream(ctx, events.HookStream, events.WatcherConsumer, events.ConsumerOptions{})
	if err != nil {
		t.Fatalf("watcher joins %s: %v", events.HookStream, err)
	}
	job := events.Job{ID: "delivery-1", Object: events.ObjectRef{Kind: events.ReceiverKind, Namespace: "default", Name: "github"}}
	hook := &events.HookReceived{Job: job, Type: "github", Event: "push",
		Resources: []events.HookResource{{Kind: "GitRepository", Name: "podinfo", Namespace: "default"}}}
	if err := receiver.NewPublisher(events.ReceiverIdentity).Publish(ctx, events.HookSubject("default", "github"),
		events.TypeHookReceived, job, hook); err != nil {
		t.Fatalf("receiver publishes a hook: %v", err)
	}
	msg, err := cons.Next(jetstreamWait())
	if err != nil {
		t.Fatalf("watcher pulls the hook: %v", err)
	}
	if err := msg.DoubleAck(ctx); err != nil {
		t.Errorf("watcher acknowledges the hook: %v", err)
	}
}

// TestBusRefusesWhatAnIdentityMayNotDo checks the server's side: a client
// without a key is refused, and each identity's publishes outside its
// subjects, subscriptions to others' replies and consumer takeovers are
// refused with a permissions violation.
func TestBusRefusesWhatAnIdentityMayNotDo(t *testing.T) {
	url, ids := secureBus(t)
	if nc, err := nats.Connect(url, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client without credentials was let in")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("anonymous client: %v, want an authorization violation", err)
	}

	refused := []struct {
		identity string
		publish  string // a subject it must not publish on
	}{
		{events.FetcherIdentity, events.FetchSubject("GitRepository")},           // forge a fetch job
		{events.FetcherIdentity, events.EventSubject("GitRepository", "a", "b")}, // forge a public event
		{events.PackagerIdentity, events.PackageSubject("GitRepository")},
		{events.ArtifactServerIdentity, events.FetchSubject("GitRepository")},
		{events.WatcherIdentity, events.PublishSubject("GitRepository")}, // forge a result
		{events.SubscriberIdentity, events.EventSubject("GitRepository", "a", "b")},
		{events.SubscriberIdentity, events.FetchSubject("GitRepository")},
		{events.SubscriberIdentity, events.HookSubject("a", "b")},
		// The internet-facing receiver publishes hooks and nothing else.
		{events.ReceiverIdentity, events.FetchSubject("GitRepository")},
		{events.ReceiverIdentity, events.EventSubject("GitRepository", "a", "b")},
		{events.ReceiverIdentity, "$JS.API.CONSUMER.CREATE." + events.HookStream + "." + events.WatcherConsumer},
		{events.ReceiverIdentity, "$JS.API.STREAM.UPDATE." + events.HookStream},
		{events.FetcherIdentity, events.HookSubject("a", "b")},
		// Take over another service's consumer or rewrite a stream it
		// does not own.
		{events.FetcherIdentity, "$JS.API.CONSUMER.CREATE." + events.EventStream + "." + events.WatcherConsumer},
		{events.FetcherIdentity, "$JS.API.STREAM.UPDATE." + events.EventStream},
		{events.FetcherIdentity, "$JS.API.STREAM.DELETE." + events.FetchStream},
		// Nor make a stream it does not use, which would cost an idle
		// bus for a component that is not deployed.
		{events.FetcherIdentity, "$JS.API.STREAM.CREATE." + events.HookStream},
		{events.PackagerIdentity, "$JS.API.STREAM.CREATE." + events.DeliveryStream},
		{events.WatcherIdentity, "$JS.API.STREAM.CREATE." + events.SubscriptionStream},
		{events.WatcherIdentity, "$JS.API.STREAM.PURGE." + events.EventStream},
		// The dispatcher forges no public event, job or result, and a
		// subscriber steals no service's messages.
		{events.DispatcherIdentity, events.EventSubject("GitRepository", "a", "b")},
		{events.DispatcherIdentity, events.FetchSubject("GitRepository")},
		{events.DispatcherIdentity, "$JS.API.CONSUMER.CREATE." + events.FetchStream + "." + events.FetcherConsumer},
		{events.SubscriberIdentity, "$JS.API.CONSUMER.MSG.NEXT." + events.EventStream + "." + events.WatcherConsumer},
		{events.SubscriberIdentity, events.DeliverySubject("a", "b")},
		{events.SubscriberIdentity, events.SubscriptionSubject("a", "b")},
	}
	for _, tc := range refused {
		t.Run(tc.identity+" publishes on "+tc.publish, func(t *testing.T) {
			violations := make(chan error, 4)
			nc, err := nats.Connect(url, mustNKey(t, ids.SeedFiles[tc.identity]), nats.MaxReconnects(0),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer nc.Close()
			if err := nc.Publish(tc.publish, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			_ = nc.Flush()
			select {
			case err := <-violations:
				if !errors.Is(err, nats.ErrPermissionViolation) {
					t.Errorf("error %v, want a permissions violation", err)
				}
			case <-time.After(5 * time.Second):
				t.Error("the publish was not refused")
			}
		})
	}

	t.Run("no one reads another's replies", func(t *testing.T) {
		violations := make(chan error, 4)
		nc, err := nats.Connect(url, mustNKey(t, ids.SeedFiles[events.FetcherIdentity]), nats.MaxReconnects(0),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := nc.SubscribeSync(events.InboxPrefix(events.WatcherIdentity) + ".>"); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		select {
		case err := <-violations:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Errorf("error %v, want a permissions violation", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("the subscription to the watcher's inbox was not refused")
		}
	})
}

// TestPluginConsumerKeepsItsKind: a plug-in fetcher joins its stream with
// its consumer filtered to its kind's jobs, and NATS refuses the same
// consumer filtered to another kind's (a built-in kind's jobs would carry
// other tenants' fetches) or to every kind.
func TestPluginConsumerKeepsItsKind(t *testing.T) {
	const kind = "HTTPSource"
	id := events.PluginIdentity(kind)
	ids, err := natsserver.NewIdentities(t.TempDir(), id)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir(), Users: ids.Users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := connectAs(t, ns.ClientURL(), ids, id)
	if _, err := c.JoinStream(ctx, events.FetchStream, events.PluginConsumer(kind), events.ConsumerOptions{}); err != nil {
		t.Fatalf("the plug-in joins its stream: %v", err)
	}
	for name, filter := range map[string]string{
		"another kind's": events.FetchSubject("GitRepository"),
		"every kind's":   events.FetchSubjectPrefix + ".>",
	} {
		// A refused request is not answered: each waits a few seconds.
		refused := func(cfg jetstream.ConsumerConfig) bool {
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			_, err := c.JS.CreateOrUpdateConsumer(ctx, events.FetchStream, cfg)
			return err != nil
		}
		cfg := events.Consumer(events.FetchStream, events.PluginConsumer(kind), events.ConsumerOptions{FilterSubjects: []string{filter}})
		if !refused(cfg) {
			t.Errorf("the plug-in's consumer was filtered to %s jobs (%s)", name, filter)
		}
		cfg.FilterSubject, cfg.FilterSubjects = "", []string{events.FetchSubject(kind), filter}
		if !refused(cfg) {
			t.Errorf("the plug-in's consumer was filtered to its own and %s jobs", name)
		}
	}
	info, err := c.JS.Consumer(ctx, events.FetchStream, events.PluginConsumer(kind))
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().Config; got.FilterSubject != events.FetchSubject(kind) || len(got.FilterSubjects) != 0 {
		t.Errorf("the consumer filters %q %q, want %s only", got.FilterSubject, got.FilterSubjects, events.FetchSubject(kind))
	}
}

func mustNKey(t *testing.T, seedFile string) nats.Option {
	t.Helper()
	opt, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	return opt
}

// jetstreamWait bounds a test's wait for the next message.
func jetstreamWait() jetstream.FetchOpt { return jetstream.FetchMaxWait(10 * time.Second) }

// TestWatcherShardsJoinTheirConsumers: watcher shards, each with its own
// consumer of the event stream (events.WatcherShardConsumer), join it with
// the watcher's identity, and each receives every public event.
func TestWatcherShardsJoinTheirConsumers(t *testing.T) {
	url, ids := secureBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var shards []jetstream.Consumer
	for _, id := range []string{"", "0a1b2c3d", "4e5f6a7b"} {
		c := connectAs(t, url, ids, events.WatcherIdentity)
		cons, err := c.JoinStream(ctx, events.EventStream, events.WatcherShardConsumer(id), events.ConsumerOptions{DeliverNew: true})
		if err != nil {
			t.Fatalf("shard %q joins %s: %v", id, events.EventStream, err)
		}
		shards = append(shards, cons)
	}
	server := connectAs(t, url, ids, events.ArtifactServerIdentity)
	job := events.Job{ID: "job-1", Object: events.ObjectRef{Kind: "GitRepository", Namespace: "default", Name: "podinfo"}}
	if err := server.NewPublisher(events.ArtifactServerIdentity).Publish(ctx, events.EventSubject("GitRepository", "default", "podinfo"),
		events.TypeArtifactStored, job, &events.Outcome{Job: job}); err != nil {
		t.Fatal(err)
	}
	for i, cons := range shards {
		msg, err := cons.Next(jetstreamWait())
		if err != nil {
			t.Fatalf("shard %d pulls: %v", i, err)
		}
		if err := msg.DoubleAck(ctx); err != nil {
			t.Errorf("shard %d acknowledges: %v", i, err)
		}
	}
}
