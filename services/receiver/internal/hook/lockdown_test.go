package hook

import (
	"bytes"
	"context"
	"crypto/sha256"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/headwater-gitops/headwater/pkg/signature"
)

// post serves one request and returns its status code.
func post(h *Handler, path string, header http.Header, body []byte) int {
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

// TestEmptyTokenIsRefused: a Secret whose token is empty is no token (the
// request is refused, never accepted unchecked), whatever the type.
func TestEmptyTokenIsRefused(t *testing.T) {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "webhook-token"}, Data: map[string][]byte{"token": {}}}
	_, err := tokenOf(types.NamespacedName{Namespace: "apps", Name: "webhook-token"}, secret)
	if err == nil || !strings.Contains(err.Error(), "field 'token' is empty") {
		t.Fatalf("Token = %v, want an empty-token error", err)
	}
	for _, typ := range []string{notificationv1.GenericReceiver, notificationv1.GenericHMACReceiver} {
		rcv := receiver("empty-"+typ, typ)
		pub := &published{}
		h := &Handler{Receivers: receivers{rcv}, Tokens: tokens{"apps/webhook-token": ""}, Hooks: pub, Log: logr.Discard()}
		if code := post(h, rcv.Status.WebhookPath, http.Header{"X-Signature": {"sha256=" + sign(sha256.New, "", nil)}}, nil); code != http.StatusBadRequest || len(pub.hooks) != 0 {
			t.Errorf("%s with an empty token: %d, %d hooks; want 400 and none", typ, code, len(pub.hooks))
		}
	}
}

// signedV2 returns the headers of a dispatcher's delivery of body with id,
// signed with key at ts.
func signedV2(key, id string, ts time.Time, body []byte) http.Header {
	h := http.Header{}
	h.Set("Ce-Id", id)
	h.Set("Ce-Type", "io.headwater.artifact.stored.v1")
	h.Set("Ce-Time", "2023-11-14T22:13:20Z")
	h.Set("Content-Type", "application/json")
	m := signature.FromRequest(h, body)
	m.Timestamp = ts.Unix()
	h.Set(signature.Header, signature.Sign([]byte(key), m))
	return h
}

// TestSignedDeliveriesAndReplays: a generic-hmac Receiver checks a
// Headwater dispatcher's version 2 signature; the same request replayed
// inside the window makes the same hook (stored once on the bus), after
// the window it is refused, and a changed ce-id does not verify.
func TestSignedDeliveriesAndReplays(t *testing.T) {
	rcv := receiver("hmac", notificationv1.GenericHMACReceiver)
	clk := testingclock.NewFakeClock(time.Unix(1700000000, 0))
	pub := &published{}
	h := &Handler{Receivers: receivers{rcv}, Tokens: tokens{"apps/webhook-token": testToken}, Hooks: pub, Log: logr.Discard(), Now: clk.Now}
	body := []byte(`{"revision":"main@sha1:abc"}`)
	captured := signedV2(testToken, "event-1", clk.Now(), body)
	if code := post(h, rcv.Status.WebhookPath, captured, body); code != http.StatusOK || len(pub.hooks) != 1 {
		t.Fatalf("a signed delivery: %d, %d hooks", code, len(pub.hooks))
	}
	clk.Step(time.Minute)
	if code := post(h, rcv.Status.WebhookPath, captured, body); code != http.StatusOK || len(pub.hooks) != 2 || pub.hooks[1].Job.ID != pub.hooks[0].Job.ID {
		t.Fatalf("a replay inside the window: %d, %d hooks; want the same hook ID, stored once", code, len(pub.hooks))
	}
	clk.Step(signature.DefaultTolerance)
	if code := post(h, rcv.Status.WebhookPath, captured, body); code != http.StatusBadRequest || len(pub.hooks) != 2 {
		t.Errorf("a replay after the window: %d, %d hooks; want 400", code, len(pub.hooks))
	}
	forged := signedV2(testToken, "event-2", clk.Now(), body)
	forged.Set("Ce-Id", "event-3")
	if code := post(h, rcv.Status.WebhookPath, forged, body); code != http.StatusBadRequest {
		t.Errorf("a changed ce-id: %d, want 400", code)
	}
	// A request with the V2 header is not let through by a valid
	// body-only signature beside an invalid V2 one.
	mixed := signedV2("wrong", "event-4", clk.Now(), body)
	mixed.Set("X-Signature", "sha256="+sign(sha256.New, testToken, body))
	if code := post(h, rcv.Status.WebhookPath, mixed, body); code != http.StatusBadRequest {
		t.Errorf("an invalid V2 signature beside a valid X-Signature: %d, want 400", code)
	}
}

// TestRateLimitPerReceiver: past its burst a Receiver's requests are
// answered 429 before its Secret is read, another Receiver is served, and
// the bucket refills with time.
func TestRateLimitPerReceiver(t *testing.T) {
	a, b := receiver("a", notificationv1.GenericReceiver), receiver("b", notificationv1.GenericReceiver)
	clk := testingclock.NewFakeClock(time.Unix(1700000000, 0))
	reads := &countingTokens{Tokens: tokens{"apps/webhook-token": testToken}}
	h := &Handler{Receivers: receivers{a, b}, Tokens: reads, Hooks: &published{}, Log: logr.Discard(), Now: clk.Now, Limit: 1, Burst: 3}
	for i := range 3 {
		if code := post(h, a.Status.WebhookPath, nil, nil); code != http.StatusOK {
			t.Fatalf("request %d: %d", i, code)
		}
	}
	for range 20 {
		if code := post(h, a.Status.WebhookPath, nil, nil); code != http.StatusTooManyRequests {
			t.Fatalf("past the burst: %d, want 429", code)
		}
	}
	if reads.n != 3 {
		t.Errorf("%d token reads, want 3 (none for a refused request)", reads.n)
	}
	if code := post(h, b.Status.WebhookPath, nil, nil); code != http.StatusOK {
		t.Errorf("another Receiver: %d, want 200", code)
	}
	clk.Step(time.Second)
	if code := post(h, a.Status.WebhookPath, nil, nil); code != http.StatusOK {
		t.Errorf("a second later: %d, want 200", code)
	}
}

// countingTokens counts reads.
type countingTokens struct {
	Tokens
	mu sync.Mutex
	n  int
}

func (c *countingTokens) Token(ctx context.Context, namespace, name string) ([]byte, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return c.Tokens.Token(ctx, namespace, name)
}
