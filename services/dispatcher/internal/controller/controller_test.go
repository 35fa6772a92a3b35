package controller

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/services/dispatcher/internal/deliver"
	"github.com/headwater-gitops/headwater/services/dispatcher/internal/dispatch"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// recorder keeps the last report per Subscription name.
type recorder struct {
	mu   sync.Mutex
	last map[string]events.DeliveryReport
}

func (r *recorder) PublishEvent(_ context.Context, _, _, _, _ string, data any) error {
	rep := *data.(*events.DeliveryReport)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last[rep.Subscription.Name] = rep
	return nil
}

func (r *recorder) get(name string) (events.DeliveryReport, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep, ok := r.last[name]
	return rep, ok
}

func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestReconciler runs the reconciler against a real API server and NATS:
// a Subscription whose Secret is missing is reported SecretNotFound and gets
// no consumer; once the Secret exists it is served (a consumer filtered by
// its subjects); deleted, its consumer is removed.
func TestReconciler(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, which builds kube-apiserver and etcd")
	}
	testEnv := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "..", "..", "deploy", "crds")}, ErrorIfCRDPathMissing: true}
	cfg, err := testEnv.Start()
	if err != nil {
		_ = testEnv.Stop() // what started before the failure (a CRD that did not install)
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() { _ = testEnv.Stop() })
	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })

	ctx, cancel := context.WithCancel(context.Background())
	log := testr.New(t)
	conn, err := bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "dispatcher-test", log)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.EnsureStreams(ctx); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Logger: log, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := dispatch.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{last: map[string]events.DeliveryReport{}}
	reports := &dispatch.Reports{Publisher: rec, Dispatcher: "test", Interval: 50 * time.Millisecond, Log: log}
	d := &dispatch.Dispatcher{JS: conn.JS, HTTP: &deliver.Client{}, Reports: reports, Concurrency: 1, Metrics: metrics, Log: log}
	done := make(chan struct{}, 3)
	go func() { _ = d.Start(ctx); done <- struct{}{} }()
	go func() { reports.Run(ctx); done <- struct{}{} }()
	r := &Reconciler{Client: mgr.GetClient(), Secrets: mgr.GetAPIReader(), Dispatcher: d}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
		done <- struct{}{}
	}()
	t.Cleanup(func() {
		cancel()
		for range 3 {
			<-done
		}
		conn.Close()
	})

	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	sub := &v1alpha1.Subscription{
		ObjectMeta: metav1.ObjectMeta{Name: "ci", Namespace: "default"},
		Spec: v1alpha1.SubscriptionSpec{
			Sources: v1alpha1.SourceSelector{Kinds: []string{"GitRepository"}, Namespaces: []string{"apps"}},
			HTTP:    &v1alpha1.HTTPSink{URL: "http://127.0.0.1:1/hook", SecretRef: &meta.LocalObjectReference{Name: "ci-hmac"}},
		},
	}
	if err := c.Create(ctx, sub); err != nil {
		t.Fatal(err)
	}
	eventually(t, "SecretNotFound reported", func() error {
		rep, ok := rec.get("ci")
		if !ok || rep.Problem == nil || rep.Problem.Reason != v1alpha1.SecretNotFoundReason || rep.Subscription.UID != string(sub.UID) {
			return errors.New("no SecretNotFound report yet")
		}
		return nil
	})
	consumer := events.SubscriptionConsumer(string(sub.UID))
	if _, err := conn.JS.Consumer(ctx, events.EventStream, consumer); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("consumer of an unservable subscription: %v, want none", err)
	}

	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ci-hmac", Namespace: "default"},
		Data: map[string][]byte{v1alpha1.HMACKey: []byte("k")}}); err != nil {
		t.Fatal(err)
	}
	// The Secret is not watched: a spec change (or the periodic
	// recheck) reads it again.
	if err := c.Get(ctx, client.ObjectKeyFromObject(sub), sub); err != nil {
		t.Fatal(err)
	}
	sub.Spec.HTTP.MaxAttempts = 3
	if err := c.Update(ctx, sub); err != nil {
		t.Fatal(err)
	}
	eventually(t, "served", func() error {
		rep, ok := rec.get("ci")
		if !ok || rep.Problem != nil || rep.Subscription.Generation != sub.Generation {
			return errors.New("not served yet")
		}
		return nil
	})
	info, err := conn.JS.Consumer(ctx, events.EventStream, consumer)
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	cc := info.CachedInfo().Config
	if len(cc.FilterSubjects) != 1 || cc.FilterSubjects[0] != "headwater.events.gitrepository.apps.*" || cc.MaxDeliver != 3 {
		t.Errorf("consumer filters %q, max deliver %d; want headwater.events.gitrepository.apps.* and 3", cc.FilterSubjects, cc.MaxDeliver)
	}

	if err := c.Delete(ctx, sub); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the consumer removed", func() error {
		if _, err := conn.JS.Consumer(ctx, events.EventStream, consumer); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return errors.New("consumer still there")
		}
		return nil
	})
}
