package deliver

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
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
	_, code, _ := strings.Cut(string(src), "// receiver:begin\n\n")
	code, _, _ = strings.Cut(code, "\n// receiver:end")
	doc, err := os.ReadFile("../../../../docs/events.md")
	if err != nil {
		t.Fatal(err)
	}
	if code == "" || !strings.Contains(string(doc), code) {
		t.Errorf("docs/events.md does not show the receiver's check as %s has it:\n%s", "verify_example_test.go", code)
	}
}
