// Package subscriptions keeps the status of Subscriptions
// (events.headwater.dev/v1alpha1): the dispatcher, which delivers their
// events and may not write to Kubernetes, reports deliveries, failed
// attempts, dead letters and problems on the bus (TypeDeliveryReported),
// and the watcher adds them up into status and sets Ready.
package subscriptions

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/watcher/internal/patch"
)

// The watcher's permissions on Subscriptions, generated into
// deploy/base/rbac/watcher by `make manifests`: it reads one live before
// writing its status.
//
// +kubebuilder:rbac:groups=events.headwater.dev,resources=subscriptions,verbs=get
// +kubebuilder:rbac:groups=events.headwater.dev,resources=subscriptions/status,verbs=get;patch;update

// reportAttempts bounds the attempts to write one report into status (a
// conflict with another report's write is retried after a backoff).
const reportAttempts = 10

// Consumer applies delivery reports to the Subscriptions' status; a
// manager Runnable, so only the leader writes. The reports' stream is the
// dispatcher's to make: until a dispatcher has made it, the consumer
// waits, with neither a stream nor a consumer on the bus.
type Consumer struct {
	// Conn is the watcher's bus connection.
	Conn *bus.Conn
	// Client writes status; Live reads the Subscription uncached.
	Client client.Client
	Live   client.Reader
	// Concurrency bounds the reports applied at once.
	Concurrency int
	// Metrics records the handling of reports, as for outcomes.
	Metrics *telemetry.JobMetrics
	// Log is the consumer's logger.
	Log logr.Logger
	// Recheck is how often the consumer looks for the reports' stream
	// while no dispatcher has made it, besides JetStream's announcement
	// of its creation; default DefaultRecheck.
	Recheck time.Duration
}

// DefaultRecheck is Consumer.Recheck's default: a backstop for a stream
// creation announced while the watcher was disconnected.
const DefaultRecheck = 5 * time.Minute

var _ manager.Runnable = (*Consumer)(nil)

// Start waits for the reports' stream, then consumes the reports until ctx
// ends.
func (c *Consumer) Start(ctx context.Context) error {
	recheck := c.Recheck
	if recheck <= 0 {
		recheck = DefaultRecheck
	}
	if err := c.Conn.WaitForStream(ctx, events.DeliveryStream, recheck); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	c.Log.Info("a dispatcher made the delivery reports' stream: consuming it", "stream", events.DeliveryStream)
	join := c.Conn.Joiner(events.DeliveryStream, events.WatcherConsumer,
		events.ConsumerOptions{MaxAckPending: 4 * max(c.Concurrency, 1), MaxDeliver: reportAttempts})
	cons, err := join(ctx)
	if err != nil {
		return err
	}
	w := &bus.Worker{Service: "watcher", Consumer: cons, Rejoin: join, Conn: c.Conn, Concurrency: c.Concurrency, Handler: c.handle, Metrics: c.Metrics, Log: c.Log}
	return w.Run(ctx)
}

func (c *Consumer) handle(ctx context.Context, msg *events.Message, _ bus.Delivery) error {
	r, ok := msg.Data.(*events.DeliveryReport)
	if !ok {
		return fmt.Errorf("%w: %s on the delivery stream", events.ErrMalformed, msg.Event.Type())
	}
	var sub v1alpha1.Subscription
	key := types.NamespacedName{Namespace: r.Subscription.Namespace, Name: r.Subscription.Name}
	if err := c.Live.Get(ctx, key, &sub); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // deleted since
		}
		return fmt.Errorf("get subscription %s: %w", key, err)
	}
	if string(sub.UID) != r.Subscription.UID {
		return nil // a report for an earlier Subscription of the same name
	}
	// Guarded by the live read, a conflict returned: the report is
	// redelivered and added to the status as it is then.
	err := patch.Writer{Client: c.Client}.Status(ctx, &sub, patch.Options{OnConflict: patch.ReturnConflict}, func() bool {
		Apply(&sub.Status, r, metav1.Now())
		return true
	})
	if err != nil {
		return fmt.Errorf("subscription %s: %w", key, err)
	}
	return nil
}

// Apply adds a report to a Subscription's status and sets Ready:
//
//   - False with the problem's reason while the dispatcher cannot serve
//     the Subscription (InvalidSpec, SecretNotFound, ConsumerConflict);
//   - False, DeliveryFailed, while the last event given up is more recent
//     than the last one delivered;
//   - True, Succeeded, otherwise.
func Apply(st *v1alpha1.SubscriptionStatus, r *events.DeliveryReport, now metav1.Time) {
	st.Delivered += r.Delivered
	st.FailedAttempts += r.Failed
	st.DeadLetters += r.DeadLettered
	if t := r.LastDelivered; t != nil && (st.LastDeliveredTime == nil || t.After(st.LastDeliveredTime.Time)) {
		mt := metav1.NewTime(*t)
		st.LastDeliveredTime = &mt
	}
	if dl := r.LastDeadLetter; dl != nil && (st.LastDeadLetter == nil || dl.Time.After(st.LastDeadLetter.Time.Time)) {
		st.LastDeadLetter = &v1alpha1.DeadLetter{EventID: dl.EventID, EventType: dl.EventType, Subject: dl.Subject,
			Time: metav1.NewTime(dl.Time), Attempts: dl.Attempts, Error: dl.Error}
	}
	if r.Subscription.Generation < st.ObservedGeneration {
		// A late report about an older spec: its counts count, its
		// problem no longer applies.
		return
	}
	st.ObservedGeneration = r.Subscription.Generation
	cond := metav1.Condition{Type: v1alpha1.ReadyCondition, ObservedGeneration: st.ObservedGeneration, LastTransitionTime: now}
	dl := st.LastDeadLetter
	switch {
	case r.Problem != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, r.Problem.Reason, r.Problem.Message
	case dl != nil && (st.LastDeliveredTime == nil || !st.LastDeliveredTime.After(dl.Time.Time)):
		cond.Status, cond.Reason = metav1.ConditionFalse, v1alpha1.DeliveryFailedReason
		cond.Message = fmt.Sprintf("event %s (%s) was given up after %d attempts: %s", dl.EventID, dl.Subject, dl.Attempts, dl.Error)
	default:
		cond.Status, cond.Reason = metav1.ConditionTrue, v1alpha1.SucceededReason
		cond.Message = fmt.Sprintf("delivered %d events", st.Delivered)
	}
	apimeta.SetStatusCondition(&st.Conditions, cond)
}
