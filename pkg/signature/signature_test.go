package signature

import (
	"errors"
	"net/http"
	"testing"
	"time"
)

// signed returns the headers of a delivery of body signed at ts.
func signed(key []byte, ts time.Time, body []byte) http.Header {
	h := http.Header{}
	h.Set("ce-id", "id-1")
	h.Set("ce-type", "io.headwater.artifact.stored.v1")
	h.Set("ce-time", "2023-11-14T22:13:20Z")
	m := FromRequest(h, body)
	m.Timestamp = ts.Unix()
	h.Set(Header, Sign(key, m))
	return h
}

// TestSignMatchesOpenSSL pins the signed string to a value computed
// outside Go: printf 'v2\n1700000000\nid-1\nio.headwater.artifact.stored.v1\n2023-11-14T22:13:20Z\n{"a":1}' |
// openssl dgst -sha256 -hmac key.
func TestSignMatchesOpenSSL(t *testing.T) {
	h := signed([]byte("key"), time.Unix(1700000000, 0), []byte(`{"a":1}`))
	want := "t=1700000000,v2=6fc56e26510e8e84b1b5a59928ece0968be46136bfae9834aff32626123bf3d9"
	if got := h.Get(Header); got != want {
		t.Errorf("Sign = %s, want %s", got, want)
	}
}

func TestVerify(t *testing.T) {
	key, body := []byte("key"), []byte(`{"a":1}`)
	now := time.Unix(1700000000, 0)
	tamper := func(name, value string) http.Header {
		h := signed(key, now, body)
		h.Set(name, value)
		return h
	}
	cases := []struct {
		name string
		h    http.Header
		body []byte
		key  []byte
		at   time.Time
		want error
	}{
		{"signed now", signed(key, now, body), body, key, now, nil},
		{"within the window", signed(key, now, body), body, key, now.Add(DefaultTolerance), nil},
		{"replayed after the window", signed(key, now, body), body, key, now.Add(DefaultTolerance + time.Second), ErrExpired},
		{"from the future", signed(key, now.Add(time.Hour), body), body, key, now, ErrExpired},
		{"another body", signed(key, now, body), []byte(`{"a":2}`), key, now, ErrInvalid},
		{"another key", signed(key, now, body), body, []byte("other"), now, ErrInvalid},
		{"another id", tamper("ce-id", "id-2"), body, key, now, ErrInvalid},
		{"another type", tamper("ce-type", "io.headwater.artifact.failed.v1"), body, key, now, ErrInvalid},
		{"another time", tamper("ce-time", "2023-11-14T22:13:21Z"), body, key, now, ErrInvalid},
		{"a new timestamp on an old signature", tamper(Header, "t=1700000100,v2=6fc56e26510e8e84b1b5a59928ece0968be46136bfae9834aff32626123bf3d9"), body, key, now, ErrInvalid},
		{"no timestamp", tamper(Header, "v2=6fc56e26510e8e84b1b5a59928ece0968be46136bfae9834aff32626123bf3d9"), body, key, now, ErrInvalid},
		{"garbage", tamper(Header, "sha256=00"), body, key, now, ErrInvalid},
		{"unsigned", http.Header{}, body, key, now, ErrMissing},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id, err := Verify(tc.key, tc.h, tc.body, tc.at, DefaultTolerance)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
			if err == nil && id != "id-1" {
				t.Errorf("id %q, want id-1", id)
			}
		})
	}
}
