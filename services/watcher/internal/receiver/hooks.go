package receiver

import (
	"context"
	"fmt"
	"strings"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/apis/acl"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/watcher/internal/controller"
)

// Hooks is a manager Runnable that consumes the hooks the receiver service
// accepted: for every source a hook's Receiver names, it triggers a fresh
// reconcile at once (controller.Triggers, rate-limited per source). Like
// the reconcilers it runs on the elected leader only.
type Hooks struct {
	// Conn is the bus connection.
	Conn *bus.Conn
	// Client reads Receivers and sources from the informer cache.
	Client client.Client
	// Scheme makes the list type of each source kind.
	Scheme *runtime.Scheme
	// Triggers are the source controllers' triggers, by kind name
	// ("GitRepository").
	Triggers map[string]*controller.Triggers
	// Recorder records a Warning Event on a Receiver when a source it
	// names does not exist.
	Recorder recorder.EventRecorder
	// Metrics records handled hooks.
	Metrics *telemetry.JobMetrics
	// Log is the consumer's logger.
	Log logr.Logger
	// NoCrossNamespaceRefs skips, with a Warning Event, a resource of
	// another namespace than the Receiver's (the reconciler keeps such a
	// Receiver from Ready; this is the second lock).
	NoCrossNamespaceRefs bool
}

var _ manager.Runnable = (*Hooks)(nil)

// Start consumes until ctx ends.
func (h *Hooks) Start(ctx context.Context) error {
	join := h.Conn.Joiner(events.HookStream, events.WatcherConsumer, events.ConsumerOptions{MaxAckPending: 64})
	cons, err := join(ctx)
	if err != nil {
		return err
	}
	w := &bus.Worker{
		Service:     "watcher",
		Consumer:    cons,
		Rejoin:      join,
		Conn:        h.Conn,
		Concurrency: 4,
		Handler:     h.handle,
		Metrics:     h.Metrics,
		Log:         h.Log,
	}
	return w.Run(ctx)
}

// handle triggers the sources of one hook. The hook's own list of
// resources is not trusted: the Receiver is read again, and acted on only
// while it is Ready and not suspended.
func (h *Hooks) handle(ctx context.Context, msg *events.Message, _ bus.Delivery) error {
	hook, ok := msg.Data.(*events.HookReceived)
	if !ok {
		return fmt.Errorf("%w: %T on the hook stream", events.ErrMalformed, msg.Data)
	}
	log := logr.FromContextOrDiscard(ctx)
	key := types.NamespacedName{Namespace: hook.Job.Object.Namespace, Name: hook.Job.Object.Name}
	rcv := &notificationv1.Receiver{}
	if err := h.Client.Get(ctx, key, rcv); err != nil {
		if apierrors.IsNotFound(err) {
			log.Info("hook for a receiver that no longer exists")
			return nil
		}
		return fmt.Errorf("get receiver: %w", err)
	}
	if !ready(rcv) || string(rcv.UID) != hook.Job.Object.UID {
		log.Info("hook for a receiver that is not ready, suspended or re-created; ignored")
		return nil
	}
	var triggered, coalesced int
	for _, res := range rcv.Spec.Resources {
		keys, err := h.resolve(ctx, rcv, res.CrossNamespaceObjectReference)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if h.Triggers[res.Kind].Trigger(ctx, k) {
				coalesced++
			} else {
				triggered++
			}
		}
	}
	log.Info("hook handled", "event", hook.Event, "triggered", triggered, "coalesced", coalesced)
	return nil
}

// resolve returns the sources one of a Receiver's resources names: the
// named object, or with name "*" every object of the kind in the namespace
// matching matchLabels. Kinds Headwater does not serve (Kustomization,
// ImageRepository, ...) are left to their controllers: ignored, logged.
func (h *Hooks) resolve(ctx context.Context, rcv *notificationv1.Receiver, res notificationv1.CrossNamespaceObjectReference) ([]types.NamespacedName, error) {
	log := logr.FromContextOrDiscard(ctx)
	ns := res.Namespace
	if ns == "" {
		ns = rcv.Namespace
	}
	if h.NoCrossNamespaceRefs && ns != rcv.Namespace {
		if h.Recorder != nil {
			h.Recorder.Eventf(rcv, nil, corev1.EventTypeWarning, acl.AccessDeniedReason, "Hook",
				"can't access '%s/%s/%s', cross-namespace references are not allowed", res.Kind, ns, res.Name)
		}
		return nil, nil
	}
	trig, served := h.Triggers[res.Kind]
	if !served || (res.APIVersion != "" && !strings.HasPrefix(res.APIVersion, sourcev1.GroupVersion.Group+"/")) {
		log.Info("resource of a kind Headwater does not serve; ignored", "kind", res.Kind, "apiVersion", res.APIVersion)
		return nil, nil
	}
	if res.Name != "*" {
		obj := trig.New()
		if err := h.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: res.Name}, obj); err != nil {
			if apierrors.IsNotFound(err) {
				h.warn(rcv, "unable to read %s '%s/%s': not found", res.Kind, ns, res.Name)
				return nil, nil
			}
			return nil, fmt.Errorf("get %s %s/%s: %w", res.Kind, ns, res.Name, err)
		}
		return []types.NamespacedName{{Namespace: ns, Name: res.Name}}, nil
	}
	if res.MatchLabels == nil {
		h.warn(rcv, "matchLabels field not set when using wildcard '*' as name")
		return nil, nil
	}
	list, err := h.Scheme.New(sourcev1.GroupVersion.WithKind(res.Kind + "List"))
	if err != nil {
		return nil, fmt.Errorf("list type of %s: %w", res.Kind, err)
	}
	objs := list.(client.ObjectList)
	if err := h.Client.List(ctx, objs, client.InNamespace(ns), client.MatchingLabels(res.MatchLabels)); err != nil {
		return nil, fmt.Errorf("list %s in %s: %w", res.Kind, ns, err)
	}
	var keys []types.NamespacedName
	if err := forEach(objs, func(o client.Object) { keys = append(keys, client.ObjectKeyFromObject(o)) }); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		log.Info("no resources match", "kind", res.Kind, "namespace", ns, "matchLabels", res.MatchLabels)
	}
	return keys, nil
}

// warn records a Warning Event on the Receiver (Flux logs these).
func (h *Hooks) warn(rcv *notificationv1.Receiver, format string, args ...any) {
	if h.Recorder != nil {
		h.Recorder.Eventf(rcv, nil, corev1.EventTypeWarning, "ResourceNotFound", "Hook", format, args...)
	}
}
