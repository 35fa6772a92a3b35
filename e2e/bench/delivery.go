package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/nats-io/nats.go"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// Counters of scenario l: latency percentiles in milliseconds (rounded up)
// and the events they are taken over.
const (
	CounterP50 = "p50 ms"
	CounterP99 = "p99 ms"
	// CounterEvents is the number of artifact.stored events received.
	CounterEvents = "events"
)

// deliverySources is scenario l's number of GitRepositories, each one
// artifact change, over deliveryRepos repositories.
const (
	deliverySources = 1000
	deliveryRepos   = 10
)

// latencies collects the delay of each artifact.stored event, from the
// event's time (set by the artifact-server as it announces the stored
// artifact) to its arrival, once per event ID.
type latencies struct {
	mu   sync.Mutex
	seen map[string]time.Duration
}

func newLatencies() *latencies { return &latencies{seen: map[string]time.Duration{}} }

func (l *latencies) add(id string, stored time.Time, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.seen[id]; !dup {
		l.seen[id] = now.Sub(stored)
	}
}

func (l *latencies) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

// percentile is the q-quantile (nearest rank) of the latencies.
func (l *latencies) percentile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	ds := make([]time.Duration, 0, len(l.seen))
	for _, d := range l.seen {
		ds = append(ds, d)
	}
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[max(i, 0)]
}

// withLatency is m with l's percentiles as counters and a note.
func withLatency(m Measurement, l *latencies, path string) *Measurement {
	p50, p99 := l.percentile(0.50), l.percentile(0.99)
	ms := func(d time.Duration) int64 { return int64(math.Ceil(float64(d) / float64(time.Millisecond))) }
	m.Counters = map[string]int64{CounterEvents: int64(l.count()), CounterP50: ms(p50), CounterP99: ms(p99)}
	m.Notes = append(slices.Clone(m.Notes), fmt.Sprintf("%s: artifact.stored time -> arrival over %d events: p50 %.1f ms, p99 %.1f ms, max %.1f ms",
		path, l.count(), float64(p50)/float64(time.Millisecond), float64(p99)/float64(time.Millisecond),
		float64(l.percentile(1))/float64(time.Millisecond)))
	return &m
}

// Delivery runs scenario l on Headwater with the dispatcher: a plain NATS
// subscriber (the subscriber identity on headwater.events.>) and an HTTP
// sink behind a Subscription wait for artifact.stored; then 1000
// GitRepositories are created over 10 repositories, so 1000 artifacts are
// stored through the whole pipeline. Wall, CPU and memory are those of the
// creation (as in a); the latencies are from each event's time to its
// arrival at each receiver, both in this process, on the same clock.
func Delivery(ctx context.Context, o Options) (toNATS, toHTTP *Measurement, err error) {
	o.Harness.Dispatcher = true
	env, stop, err := startEnv(ctx, o, "delivery", Headwater)
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	c, err := benchClient(ctx, env)
	if err != nil {
		return nil, nil, err
	}

	// The NATS subscriber.
	viaNATS := newLatencies()
	opt, err := env.NATSOption(events.SubscriberIdentity)
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(env.NATSURL, opt)
	if err != nil {
		return nil, nil, fmt.Errorf("subscriber: %w", err)
	}
	defer nc.Close()
	if _, err := nc.Subscribe(events.EventSubjectPrefix+".>", func(msg *nats.Msg) {
		now := time.Now()
		if m, err := events.Decode(msg.Data); err == nil && m.Event.Type() == events.TypeArtifactStored {
			viaNATS.add(m.Event.ID(), m.Event.Time(), now)
		}
	}); err != nil {
		return nil, nil, fmt.Errorf("subscribe: %w", err)
	}

	// The HTTP sink and its Subscription.
	viaHTTP := newLatencies()
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		e, err := binding.ToEvent(r.Context(), cehttp.NewMessageFromHttpRequest(r))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		viaHTTP.add(e.ID(), e.Time(), now)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer sink.Close()
	sub := &v1alpha1.Subscription{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-http", Namespace: namespace},
		Spec: v1alpha1.SubscriptionSpec{
			Sources: v1alpha1.SourceSelector{Kinds: []string{sourcev1.GitRepositoryKind}, Namespaces: []string{namespace}},
			Types:   []string{events.TypeArtifactStored},
			HTTP:    &v1alpha1.HTTPSink{URL: sink.URL},
		},
	}
	if err := c.Create(ctx, sub); err != nil {
		return nil, nil, fmt.Errorf("subscription: %w", err)
	}
	if err := waitFor(ctx, time.Minute, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(sub), sub); err != nil {
			return err
		}
		if !apimeta.IsStatusConditionTrue(sub.Status.Conditions, v1alpha1.ReadyCondition) {
			return errors.New("subscription not Ready")
		}
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("subscription: %w", err)
	}

	urls, err := linkSmallRepos(env, deliveryRepos, o.Progress)
	if err != nil {
		return nil, nil, err
	}
	names := make([]string, deliverySources)
	for i := range names {
		names[i] = fmt.Sprintf("src-%05d", i)
	}
	sctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()
	o.progress("l: creating %d GitRepositories over %d repositories, receiving their events over NATS and HTTP", deliverySources, deliveryRepos)
	created, err := measure(sctx, o, "l", env, c, readyWithArtifact[*sourcev1.GitRepository], len(names), func(ctx context.Context) error {
		return forEach(ctx, names, func(ctx context.Context, i int, name string) error {
			return c.Create(ctx, gitRepository(name, urls[i%len(urls)], smallInterval))
		})
	})
	if err != nil {
		return nil, nil, wrapScenario("l", err)
	}
	if err := waitFor(sctx, 2*time.Minute, func() error {
		if n, m := viaNATS.count(), viaHTTP.count(); n < deliverySources || m < deliverySources {
			return fmt.Errorf("received %d over NATS and %d over HTTP of %d", n, m, deliverySources)
		}
		return nil
	}); err != nil {
		return nil, nil, wrapScenario("l", err)
	}
	return withLatency(*created, viaNATS, "NATS subscriber"), withLatency(*created, viaHTTP, "HTTP sink via a Subscription"), nil
}

// waitFor polls check every 100 ms until it returns nil or d passes.
func waitFor(ctx context.Context, d time.Duration, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		case <-tick.C:
		}
	}
}
