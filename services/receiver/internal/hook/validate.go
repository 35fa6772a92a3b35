package hook

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strings"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/google/go-github/v87/github"

	"github.com/headwater-gitops/headwater/pkg/signature"
)

// Supported lists the Receiver types Headwater validates, as Flux's
// notification-controller does. The others (harbor, dockerhub, quay, gcr,
// nexus, acr, cdevents, generic-oidc) are image registries' and CI
// systems' hooks, for consumers Headwater does not serve: the watcher
// marks such a Receiver Stalled, and the handler refuses it.
var Supported = []string{
	notificationv1.GenericReceiver,
	notificationv1.GenericHMACReceiver,
	notificationv1.GitHubReceiver,
	notificationv1.GitLabReceiver,
	notificationv1.BitbucketReceiver,
}

// Request headers the providers send.
const (
	// headerSignature is the generic-hmac signature: "<sha1|sha256|sha512>=<hex HMAC>".
	headerSignature = "X-Signature"
	// headerGitLabToken carries a GitLab webhook's secret token as is.
	headerGitLabToken = "X-Gitlab-Token"
	// headerGitLabEvent is a GitLab webhook's event, e.g. "Push Hook".
	headerGitLabEvent = "X-Gitlab-Event"
	// headerGitLabDelivery identifies a GitLab delivery.
	headerGitLabDelivery = "X-Gitlab-Event-UUID"
	// headerBitbucketEvent is a Bitbucket Server webhook's event, e.g. "repo:refs_changed".
	headerBitbucketEvent = "X-Event-Key"
	// headerBitbucketDelivery identifies a Bitbucket Server delivery.
	headerBitbucketDelivery = "X-Request-Id"
)

// pingEvent is the event GitHub sends when a webhook is created: it proves
// the webhook works and carries no change.
const pingEvent = "ping"

// errInvalid is wrapped by every validation failure: the request is not
// one the Receiver accepts (Flux answers 400).
var errInvalid = errors.New("invalid request")

// replay says when a signed request is checked: now, and how far its
// timestamp may be from now.
type replay struct {
	now       time.Time
	tolerance time.Duration
}

// validate checks a request with its body against a Receiver's type, token
// and event allow-list, as Flux's notification-controller does, and
// returns the provider's event type ("" for the generic types) and its
// delivery ID, if the provider sends one. A generic-hmac request signed by
// a Headwater dispatcher (signature.Header) is checked by that signature,
// which covers the CloudEvent's id, type and time, within the replay
// window; its ce-id is the delivery ID. Every error wraps errInvalid.
func validate(rcv *notificationv1.Receiver, token []byte, r *http.Request, body []byte, w replay) (event, delivery string, err error) {
	if len(token) == 0 {
		// Never reached through the handler (ErrNoToken), kept so that
		// an empty key can never verify anything.
		return "", "", fmt.Errorf("%w: the receiver token is empty", errInvalid)
	}
	switch rcv.Spec.Type {
	case notificationv1.GenericReceiver:
		// The secret path is the only proof.
		return "", "", nil
	case notificationv1.GenericHMACReceiver:
		if r.Header.Get(signature.Header) != "" {
			id, err := signature.Verify(token, r.Header, body, w.now, w.tolerance)
			if err != nil {
				return "", "", fmt.Errorf("%w: unable to validate the %s signature: %w", errInvalid, signature.Header, err)
			}
			return "", id, nil
		}
		if err := github.ValidateSignature(r.Header.Get(headerSignature), body, token); err != nil {
			return "", "", fmt.Errorf("%w: unable to validate HMAC signature: %w", errInvalid, err)
		}
		return "", "", nil
	case notificationv1.GitHubReceiver:
		if err := validateGitHub(r, body, token); err != nil {
			return "", "", fmt.Errorf("%w: the GitHub signature header is invalid: %w", errInvalid, err)
		}
		event = github.WebHookType(r)
		return event, github.DeliveryID(r), allowed(rcv, "GitHub event", event)
	case notificationv1.GitLabReceiver:
		if subtle.ConstantTimeCompare([]byte(r.Header.Get(headerGitLabToken)), token) != 1 {
			return "", "", fmt.Errorf("%w: the X-Gitlab-Token header value does not match the receiver token", errInvalid)
		}
		event = r.Header.Get(headerGitLabEvent)
		return event, r.Header.Get(headerGitLabDelivery), allowed(rcv, "GitLab event", event)
	case notificationv1.BitbucketReceiver:
		// Bitbucket Server signs as GitHub does, in X-Hub-Signature.
		if err := validateGitHub(r, body, token); err != nil {
			return "", "", fmt.Errorf("%w: the Bitbucket server signature header is invalid: %w", errInvalid, err)
		}
		event = r.Header.Get(headerBitbucketEvent)
		return event, r.Header.Get(headerBitbucketDelivery), allowed(rcv, "Bitbucket server event", event)
	}
	return "", "", fmt.Errorf("%w: receiver type '%s' is not supported by Headwater (supported: %s)",
		errInvalid, rcv.Spec.Type, strings.Join(Supported, ", "))
}

// validateGitHub checks a GitHub-style signature (X-Hub-Signature-256,
// else X-Hub-Signature) of a JSON or form-encoded body with go-github, as
// Flux does.
func validateGitHub(r *http.Request, body, token []byte) error {
	signature := r.Header.Get(github.SHA256SignatureHeader)
	if signature == "" {
		signature = r.Header.Get(github.SHA1SignatureHeader)
	}
	contentType, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return fmt.Errorf("content type: %w", err)
	}
	_, err = github.ValidatePayloadFromBody(contentType, strings.NewReader(string(body)), signature, token)
	return err
}

// allowed checks event against the Receiver's spec.events (case
// insensitively); an empty list allows every event.
func allowed(rcv *notificationv1.Receiver, what, event string) error {
	if len(rcv.Spec.Events) == 0 || slices.ContainsFunc(rcv.Spec.Events, func(e string) bool { return strings.EqualFold(e, event) }) {
		return nil
	}
	return fmt.Errorf("%w: the %s '%s' is not authorised", errInvalid, what, event)
}
