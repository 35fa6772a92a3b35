package deliver

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/signature"
)

func testEvent(t *testing.T) event.Event {
	t.Helper()
	e := event.New()
	e.SetID("job-1/io.headwater.artifact.stored.v1")
	e.SetSource("headwater/artifact-server")
	e.SetType("io.headwater.artifact.stored.v1")
	e.SetSubject("gitrepository/default/podinfo")
	e.SetTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	if err := e.SetData(event.ApplicationJSON, map[string]string{"revision": "main@sha1:abc"}); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestSignAndVerify(t *testing.T) {
	key, body := []byte("secret"), []byte(`{"a":1}`)
	sig := Sign(key, body)
	tests := []struct {
		name      string
		key, body []byte
		sig       string
		ok        bool
	}{
		{"valid", key, body, sig, true},
		{"other key", []byte("other"), body, sig, false},
		{"other body", key, []byte(`{"a":2}`), sig, false},
		{"no prefix", key, body, strings.TrimPrefix(sig, "sha256="), false},
		{"not hex", key, body, "sha256=zz", false},
		{"empty", key, body, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Verify(tc.key, tc.body, tc.sig); got != tc.ok {
				t.Errorf("Verify = %v, want %v", got, tc.ok)
			}
		})
	}
}

// TestSignMatchesOpenSSL pins the signature to a value computed outside Go,
// so receivers in any language can check it.
func TestSignMatchesOpenSSL(t *testing.T) {
	// printf %s 'hello' | openssl dgst -sha256 -hmac key
	const want = "sha256=9307b3b915efb5171ff14d8cb55fbcc798c6c0ef1456d66ded1a6aa723a58b7b"
	if got := Sign([]byte("key"), []byte("hello")); got != want {
		t.Errorf("Sign = %s, want %s", got, want)
	}
}

func TestDeliver(t *testing.T) {
	key := []byte("hmac-key")
	sent := time.Unix(1700000000, 0)
	tests := []struct {
		name    string
		key     []byte
		status  int
		wantErr int // expected HTTPError status, 0 for none
	}{
		{"accepted and signed", key, http.StatusAccepted, 0},
		{"unsigned without a key", nil, http.StatusOK, 0},
		{"server error", key, http.StatusInternalServerError, http.StatusInternalServerError},
		{"redirect is not followed", key, http.StatusFound, http.StatusFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var got *event.Event
			var sig string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(strings.NewReader(string(body)))
				e, err := binding.ToEvent(r.Context(), cehttp.NewMessageFromHttpRequest(r))
				if err != nil {
					t.Errorf("sdk-go cannot read the request: %v", err)
				}
				mu.Lock()
				got, sig = e, r.Header.Get(v1alpha1.SignatureHeader)
				if tc.key != nil && !Verify(tc.key, body, sig) {
					t.Errorf("signature %q does not verify the body", sig)
				}
				if flux := r.Header.Get(v1alpha1.FluxSignatureHeader); flux != sig {
					t.Errorf("%s %q, want %q as Flux's generic-hmac expects", v1alpha1.FluxSignatureHeader, flux, sig)
				}
				if tc.key != nil {
					// Signed at the client's clock, checked at the
					// window's edge and past it.
					if _, err := signature.Verify(tc.key, r.Header, body, sent.Add(signature.DefaultTolerance), signature.DefaultTolerance); err != nil {
						t.Errorf("%s %q: %v", v1alpha1.SignatureV2Header, r.Header.Get(v1alpha1.SignatureV2Header), err)
					}
					if _, err := signature.Verify(tc.key, r.Header, body, sent.Add(signature.DefaultTolerance+time.Second), signature.DefaultTolerance); !errors.Is(err, signature.ErrExpired) {
						t.Errorf("a replay after the window: %v, want %v", err, signature.ErrExpired)
					}
				} else if v2 := r.Header.Get(v1alpha1.SignatureV2Header); v2 != "" {
					t.Errorf("unsigned delivery has %s %q", v1alpha1.SignatureV2Header, v2)
				}
				mu.Unlock()
				if tc.status == http.StatusFound {
					w.Header().Set("Location", "http://127.0.0.1:1/elsewhere")
				}
				w.WriteHeader(tc.status)
			}))
			defer srv.Close()

			e := testEvent(t)
			err := (&Client{Now: func() time.Time { return sent }}).Deliver(context.Background(), e, Target{URL: srv.URL, Key: tc.key, Timeout: 5 * time.Second})
			var herr *HTTPError
			switch {
			case tc.wantErr == 0 && err != nil:
				t.Fatalf("Deliver: %v", err)
			case tc.wantErr != 0 && (!errors.As(err, &herr) || herr.StatusCode != tc.wantErr):
				t.Fatalf("Deliver = %v, want HTTP %d", err, tc.wantErr)
			}
			mu.Lock()
			defer mu.Unlock()
			if got == nil || got.ID() != e.ID() || got.Type() != e.Type() || string(got.Data()) != string(e.Data()) {
				t.Errorf("endpoint received %v, want %v", got, e)
			}
			if tc.key == nil && sig != "" {
				t.Errorf("unsigned delivery has signature %q", sig)
			}
		})
	}
}

func TestDeliverTimeoutAndRedaction(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	u := strings.Replace(srv.URL, "http://", "http://user:hunter2@", 1) + "/hook?token=hunter2"
	err := (&Client{}).Deliver(context.Background(), testEvent(t), Target{URL: u, Timeout: 100 * time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Deliver = %v, want a deadline exceeded", err)
	}
	if err != nil && strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %q contains credentials", err)
	}
}

// TestDeliverRefusedByTheEgressPolicy: a sink at an address the policy
// refuses (loopback here) gets nothing, and the error says the policy
// refused it without telling the address or whether anything listens.
func TestDeliverRefusedByTheEgressPolicy(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer srv.Close()
	_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	for _, u := range []string{srv.URL + "/hook", "http://localhost:" + port + "/hook", "http://169.254.169.254/latest/meta-data/"} {
		err := (&Client{Policy: &egress.Policy{}}).Deliver(context.Background(), testEvent(t), Target{URL: u, Key: []byte("k"), Timeout: 5 * time.Second})
		if !egress.Refused(err) {
			t.Errorf("Deliver to %s = %v, want refused", u, err)
			continue
		}
		if msg := strings.Replace(err.Error(), Redact(u), "", 1); strings.Contains(msg, "127.0.0.1") || strings.Contains(msg, port) || strings.Contains(msg, "169.254") {
			t.Errorf("the refusal tells the address: %v", err)
		}
	}
	if hits.Load() != 0 {
		t.Errorf("the refused sink got %d requests", hits.Load())
	}
	allowed := &egress.Policy{}
	if err := allowed.Allowed.Set("127.0.0.1:" + port); err != nil {
		t.Fatal(err)
	}
	if err := (&Client{Policy: allowed}).Deliver(context.Background(), testEvent(t), Target{URL: srv.URL, Timeout: 5 * time.Second}); err != nil || hits.Load() != 1 {
		t.Errorf("an allowed sink: %v, %d requests", err, hits.Load())
	}
}
