// Package signature is the signature scheme of the HTTP deliveries of a
// Subscription (version 2): an HMAC-SHA256, under the Subscription's
// hmacKey, of the delivery's timestamp, the CloudEvent's id, type and
// time, and the body, in one header beside the body-only signatures older
// receivers and Flux's generic-hmac Receiver check. The dispatcher signs
// with it and Headwater's receiver checks it, with a replay window; the
// scheme is documented for other receivers in docs/events.md.
//
// The signed string is, with "\n" between the parts:
//
//	v2
//	<timestamp: Unix seconds of the delivery attempt, as in the header>
//	<ce-id header>
//	<ce-type header>
//	<ce-time header>
//	<body>
//
// and the header is "t=<timestamp>,v2=<hex HMAC-SHA256>". Header values
// hold no newline, so no part can pose as another.
package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header carries the version 2 signature.
const Header = "X-Headwater-Signature-V2"

// DefaultTolerance is how far a delivery's timestamp may be from the
// receiver's clock: older (or newer) requests are refused as replays.
const DefaultTolerance = 5 * time.Minute

// The CloudEvents HTTP binding's headers the signature covers.
const (
	headerID   = "Ce-Id"
	headerType = "Ce-Type"
	headerTime = "Ce-Time"
)

// Errors of Verify.
var (
	// ErrMissing: the request carries no version 2 signature.
	ErrMissing = errors.New("no " + Header + " header")
	// ErrInvalid: the signature is malformed or does not match.
	ErrInvalid = errors.New("the " + Header + " signature does not match")
	// ErrExpired: the timestamp is outside the tolerance (a replay, or a
	// clock far off).
	ErrExpired = errors.New("the " + Header + " timestamp is outside the replay window")
)

// Message is what is signed: the delivery's timestamp, the CloudEvent's
// id, type and time as sent in the ce-* headers, and the body.
type Message struct {
	Timestamp      int64
	ID, Type, Time string
	Body           []byte
}

// FromRequest reads a Message's headers from h (ce-id, ce-type, ce-time)
// and takes body as is; the timestamp is left to the caller.
func FromRequest(h http.Header, body []byte) Message {
	return Message{ID: h.Get(headerID), Type: h.Get(headerType), Time: h.Get(headerTime), Body: body}
}

// mac is the hex HMAC-SHA256 of m's signed string under key.
func (m Message) mac(key []byte) string {
	h := hmac.New(sha256.New, key)
	fmt.Fprintf(h, "v2\n%d\n%s\n%s\n%s\n", m.Timestamp, m.ID, m.Type, m.Time)
	h.Write(m.Body)
	return hex.EncodeToString(h.Sum(nil))
}

// Sign returns the Header value of m under key: "t=<m.Timestamp>,v2=<hex>".
func Sign(key []byte, m Message) string {
	return "t=" + strconv.FormatInt(m.Timestamp, 10) + ",v2=" + m.mac(key)
}

// Verify checks a request's Header value against key, its ce-* headers and
// body, in constant time, and that its timestamp is within tolerance of
// now. It returns the CloudEvent's id on success, which a receiver keeps
// for the window (or longer) to answer a second delivery of it as a
// duplicate. Errors wrap ErrMissing, ErrInvalid or ErrExpired.
func Verify(key []byte, h http.Header, body []byte, now time.Time, tolerance time.Duration) (id string, err error) {
	value := h.Get(Header)
	if value == "" {
		return "", ErrMissing
	}
	m := FromRequest(h, body)
	var sig string
	for part := range strings.SplitSeq(value, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			if m.Timestamp, err = strconv.ParseInt(v, 10, 64); err != nil {
				return "", fmt.Errorf("%w: timestamp %q", ErrInvalid, v)
			}
		case "v2":
			sig = v
		}
	}
	if sig == "" || m.Timestamp == 0 || !hmac.Equal([]byte(sig), []byte(m.mac(key))) {
		return "", ErrInvalid
	}
	if d := now.Sub(time.Unix(m.Timestamp, 0)); d > tolerance || d < -tolerance {
		return "", fmt.Errorf("%w (%s)", ErrExpired, d.Round(time.Second))
	}
	return m.ID, nil
}
