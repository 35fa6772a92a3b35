// Package deliver sends one CloudEvent to a Subscription's HTTP endpoint:
// the CloudEvents HTTP protocol binding in binary content mode (the
// CloudEvent attributes in ce-* headers, the data as the body), signed with
// the Subscription's HMAC key (three headers: the body-only signature of
// older receivers, the same in Flux's generic-hmac header, and the version
// 2 signature of package signature, which covers ce-id, ce-type, ce-time
// and a timestamp as well). It makes one attempt; retries, backoff and
// dead letters belong to the consumer that calls it (package dispatch).
package deliver

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/signature"
)

// signaturePrefix starts the value of the signature header.
const signaturePrefix = "sha256="

// Sign returns the signature header value of body under key:
// "sha256=" and the hex HMAC-SHA256.
func Sign(key, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write(body)
	return signaturePrefix + hex.EncodeToString(mac.Sum(nil))
}

// Verify reports whether signature (a signature header value) signs body
// under key, in constant time: what a receiver does with every request.
func Verify(key, body []byte, signature string) bool {
	got, ok := strings.CutPrefix(signature, signaturePrefix)
	if !ok {
		return false
	}
	sum, err := hex.DecodeString(got)
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(body)
	return hmac.Equal(sum, mac.Sum(nil))
}

// Target is where and how to deliver.
type Target struct {
	// URL of the endpoint.
	URL string
	// Key signs the body when set.
	Key []byte
	// Timeout bounds the attempt.
	Timeout time.Duration
}

// HTTPError is a response outside 2xx.
type HTTPError struct {
	// StatusCode and Status of the response.
	StatusCode int
	Status     string
}

func (e *HTTPError) Error() string { return "endpoint answered " + e.Status }

// Client delivers events over HTTP.
type Client struct {
	// HTTP is the client to use; nil means http.DefaultClient's transport
	// with no redirects followed (a redirect is an error, so a signed
	// event never goes elsewhere).
	HTTP *http.Client
	// Now returns the time of a delivery attempt, the version 2
	// signature's timestamp; time.Now when nil.
	Now func() time.Time
	// Policy, when set, refuses sinks at addresses a tenant may not
	// reach (package egress); it guards the client made when HTTP is nil.
	Policy *egress.Policy

	once    sync.Once
	guarded *http.Client
}

func (c *Client) client() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	c.once.Do(func() {
		t := http.DefaultTransport.(*http.Transport).Clone()
		if c.Policy != nil {
			c.Policy.Guard(t)
		}
		c.guarded = &http.Client{Transport: t,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	})
	return c.guarded
}

func (c *Client) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Deliver makes one attempt to deliver e to t. A non-2xx answer is an
// *HTTPError; errors never contain the URL's credentials or query.
func (c *Client) Deliver(ctx context.Context, e event.Event, t Target) error {
	if t.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.URL, nil)
	if err != nil {
		return fmt.Errorf("delivery to %s: %w", Redact(t.URL), errors.Unwrap(err))
	}
	if err := cehttp.WriteRequest(binding.WithForceBinary(ctx), binding.ToMessage(&e), req); err != nil {
		return fmt.Errorf("encode event %s: %w", e.ID(), err)
	}
	body := e.Data()
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if len(t.Key) > 0 {
		sig := Sign(t.Key, body)
		req.Header.Set(v1alpha1.SignatureHeader, sig)
		req.Header.Set(v1alpha1.FluxSignatureHeader, sig)
		m := signature.FromRequest(req.Header, body)
		m.Timestamp = c.now().Unix()
		req.Header.Set(signature.Header, signature.Sign(t.Key, m))
	}
	resp, err := c.client().Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return fmt.Errorf("delivery to %s: %w", Redact(t.URL), err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &HTTPError{StatusCode: resp.StatusCode, Status: resp.Status}
	}
	return nil
}

// Redact strips user information, query and fragment from a URL, so it can
// be logged and reported without leaking credentials.
func Redact(raw string) string {
	p, err := url.Parse(raw)
	if err != nil {
		return "<unparseable url>"
	}
	p.User = nil
	p.RawQuery, p.ForceQuery = "", false
	p.Fragment, p.RawFragment = "", ""
	return p.String()
}
