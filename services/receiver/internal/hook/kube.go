package hook

import (
	"context"
	"errors"
	"fmt"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// WebhookPathIndex is the field index of Receivers by status.webhookPath.
const WebhookPathIndex = ".status.webhookPath"

// IndexWebhookPath adds WebhookPathIndex to an informer cache of Receivers.
func IndexWebhookPath(ctx context.Context, c cache.Cache) error {
	err := c.IndexField(ctx, &notificationv1.Receiver{}, WebhookPathIndex, func(o client.Object) []string {
		if p := o.(*notificationv1.Receiver).Status.WebhookPath; p != "" {
			return []string{p}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("index receivers by webhook path: %w", err)
	}
	return nil
}

// CachedReceivers finds Receivers in an informer cache indexed by
// IndexWebhookPath: the receiver lists and watches Receivers, and reads
// nothing else in bulk.
type CachedReceivers struct {
	Reader client.Reader
}

// ByWebhookPath implements Receivers.
func (c CachedReceivers) ByWebhookPath(ctx context.Context, path string) (*notificationv1.Receiver, error) {
	var list notificationv1.ReceiverList
	if err := c.Reader.List(ctx, &list, client.MatchingFields{WebhookPathIndex: path}); err != nil {
		return nil, fmt.Errorf("list receivers by webhook path: %w", err)
	}
	if len(list.Items) == 0 {
		return nil, nil
	}
	return &list.Items[0], nil
}

// ErrNoToken is wrapped by Token's errors when the Secret or its "token"
// key does not exist: the request cannot be validated (400, as Flux).
var ErrNoToken = errors.New("no token")

// tokenOf returns the token of secret key: Flux's messages for a missing
// or empty one.
func tokenOf(key types.NamespacedName, secret *corev1.Secret) ([]byte, error) {
	token, ok := secret.Data["token"]
	if !ok {
		return nil, fmt.Errorf("%w: invalid '%s' secret data: required field 'token'", ErrNoToken, key)
	}
	if len(token) == 0 {
		// An empty token would make every signature checkable by anyone
		// and the webhook path guessable: refused, never "no check".
		return nil, fmt.Errorf("%w: invalid '%s' secret data: field 'token' is empty", ErrNoToken, key)
	}
	return token, nil
}

// PruneOnChange stops the Secret watches of tokens that no Receiver in
// receivers (an informer cache) names any more, whenever a Receiver
// changes or is deleted.
func PruneOnChange(ctx context.Context, receivers cache.Cache, tokens *SecretWatches) error {
	inf, err := receivers.GetInformer(ctx, &notificationv1.Receiver{})
	if err != nil {
		return fmt.Errorf("receiver informer: %w", err)
	}
	prune := func() {
		var list notificationv1.ReceiverList
		if err := receivers.List(ctx, &list); err != nil {
			return // the next change prunes
		}
		named := map[types.NamespacedName]bool{}
		for _, r := range list.Items {
			if r.Spec.SecretRef != nil {
				named[types.NamespacedName{Namespace: r.Namespace, Name: r.Spec.SecretRef.Name}] = true
			}
		}
		tokens.Prune(func(key types.NamespacedName) bool { return named[key] })
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(any, any) { prune() },
		DeleteFunc: func(any) { prune() },
	})
	if err != nil {
		return fmt.Errorf("receiver informer: %w", err)
	}
	return nil
}
