package role

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/command"
	"github.com/headwater-gitops/headwater/pkg/kubeconfig"

	"github.com/headwater-gitops/headwater/services/receiver/internal/hook"
)

// shutdownTimeout bounds how long requests in progress may finish after a
// stop signal.
const shutdownTimeout = 10 * time.Second

// Flux's limits on the receiver's requests.
const (
	maxHeaderBytes    = 256 << 10
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
)

// run serves the webhook endpoint until ctx ends. It logs with ctx's logger.
func run(ctx context.Context, o options) error {
	log := logr.FromContextOrDiscard(ctx)
	ctrl.SetLogger(log)

	// The endpoints answer before the service reaches Kubernetes and NATS:
	// alive at once, ready once its Receivers are cached and it is on the
	// bus (see package telemetry). They stop when run returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ep, err := bus.ServeEndpoints(ctx, o.telemetry.Addr, service, log, bus.EndpointOptions{Waiting: map[string]string{"receivers": "cache not synced yet"}})
	if err != nil {
		return err
	}
	reg, ready, onBus := ep.Registry, ep.Ready, ep.Bus

	cfg, err := kubeconfig.Load(o.kubeconfig)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	if err := notificationv1.AddToScheme(scheme); err != nil {
		return err
	}
	// The informer cache holds Receivers only; a Secret is watched alone,
	// from the first request of a Receiver that names it until no
	// Receiver does (hook.SecretWatches).
	receivers, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return fmt.Errorf("receiver cache: %w", err)
	}
	if err := hook.IndexWebhookPath(ctx, receivers); err != nil {
		return err
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	tokens := &hook.SecretWatches{Client: clientset}
	tokens.Register(reg)
	defer tokens.Stop()
	if err := hook.PruneOnChange(ctx, receivers, tokens); err != nil {
		return err
	}

	conn, err := bus.Connect(ctx, o.bus, service, log, bus.ReportTo(onBus))
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.EnsureStreams(ctx); err != nil {
		return err
	}
	onBus.Up(conn)

	cacheErr := make(chan error, 1)
	go func() { cacheErr <- receivers.Start(ctx) }()
	if !receivers.WaitForCacheSync(ctx) {
		cancel()
		return errors.Join(errors.New("receiver cache did not sync"), <-cacheErr)
	}
	ready.Set("receivers", nil)

	h := &hook.Handler{
		Receivers: hook.CachedReceivers{Reader: receivers},
		Tokens:    tokens,
		Hooks:     conn.NewPublisher(service),
		Log:       log.WithName("hook"),
		Tolerance: o.tolerance,
		Limit:     rate.Limit(o.hookRate),
		Burst:     o.hookBurst,
	}
	h.Register(reg)
	mux := http.NewServeMux()
	mux.Handle(notificationv1.ReceiverWebhookPath, h)

	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.addr, err)
	}
	srv := &http.Server{
		Handler:           mux,
		MaxHeaderBytes:    maxHeaderBytes,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		IdleTimeout:       2 * time.Minute,
	}
	log.Info("serving webhooks", "addr", ln.Addr().String())
	context.AfterFunc(ctx, func() { log.Info("shutting down") })
	serveErr := command.Serve(ctx, srv, ln, shutdownTimeout)
	cancel()
	return errors.Join(serveErr, <-cacheErr)
}
