package hostlimit

import (
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
)

// Transport is an http.RoundTripper that passes every request through a
// Limiter before Next sends it (a fetch's first request to a host waits
// for its slot at most MaxWait, its later ones while the fetch may run:
// see Tracker), and records the holds the host asks for
// (429 or 503 with Retry-After). A request refused by the host whose hold
// ends within the limiter's MaxWait (counted from the request's start) is
// sent again when it ends, up to MaxAttempts times in all, if its body
// can be sent again: a fetch of several requests (a clone's reference
// listing and pack) is not lost to a short hold that one of its requests
// met, which would start it over from the first request and, against a
// host whose burst is smaller than the fetch, never end. Otherwise the
// host's answer is returned. A refused request fails with a *HeldError;
// the fetch's Tracker (Track) learns of it, as of a hold the host asked
// for and the request did not wait for.
type Transport struct {
	// Next sends the requests; http.DefaultTransport when nil.
	Next http.RoundTripper
	// Limiter decides; nil lets every request go.
	Limiter *Limiter
}

// MaxAttempts bounds how often the Transport sends one request to a host
// that keeps answering with a short Retry-After.
const MaxAttempts = 4

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
	deadline := t.Limiter.now().Add(t.Limiter.MaxWait)
	by := deadlines{hold: deadline, slot: deadline}
	if req.URL.Scheme == "https" && t.Limiter.speaksPlainHTTP(host) {
		// An HTTPS request to a host that answered the last one in plain
		// HTTP (go-containerregistry probes a registry marked insecure over
		// HTTPS first, every fetch) fails at its handshake, before the
		// host's HTTP layer sees it: it takes no slot. Should it get an
		// answer after all, the host is limited again from then on.
		resp, err := next.RoundTrip(req)
		if err == nil {
			t.Limiter.plainHTTP.Delete(host)
			t.Limiter.Metrics.request(host)
		}
		return resp, err
	}
	tr := tracker(ctx)
	if tr.isAdmitted(host) {
		// A later request of a fetch the host admitted: it queues for
		// its slot while the fetch may run (Tracker).
		by.slot, _ = ctx.Deadline()
	}
	for attempt := 1; ; attempt++ {
		if err := t.Limiter.acquire(ctx, host, by); err != nil {
			if req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, err
		}
		tr.admit(host)
		var written atomic.Bool
		resp, err := next.RoundTrip(traced(req, &written))
		switch {
		case written.Load():
			t.Limiter.Metrics.request(host)
		case err != nil && req.URL.Scheme == "https" && errors.As(err, new(tls.RecordHeaderError)):
			// The host answered the handshake in plain HTTP. The slot
			// stays taken (giving it back would let a later request
			// jump the queue), but the next HTTPS requests take none.
			t.Limiter.notePlainHTTP(host)
		}
		if err != nil {
			return resp, err
		}
		now := t.Limiter.now()
		d, ok := RetryAfter(resp, now)
		if !ok {
			return resp, nil
		}
		held := &HeldError{Host: host, Until: now.Add(d), ByHost: true}
		t.Limiter.Metrics.retryAfter(host, resp.StatusCode)
		if herr := t.Limiter.Hold(ctx, host, held.Until); herr != nil {
			t.Limiter.Log.Error(herr, "recording the host's Retry-After failed", "host", host)
		}
		if attempt < MaxAttempts && !held.Until.After(deadline) {
			if again, ok := rewind(req); ok {
				// Read what is left of the short answer so the
				// connection is reused.
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
				_ = resp.Body.Close()
				t.Limiter.Metrics.resent(host)
				req = again
				continue
			}
		}
		noteHeld(ctx, held)
		return resp, nil
	}
}

// traced returns req with a trace that sets written once the request is
// written whole to the connection: the host has it.
func traced(req *http.Request, written *atomic.Bool) *http.Request {
	trace := &httptrace.ClientTrace{WroteRequest: func(info httptrace.WroteRequestInfo) {
		if info.Err == nil {
			written.Store(true)
		}
	}}
	return req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
}

// rewind returns a copy of req to send again, with its body read afresh;
// false when the body cannot be read again.
func rewind(req *http.Request) (*http.Request, bool) {
	again := req.Clone(req.Context())
	if req.Body == nil || req.Body == http.NoBody {
		return again, true
	}
	if req.GetBody == nil {
		return nil, false
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, false
	}
	again.Body = body
	return again, true
}
