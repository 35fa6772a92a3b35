// Package controller watches Subscriptions (read only: the watcher writes
// their status) and keeps the dispatcher's delivery in step with them.
// Every dispatcher replica runs it, without leader election: they share
// each Subscription's consumer, so each event is delivered by one of them.
package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/services/dispatcher/internal/deliver"
	"github.com/headwater-gitops/headwater/services/dispatcher/internal/dispatch"
	"github.com/headwater-gitops/headwater/services/dispatcher/internal/filter"
)

// The dispatcher's permissions, generated into deploy/base/rbac/dispatcher
// by `make manifests`: it watches Subscriptions and reads the Secrets they
// name, one GET at a time; no writes.
//
// +kubebuilder:rbac:groups=events.headwater.dev,resources=subscriptions,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get

// SecretRecheck is how often a Subscription's Secret is read again, so that
// a rotated HMAC key is used without editing the Subscription.
const SecretRecheck = 5 * time.Minute

// Reconciler keeps one Subscription's delivery running.
type Reconciler struct {
	// Client reads Subscriptions from the cache.
	Client client.Client
	// Secrets reads Secrets live (no cache, no watch of every Secret).
	Secrets client.Reader
	// Dispatcher runs the deliveries.
	Dispatcher *dispatch.Dispatcher
	// NoCrossNamespaceRefs confines every Subscription to its own
	// namespace's events (filter.Confine); one naming another namespace
	// is Ready False, AccessDenied.
	NoCrossNamespaceRefs bool
}

// SetupWithManager registers the reconciler.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&v1alpha1.Subscription{}).Named("subscription").Complete(r)
}

// Reconcile starts, updates or stops one Subscription's delivery. A problem
// that keeps it from being served (a bad selector, a missing Secret, a
// consumer conflict) is reported to the watcher for the Ready condition,
// and looked at again later.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var sub v1alpha1.Subscription
	if err := r.Client.Get(ctx, req.NamespacedName, &sub); err != nil {
		if apierrors.IsNotFound(err) {
			r.Dispatcher.Remove(ctx, req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	ref := events.SubscriptionRef{Namespace: sub.Namespace, Name: sub.Name, UID: string(sub.UID), Generation: sub.Generation}
	s, problem := r.desired(ctx, &sub, ref)
	if problem == nil {
		if err := r.Dispatcher.Ensure(ctx, s); err != nil {
			if !errors.Is(err, dispatch.ErrConsumerConflict) {
				return ctrl.Result{}, err
			}
			problem = &events.Failure{Reason: v1alpha1.ConsumerConflictReason, Message: err.Error()}
		}
	}
	r.Dispatcher.Reports.Problem(ref, problem)
	if problem != nil {
		// Stop delivering with a spec that cannot be served, but keep the
		// consumer: events wait there until it is fixed.
		r.Dispatcher.Stop(req.NamespacedName)
		return ctrl.Result{RequeueAfter: time.Minute}, nil
	}
	if sub.Spec.HTTP != nil && sub.Spec.HTTP.SecretRef != nil {
		return ctrl.Result{RequeueAfter: SecretRecheck}, nil
	}
	return ctrl.Result{}, nil
}

// desired turns a Subscription into what to deliver, or the problem that
// prevents it.
func (r *Reconciler) desired(ctx context.Context, sub *v1alpha1.Subscription, ref events.SubscriptionRef) (*dispatch.Subscription, *events.Failure) {
	f, err := filter.New(sub.Spec)
	if err != nil {
		return nil, &events.Failure{Reason: v1alpha1.InvalidSpecReason, Message: err.Error()}
	}
	if r.NoCrossNamespaceRefs {
		if err := f.Confine(types.NamespacedName{Namespace: sub.Namespace, Name: sub.Name}); err != nil {
			return nil, &events.Failure{Reason: v1alpha1.AccessDeniedReason, Message: err.Error()}
		}
	}
	s := &dispatch.Subscription{Ref: ref, Filter: f}
	switch {
	case sub.Spec.HTTP != nil:
		h := sub.Spec.HTTP
		s.MaxAttempts = h.MaxAttempts
		if s.MaxAttempts <= 0 {
			s.MaxAttempts = v1alpha1.DefaultMaxAttempts
		}
		s.HTTP = &deliver.Target{URL: h.URL, Timeout: 10 * time.Second}
		if h.Timeout != nil && h.Timeout.Duration > 0 {
			s.HTTP.Timeout = h.Timeout.Duration
		}
		if h.SecretRef != nil {
			key, problem := r.hmacKey(ctx, sub.Namespace, h.SecretRef.Name)
			if problem != nil {
				return nil, problem
			}
			s.HTTP.Key = key
		}
	case sub.Spec.NATS != nil:
		s.NATSConsumer = sub.Spec.NATS.Consumer
	default:
		return nil, &events.Failure{Reason: v1alpha1.InvalidSpecReason, Message: "set exactly one of spec.http and spec.nats"}
	}
	return s, nil
}

// hmacKey reads the signing key from a Secret of the Subscription's
// namespace.
func (r *Reconciler) hmacKey(ctx context.Context, namespace, name string) ([]byte, *events.Failure) {
	var secret corev1.Secret
	if err := r.Secrets.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &secret); err != nil {
		return nil, &events.Failure{Reason: v1alpha1.SecretNotFoundReason, Message: fmt.Sprintf("secret %s/%s: %s", namespace, name, reasonOf(err))}
	}
	key := secret.Data[v1alpha1.HMACKey]
	if len(key) == 0 {
		return nil, &events.Failure{Reason: v1alpha1.SecretNotFoundReason,
			Message: fmt.Sprintf("secret %s/%s has no key %q", namespace, name, v1alpha1.HMACKey)}
	}
	return key, nil
}

func reasonOf(err error) string {
	if apierrors.IsNotFound(err) {
		return "not found"
	}
	return err.Error()
}
