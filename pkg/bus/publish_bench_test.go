package bus_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// BenchmarkPublishHandle publishes b.N outcomes, each waiting for
// JetStream's acknowledgement as the services' publishes do, and has a
// worker handle them all: the cost of one message through the bus as the
// services pay it, with whatever tracer provider is installed (none:
// OpenTelemetry's no-op). docs/performance.md compares it with the code
// before tracing.
func BenchmarkPublishHandle(b *testing.B) {
	benchmarkPublishHandle(b, context.Background())
}

func benchmarkPublishHandle(b *testing.B, ctx context.Context) {
	ns, err := natsserver.Start(natsserver.Options{StoreDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	conn, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "bench", logr.Discard())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if err := conn.EnsureStreams(ctx); err != nil {
		b.Fatal(err)
	}
	cons, err := conn.EnsureConsumer(ctx, events.PublishStream, events.Consumer(events.PublishStream, "bench", events.ConsumerOptions{}))
	if err != nil {
		b.Fatal(err)
	}
	pub := conn.NewPublisher("bench")
	var handled atomic.Int64
	all := make(chan struct{})
	w := &bus.Worker{
		Service: "bench", Consumer: cons, Concurrency: 8, Log: logr.Discard(),
		Handler: func(context.Context, *events.Message, bus.Delivery) error {
			if handled.Add(1) == int64(b.N) {
				close(all)
			}
			return nil
		},
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	defer func() { cancel(); <-done }()
	subject := events.PublishSubject("GitRepository")
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		j := events.Job{ID: fmt.Sprintf("job-%d", i),
			Object: events.ObjectRef{Kind: "GitRepository", Namespace: "flux-system", Name: "podinfo", UID: "uid-1", Generation: 1}}
		if err := pub.Publish(ctx, subject, events.TypePackaged, j, &events.Outcome{Job: j}); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-all:
	case <-time.After(time.Minute):
		b.Fatalf("%d of %d handled after a minute", handled.Load(), b.N)
	}
}
