// Package receiver serves Flux's Receiver kind
// (notification.toolkit.fluxcd.io/v1) in the watcher, when the receivers
// component is installed: a reconciler writes each Receiver's status as
// Flux's notification-controller does (its webhook path from the token
// Secret), and a bus consumer turns the hooks the receiver service accepted
// into fresh fetch jobs for the sources each Receiver names.
package receiver

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/apis/acl"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	"github.com/fluxcd/pkg/runtime/predicates"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/headwater-gitops/headwater/services/watcher/internal/patch"
)

// Supported lists the Receiver types the receiver service validates; a
// Receiver of another type is Stalled with UnsupportedReason.
var Supported = []string{
	notificationv1.GenericReceiver,
	notificationv1.GenericHMACReceiver,
	notificationv1.GitHubReceiver,
	notificationv1.GitLabReceiver,
	notificationv1.BitbucketReceiver,
}

// UnsupportedReason is the reason of Ready=False and Stalled=True on a
// Receiver that uses what Headwater does not implement (another type, CEL
// filters): Flux's notification-controller serves it.
const UnsupportedReason = "UnsupportedByHeadwater"

// tokenRetry is how often a Receiver whose token cannot be read looks
// again (Secrets are not watched: the watcher may only get the one named).
const tokenRetry = 30 * time.Second

// Reconciler writes the status of Receivers.
//
// Conditions: Ready (True, Succeeded, "Receiver initialized for path:
// /hook/<digest>"; False, TokenNotFound, while the token Secret or its
// "token" key is missing or the token is empty; False, UnsupportedByHeadwater, for what Headwater
// does not implement; False, AccessDenied, for a resource of another
// namespace under NoCrossNamespaceRefs), Reconciling (while the token is missing, with
// ProgressingWithRetry) and Stalled (True when unsupported). Ready is
// written last, from the step's result, in one place (mark).
type Reconciler struct {
	// Client reads Receivers from the informer cache and patches status.
	Client client.Client
	// Live reads the token Secret from the API server: a GET of the one
	// Secret, never an informer over all of them.
	Live client.Reader
	// Recorder records Kubernetes Events.
	Recorder recorder.EventRecorder
	// NoCrossNamespaceRefs refuses a Receiver naming a resource of
	// another namespace (Flux's --no-cross-namespace-refs): Ready False,
	// AccessDenied, Stalled, and no hook of it acted on.
	NoCrossNamespaceRefs bool
}

// SetupWithManager registers the reconciler; it reacts to spec changes and
// reconcile requests, and looks again every spec.interval (10m), which is
// when a changed token Secret is seen (as Flux without
// --watch-configs-label-selector).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("receiver").
		For(&notificationv1.Receiver{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicates.ReconcileRequestedPredicate{}))).
		Complete(r)
}

// Reconcile checks the Receiver's spec and token and writes its status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	obj := &notificationv1.Receiver{}
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !obj.GetDeletionTimestamp().IsZero() {
		return ctrl.Result{}, nil
	}
	if obj.Spec.Suspend {
		log.FromContext(ctx).Info("reconciliation is suspended for this object")
		return ctrl.Result{}, nil
	}
	old := conditions.Get(obj, meta.ReadyCondition)

	result := ctrl.Result{RequeueAfter: obj.GetInterval()}
	var path string
	reason, msg := UnsupportedReason, unsupported(obj)
	if msg == "" && r.NoCrossNamespaceRefs {
		if denied := crossNamespace(obj); denied != "" {
			reason, msg = acl.AccessDeniedReason, denied
		}
	}
	if msg == "" {
		if token, err := r.token(ctx, obj); err != nil {
			reason, msg = notificationv1.TokenNotFoundReason, err.Error()
			result = ctrl.Result{RequeueAfter: min(tokenRetry, obj.GetInterval())}
		} else {
			path = obj.GetWebhookPath(token)
			reason, msg = meta.SucceededReason, fmt.Sprintf("Receiver initialized for path: %s", path)
		}
	}
	// Unguarded: only the watcher writes a Receiver's status, and what it
	// writes depends on the spec and the Secret, not on the status read.
	err := patch.Writer{Client: r.Client}.Status(ctx, obj, patch.Options{OnConflict: patch.Overwrite}, func() bool {
		mark(obj, reason, msg, path)
		return true
	})
	if err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(fmt.Errorf("receiver: %w", err))
	}
	if r.Recorder != nil && (old == nil || old.Reason != reason || old.Message != msg) {
		typ := corev1.EventTypeNormal
		if reason != meta.SucceededReason {
			typ = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(obj, nil, typ, reason, "Reconcile", "%s", msg)
	}
	log.FromContext(ctx).V(1).Info("receiver reconciled", "reason", reason, "webhookPath", path)
	return result, nil
}

// mark writes the outcome of a reconcile into status, as Flux does.
func mark(obj *notificationv1.Receiver, reason, msg, path string) {
	if v, ok := meta.ReconcileAnnotationValue(obj.GetAnnotations()); ok {
		obj.Status.LastHandledReconcileAt = v
	}
	obj.Status.WebhookPath = path
	switch reason {
	case meta.SucceededReason:
		conditions.MarkTrue(obj, meta.ReadyCondition, reason, "%s", msg)
		conditions.Delete(obj, meta.ReconcilingCondition)
		conditions.Delete(obj, meta.StalledCondition)
		obj.Status.ObservedGeneration = obj.Generation
	case UnsupportedReason, acl.AccessDeniedReason:
		conditions.MarkFalse(obj, meta.ReadyCondition, reason, "%s", msg)
		conditions.MarkStalled(obj, reason, "%s", msg)
		conditions.Delete(obj, meta.ReconcilingCondition)
		obj.Status.ObservedGeneration = obj.Generation
	default:
		conditions.MarkFalse(obj, meta.ReadyCondition, reason, "%s", msg)
		conditions.MarkReconciling(obj, meta.ProgressingWithRetryReason, "%s", msg)
		conditions.Delete(obj, meta.StalledCondition)
	}
}

// unsupported says what in the spec Headwater does not implement; ""
// when it implements all of it.
func unsupported(obj *notificationv1.Receiver) string {
	stall := func(format string, args ...any) string {
		return fmt.Sprintf(format, args...) + "; Flux's notification-controller serves it"
	}
	if !slices.Contains(Supported, obj.Spec.Type) {
		return stall("receiver type '%s' is not supported by Headwater (supported: %s)", obj.Spec.Type, strings.Join(Supported, ", "))
	}
	if obj.Spec.ResourceFilter != "" {
		return stall("spec.resourceFilter (CEL) is not supported by Headwater")
	}
	for _, res := range obj.Spec.Resources {
		if res.Filter != "" {
			return stall("the filter of resource %s/%s (CEL) is not supported by Headwater", res.Kind, res.Name)
		}
	}
	return ""
}

// crossNamespace says which of the Receiver's resources is in another
// namespace, in notification-controller's words; "" when none is.
func crossNamespace(obj *notificationv1.Receiver) string {
	for _, res := range obj.Spec.Resources {
		if res.Namespace != "" && res.Namespace != obj.Namespace {
			return fmt.Sprintf("can't access '%s/%s/%s', cross-namespace references are not allowed", res.Kind, res.Namespace, res.Name)
		}
	}
	return ""
}

// token reads the "token" key of the Receiver's Secret, with Flux's messages.
func (r *Reconciler) token(ctx context.Context, obj *notificationv1.Receiver) (string, error) {
	if obj.Spec.SecretRef == nil {
		return "", fmt.Errorf("spec.secretRef is required for receiver type '%s'", obj.Spec.Type)
	}
	key := types.NamespacedName{Namespace: obj.Namespace, Name: obj.Spec.SecretRef.Name}
	var secret corev1.Secret
	if err := r.Live.Get(ctx, key, &secret); err != nil {
		return "", fmt.Errorf("unable to read token from secret '%s' error: %w", key, err)
	}
	token, ok := secret.Data["token"]
	if !ok {
		return "", fmt.Errorf("invalid '%s' secret data: required field 'token'", key)
	}
	if len(token) == 0 {
		// An empty token signs nothing and makes the webhook path
		// guessable (a digest of the token, name and namespace): the
		// Receiver is not made Ready, rather than served unchecked.
		return "", fmt.Errorf("invalid '%s' secret data: field 'token' is empty", key)
	}
	return string(token), nil
}

// ready reports whether hooks for the Receiver may be acted on.
func ready(obj *notificationv1.Receiver) bool {
	return !obj.Spec.Suspend && conditions.IsReady(obj) && obj.Status.ObservedGeneration == obj.Generation
}
