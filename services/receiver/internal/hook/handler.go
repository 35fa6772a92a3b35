// Package hook serves Flux's webhook receiver endpoint, /hook/<digest>: it
// finds the Receiver (notification.toolkit.fluxcd.io/v1) whose
// status.webhookPath is the request's path, validates the request as Flux's
// notification-controller does (HMAC signatures, tokens, the event
// allow-list, a 3 MiB body limit) and publishes what it accepted as an
// io.headwater.hook.received.v1 CloudEvent for the watcher, which alone
// acts on the Kubernetes API.
package hook

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/runtime/conditions"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"k8s.io/apimachinery/pkg/types"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/signature"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// MaxBodyBytes is the largest request body accepted, as Flux's (3 MiB);
// a larger one is answered 413.
const MaxBodyBytes = 3 << 20

// Receivers finds Receivers by webhook path.
type Receivers interface {
	// ByWebhookPath returns the Receiver whose status.webhookPath is path,
	// or nil when there is none.
	ByWebhookPath(ctx context.Context, path string) (*notificationv1.Receiver, error)
}

// Tokens reads the token of a Receiver: the "token" key of the Secret its
// spec.secretRef names, in its namespace.
type Tokens interface {
	Token(ctx context.Context, namespace, secret string) ([]byte, error)
}

// Publisher publishes a hook on the bus (a *bus.Publisher).
type Publisher interface {
	Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error
}

// Handler serves /hook/<digest>.
type Handler struct {
	// Receivers looks the Receiver up by the request's path.
	Receivers Receivers
	// Tokens reads the Receiver's token.
	Tokens Tokens
	// Hooks publishes accepted hooks.
	Hooks Publisher
	// Log is the handler's logger.
	Log logr.Logger
	// Now returns the current time; time.Now when nil.
	Now func() time.Time
	// Tolerance is the replay window of requests signed by a Headwater
	// dispatcher (signature.Header); signature.DefaultTolerance when zero.
	Tolerance time.Duration
	// Limit and Burst bound the requests of each Receiver (a token
	// bucket per Receiver, refilled at Limit per second): past them a
	// request is answered 429 before its Secret is read. Zero Limit
	// means no bound.
	Limit rate.Limit
	Burst int

	requests *prometheus.CounterVec
	mu       sync.Mutex
	limiters map[types.UID]*rate.Limiter
}

// Results of a request, the result label of headwater_receiver_requests_total.
const (
	resultAccepted  = "accepted"
	resultPing      = "ping"
	resultNotFound  = "not_found"
	resultNotReady  = "not_ready"
	resultInvalid   = "invalid"
	resultTooLarge  = "too_large"
	resultError     = "error"
	resultLimited   = "rate_limited"
	requestsMetric  = "receiver_requests_total"
	requestsHelpMsg = "Webhook requests by result: accepted, ping, not_found, not_ready, rate_limited, invalid, too_large, error."
)

// Register registers headwater_receiver_requests_total{result} on reg.
func (h *Handler) Register(reg prometheus.Registerer) {
	h.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Name: requestsMetric, Help: requestsHelpMsg,
	}, []string{"result"})
	reg.MustRegister(h.requests)
}

// ServeHTTP answers as Flux's receiver does: 404 for a path no Receiver
// has, 503 for a suspended or not ready Receiver, 429 past the Receiver's
// rate limit, 413 for a body over
// MaxBodyBytes, 400 for a request that does not validate or whose token
// Secret is gone, 500 when the API server or the bus cannot be reached,
// and 200 once the hook is on the bus. A GitHub ping that validates is answered 200 and
// triggers nothing.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	result := h.serve(w, r)
	if h.requests != nil {
		h.requests.WithLabelValues(result).Inc()
	}
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) string {
	ctx := r.Context()
	path := r.URL.Path
	if !strings.HasPrefix(path, notificationv1.ReceiverWebhookPath) {
		w.WriteHeader(http.StatusNotFound)
		return resultNotFound
	}
	rcv, err := h.Receivers.ByWebhookPath(ctx, path)
	if err != nil {
		h.Log.Error(err, "looking up the receiver")
		w.WriteHeader(http.StatusInternalServerError)
		return resultError
	}
	if rcv == nil {
		w.WriteHeader(http.StatusNotFound)
		return resultNotFound
	}
	log := h.Log.WithValues("namespace", rcv.Namespace, "name", rcv.Name, "type", rcv.Spec.Type)
	if rcv.Spec.Suspend || !conditions.IsReady(rcv) {
		log.Info("refusing a hook: the receiver is suspended or not ready", "suspended", rcv.Spec.Suspend)
		w.WriteHeader(http.StatusServiceUnavailable)
		return resultNotReady
	}

	if !h.allow(rcv.UID) {
		log.V(1).Info("refusing a hook: over the receiver's rate limit")
		w.WriteHeader(http.StatusTooManyRequests)
		return resultLimited
	}

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		if tooLarge := new(http.MaxBytesError); errors.As(err, &tooLarge) {
			log.Info("refusing a hook: the body exceeds the limit", "limit", MaxBodyBytes)
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			return resultTooLarge
		}
		log.Info("refusing a hook: reading the body failed", "error", err.Error())
		w.WriteHeader(http.StatusBadRequest)
		return resultInvalid
	}

	var secret string
	if rcv.Spec.SecretRef != nil {
		secret = rcv.Spec.SecretRef.Name
	}
	token, err := h.Tokens.Token(ctx, rcv.Namespace, secret)
	if errors.Is(err, ErrNoToken) {
		// The Secret or its key is gone since the Receiver was made
		// Ready: the request cannot validate (Flux: 400).
		log.Info("refusing a hook", "reason", err.Error())
		w.WriteHeader(http.StatusBadRequest)
		return resultInvalid
	}
	if err != nil {
		// The API server did not answer: the provider may retry.
		log.Error(err, "reading the receiver's token")
		w.WriteHeader(http.StatusInternalServerError)
		return resultError
	}
	window := replay{now: h.now(), tolerance: h.Tolerance}
	if window.tolerance <= 0 {
		window.tolerance = signature.DefaultTolerance
	}
	event, delivery, err := validate(rcv, token, r, body, window)
	if err != nil {
		// The reason is logged, never answered: a caller without the
		// token learns nothing.
		log.Info("refusing a hook", "reason", err.Error())
		w.WriteHeader(http.StatusBadRequest)
		return resultInvalid
	}
	if rcv.Spec.Type == notificationv1.GitHubReceiver && event == pingEvent {
		log.Info("answered a GitHub ping")
		w.WriteHeader(http.StatusOK)
		return resultPing
	}

	hook := h.hook(rcv, event, delivery)
	if err := h.Hooks.Publish(ctx, events.HookSubject(rcv.Namespace, rcv.Name), events.TypeHookReceived, hook.Job, hook); err != nil {
		log.Error(err, "publishing the hook")
		w.WriteHeader(http.StatusInternalServerError)
		return resultError
	}
	log.Info("hook accepted", "event", event, "hook", hook.Job.ID, "resources", len(hook.Resources))
	w.WriteHeader(http.StatusOK)
	return resultAccepted
}

func (h *Handler) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// allow takes a token from the Receiver's bucket; true when Limit is zero.
func (h *Handler) allow(uid types.UID) bool {
	if h.Limit <= 0 {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	l, ok := h.limiters[uid]
	if !ok {
		if h.limiters == nil {
			h.limiters = map[types.UID]*rate.Limiter{}
		}
		// A full bucket is the same as none: drop those, so deleted
		// Receivers leave nothing behind.
		for k, v := range h.limiters {
			if v.TokensAt(h.now()) >= float64(v.Burst()) {
				delete(h.limiters, k)
			}
		}
		l = rate.NewLimiter(h.Limit, max(h.Burst, 1))
		h.limiters[uid] = l
	}
	return l.AllowN(h.now(), 1)
}

// hook builds the bus message for an accepted request. Its ID is derived
// from the provider's delivery ID when there is one, so a redelivery of
// the same delivery is stored once; otherwise it is random.
func (h *Handler) hook(rcv *notificationv1.Receiver, event, delivery string) *events.HookReceived {
	if delivery == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		delivery = hex.EncodeToString(b[:])
	}
	sum := sha256.Sum256([]byte(delivery))
	now := h.now()
	hook := &events.HookReceived{
		Job: events.Job{
			ID: fmt.Sprintf("hook/%s/%x", rcv.UID, sum[:12]),
			Object: events.ObjectRef{Kind: events.ReceiverKind, Namespace: rcv.Namespace, Name: rcv.Name,
				UID: string(rcv.UID), Generation: rcv.Generation},
			RequestedAt: now,
		},
		Type:  rcv.Spec.Type,
		Event: event,
	}
	for _, res := range rcv.Spec.Resources {
		ns := res.Namespace
		if ns == "" {
			ns = rcv.Namespace
		}
		hook.Resources = append(hook.Resources, events.HookResource{
			APIVersion: res.APIVersion, Kind: res.Kind, Name: res.Name, Namespace: ns, MatchLabels: res.MatchLabels,
		})
	}
	return hook
}
