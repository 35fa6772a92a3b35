package hook

import (
	"context"
	"errors"
	"fmt"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
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

// SecretTokens reads tokens with a direct GET of the one Secret a
// Receiver names: the receiver may get Secrets, never list or watch them,
// so it holds no Secret but the one it needs, and only for the request.
type SecretTokens struct {
	Reader client.Reader
}

// Token implements Tokens, with Flux's messages.
func (s SecretTokens) Token(ctx context.Context, namespace, name string) ([]byte, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	var secret corev1.Secret
	if err := s.Reader.Get(ctx, key, &secret); err != nil {
		if apierrors.IsNotFound(err) {
			err = errors.Join(ErrNoToken, err)
		}
		return nil, fmt.Errorf("unable to read token from secret '%s': %w", key, err)
	}
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
