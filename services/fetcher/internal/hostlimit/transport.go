package hostlimit

import (
	"net/http"
	"strings"
)

// Transport is an http.RoundTripper that passes every request through a
// Limiter before Next sends it, and records the holds the host asks for
// (429 or 503 with Retry-After). A refused request fails with a
// *HeldError, and the fetch's Tracker (Track) learns of it, as of a hold
// the host asked for.
type Transport struct {
	// Next sends the requests; http.DefaultTransport when nil.
	Next http.RoundTripper
	// Limiter decides; nil lets every request go.
	Limiter *Limiter
}

// Wrap returns next behind l: next itself when l is nil.
func Wrap(next http.RoundTripper, l *Limiter) http.RoundTripper {
	if l == nil {
		return next
	}
	return &Transport{Next: next, Limiter: l}
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	next := t.Next
	if next == nil {
		next = http.DefaultTransport
	}
	if t.Limiter == nil {
		return next.RoundTrip(req)
	}
	host := strings.ToLower(req.URL.Host)
	ctx := req.Context()
	if err := t.Limiter.Acquire(ctx, host); err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, err
	}
	resp, err := next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	now := t.Limiter.now()
	if d, ok := RetryAfter(resp, now); ok {
		held := &HeldError{Host: host, Until: now.Add(d), ByHost: true}
		t.Limiter.Metrics.retryAfter(host, resp.StatusCode)
		if herr := t.Limiter.Hold(ctx, host, held.Until); herr != nil {
			t.Limiter.Log.Error(herr, "recording the host's Retry-After failed", "host", host)
		}
		noteHeld(ctx, held)
	}
	return resp, nil
}
