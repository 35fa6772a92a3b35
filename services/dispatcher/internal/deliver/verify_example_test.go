package deliver

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The receiver's check shown in docs/events.md ("Subscriptions"), compiled
// and tested here; TestReceiverCheckInDocs keeps the docs in step.

// receiver:begin

func verified(r *http.Request, key []byte) ([]byte, bool) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, false
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(body)
	want := "sha256=" + hex.EncodeToString(mac.Sum(nil))
	return body, hmac.Equal([]byte(r.Header.Get("X-Headwater-Signature")), []byte(want))
}

// receiver:end

// receiver-v2:begin

// replayWindow is how far a delivery's timestamp may be from the clock.
const replayWindow = 5 * time.Minute

// verifiedV2 checks X-Headwater-Signature-V2: the HMAC of the timestamp,
// ce-id, ce-type, ce-time and body, and the timestamp within the window.
// The caller answers a ce-id it accepted in the last 2 x replayWindow
// with 2xx and does not act on it again (a retry or a replay).
func verifiedV2(r *http.Request, key []byte, now time.Time) ([]byte, bool) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, false
	}
	var ts, sig string
	for _, part := range strings.Split(r.Header.Get("X-Headwater-Signature-V2"), ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v2":
			sig = v
		}
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || now.Sub(time.Unix(unix, 0)).Abs() > replayWindow {
		return nil, false
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "v2\n%s\n%s\n%s\n%s\n", ts,
		r.Header.Get("ce-id"), r.Header.Get("ce-type"), r.Header.Get("ce-time"))
	mac.Write(body)
	want := hex.EncodeToString(mac.Sum(nil))
	return body, hmac.Equal([]byte(sig), []byte(want))
}

// receiver-v2:end

// TestReceiverCheckV2 runs the documented check on real deliveries: one
// accepted, the same replayed after the window refused, and one whose
// ce-id was changed on the way refused.
func TestReceiverCheckV2(t *testing.T) {
	key := []byte("k")
	sent := time.Unix(1700000000, 0)
	var captured *http.Request
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		captured = r.Clone(context.Background())
		body, _ = io.ReadAll(r.Body)
	}))
	defer srv.Close()
	if err := (&Client{Now: func() time.Time { return sent }}).Deliver(context.Background(), testEvent(t), Target{URL: srv.URL, Key: key}); err != nil {
		t.Fatal(err)
	}
	check := func(at time.Time, mutate func(*http.Request)) bool {
		r := captured.Clone(context.Background())
		r.Header = captured.Header.Clone()
		r.Body = io.NopCloser(bytes.NewReader(body))
		if mutate != nil {
			mutate(r)
		}
		got, ok := verifiedV2(r, key, at)
		return ok && bytes.Equal(got, body)
	}
	if !check(sent.Add(time.Minute), nil) {
		t.Errorf("a delivery does not verify")
	}
	if check(sent.Add(replayWindow+time.Second), nil) {
		t.Errorf("a replay after the window verifies")
	}
	if check(sent, func(r *http.Request) { r.Header.Set("ce-id", "another") }) {
		t.Errorf("a delivery with another ce-id verifies")
	}
	if check(sent, func(r *http.Request) { r.Header.Set("ce-type", "io.headwater.artifact.failed.v1") }) {
		t.Errorf("a delivery with another ce-type verifies")
	}
}

func TestReceiverCheck(t *testing.T) {
	key, body := []byte("k"), []byte(`{"revision":"main@sha1:abc"}`)
	request := func(b []byte, sig string) *http.Request {
		r, err := http.NewRequest(http.MethodPost, "http://sink.example/", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("X-Headwater-Signature", sig)
		return r
	}
	if got, ok := verified(request(body, Sign(key, body)), key); !ok || !bytes.Equal(got, body) {
		t.Errorf("a signed request does not verify")
	}
	if _, ok := verified(request([]byte(`{"revision":"evil"}`), Sign(key, body)), key); ok {
		t.Errorf("a tampered body verifies")
	}
	if _, ok := verified(request(body, Sign([]byte("other"), body)), key); ok {
		t.Errorf("another key's signature verifies")
	}
}

func TestReceiverCheckInDocs(t *testing.T) {
	src, err := os.ReadFile("verify_example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../../../docs/events.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range []string{"receiver", "receiver-v2"} {
		_, code, _ := strings.Cut(string(src), "// "+block+":begin\n\n")
		code, _, _ = strings.Cut(code, "\n// "+block+":end")
		if code == "" || !strings.Contains(string(doc), code) {
			t.Errorf("docs/events.md does not show the receiver's check as %s has it:\n%s", "verify_example_test.go", code)
		}
	}
}
