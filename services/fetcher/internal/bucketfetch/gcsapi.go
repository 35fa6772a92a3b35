package bucketfetch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/oauth2"
)

// The retries of one Cloud Storage request, as the Go SDK makes them:
// exponential backoff with full jitter, from up to 1s to up to 30s per
// wait.
const (
	gcsInitialBackoff = time.Second
	gcsMaxBackoff     = 30 * time.Second
)

const (
	// maxGCSAnswer bounds a JSON answer (a bucket, an object's metadata,
	// a page of a listing) read into memory.
	maxGCSAnswer = 32 << 20
	// maxGCSErrorMessage bounds the server's words quoted in an error.
	maxGCSErrorMessage = 512
)

// gcsStore is a Google Cloud Storage bucket, read through the JSON API.
type gcsStore struct {
	api      *gcsClient
	bucket   string
	pageSize int
}

var _ store = (*gcsStore)(nil)

// gcsClient is a client of the Cloud Storage JSON API
// (https://cloud.google.com/storage/docs/json_api) for the GET requests a
// gcp Bucket makes: a bucket's metadata, a listing's pages, an object's
// metadata and its content. It replaces cloud.google.com/go/storage,
// which links gRPC, the xDS protos, OpenTelemetry and Cloud Monitoring
// into every service; Google Cloud Storage, fake-gcs-server and other
// GCS-compatible servers answer these requests the same way.
//
// Failed requests are retried as the SDK retries them: connection
// failures, 408, 429 and 5xx answers, with backoff.
type gcsClient struct {
	// http sends the requests, with the bearer token when there is one.
	http *http.Client
	// base is the JSON API's root, ending in "/storage/v1/".
	base string
	// attempts bounds the attempts of one request; when not positive,
	// they go on until the context ends.
	attempts int
	// backoff is the longest first wait between attempts; each next one
	// doubles, up to gcsMaxBackoff.
	backoff time.Duration
}

// gcsObject is an object resource, with the fields the store asks for.
type gcsObject struct {
	Name       string `json:"name"`
	Etag       string `json:"etag"`
	Size       int64  `json:"size,string"`
	Generation int64  `json:"generation,string"`
}

// gcsObjects is a page of a listing.
type gcsObjects struct {
	Items         []gcsObject `json:"items"`
	NextPageToken string      `json:"nextPageToken"`
}

// gcsAPIError is an answer of the JSON API other than 200 OK.
type gcsAPIError struct {
	// Code is the HTTP status.
	Code int
	// Message is the server's explanation, shortened.
	Message string
}

func (e *gcsAPIError) Error() string {
	msg := fmt.Sprintf("Google Cloud Storage answered %d %s", e.Code, http.StatusText(e.Code))
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

func (g *gcsStore) bucketURL() string { return g.api.base + "b/" + url.PathEscape(g.bucket) }

// objectURL is the URL of an object; its name is one path segment ('/'
// escaped too), as the JSON API wants it.
func (g *gcsStore) objectURL(key string) string {
	return g.bucketURL() + "/o/" + url.PathEscape(key)
}

func (g *gcsStore) exists(ctx context.Context) (bool, error) {
	err := g.api.getJSON(ctx, g.bucketURL(), url.Values{"fields": {"name"}}, &struct{}{})
	if gcsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, gcsError(err)
	}
	return true, nil
}

// list lists every live object under prefix, as Flux does, asking for the
// three fields it uses, a page at a time.
func (g *gcsStore) list(ctx context.Context, prefix string, visit func(string, object) error) error {
	q := url.Values{"fields": {"items(name,etag,size),nextPageToken"}}
	if prefix != "" {
		q.Set("prefix", prefix)
	}
	if g.pageSize > 0 {
		q.Set("maxResults", strconv.Itoa(g.pageSize))
	}
	for {
		var page gcsObjects
		if err := g.api.getJSON(ctx, g.bucketURL()+"/o", q, &page); err != nil {
			return gcsError(err)
		}
		for _, o := range page.Items {
			if err := visit(o.Name, object{etag: o.Etag, size: o.Size}); err != nil {
				return err
			}
		}
		if page.NextPageToken == "" {
			return nil
		}
		if page.NextPageToken == q.Get("pageToken") {
			return errors.New("the server answered the same page token twice")
		}
		q.Set("pageToken", page.NextPageToken)
	}
}

// get reads the object's metadata (its ETag), then the generation they
// describe, as Flux does: an object replaced in between fails the read
// (412 from ifGenerationMatch) instead of pairing new content with the old
// ETag.
func (g *gcsStore) get(ctx context.Context, key string) (io.ReadCloser, object, error) {
	var attrs gcsObject
	err := g.api.getJSON(ctx, g.objectURL(key), url.Values{"fields": {"etag,size,generation"}}, &attrs)
	if gcsNotFound(err) {
		return nil, object{}, fmt.Errorf("%w: %w", errNoSuchObject, err)
	}
	if err != nil {
		return nil, object{}, gcsError(err)
	}
	q := url.Values{"alt": {"media"}}
	if attrs.Generation != 0 {
		q.Set("ifGenerationMatch", strconv.FormatInt(attrs.Generation, 10))
	}
	body, err := g.api.open(ctx, g.objectURL(key), q)
	if gcsNotFound(err) {
		return nil, object{}, fmt.Errorf("%w: %w", errNoSuchObject, err)
	}
	if err != nil {
		return nil, object{}, gcsError(err)
	}
	return body, object{etag: attrs.Etag, size: attrs.Size}, nil
}

// getJSON decodes the answer to a GET of u with the query q into v.
func (c *gcsClient) getJSON(ctx context.Context, u string, q url.Values, v any) error {
	return c.retry(ctx, func() error {
		resp, err := c.get(ctx, u, q)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		// Read in full first: a connection cut mid-answer is a network
		// failure (retried), not a syntax error.
		data, err := io.ReadAll(io.LimitReader(resp.Body, maxGCSAnswer+1))
		if err != nil {
			return fmt.Errorf("reading the answer to GET %s: %w", u, err)
		}
		if len(data) > maxGCSAnswer {
			return fmt.Errorf("the answer to GET %s is larger than %d bytes", u, maxGCSAnswer)
		}
		if err := json.Unmarshal(data, v); err != nil {
			return fmt.Errorf("decoding the answer to GET %s: %w", u, err)
		}
		return nil
	})
}

// open returns the body of the answer to a GET of u with the query q; the
// caller closes it.
func (c *gcsClient) open(ctx context.Context, u string, q url.Values) (io.ReadCloser, error) {
	var body io.ReadCloser
	err := c.retry(ctx, func() error {
		resp, err := c.get(ctx, u, q)
		if err != nil {
			return err
		}
		body = resp.Body
		return nil
	})
	return body, err
}

// get sends one GET of u with the query q. An answer other than 200 OK is
// a *gcsAPIError, its body read and closed.
func (c *gcsClient) get(ctx context.Context, u string, q url.Values) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, &gcsAPIError{Code: resp.StatusCode, Message: gcsErrorMessage(resp.Body)}
}

// gcsErrorMessage is the message of an error answer: the JSON API's
// error.message, or the start of a body that is not JSON.
func gcsErrorMessage(body io.Reader) string {
	data, _ := io.ReadAll(io.LimitReader(body, 64<<10))
	var answer struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := string(data)
	if json.Unmarshal(data, &answer) == nil && answer.Error.Message != "" {
		msg = answer.Error.Message
	}
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) > maxGCSErrorMessage {
		msg = msg[:maxGCSErrorMessage] + "..."
	}
	return msg
}

// retry calls call until it succeeds, fails in a way another attempt does
// not mend, the attempts run out or ctx ends; it returns call's last
// error.
func (c *gcsClient) retry(ctx context.Context, call func() error) error {
	wait := c.backoff
	for attempt := 1; ; attempt++ {
		err := call()
		if err == nil || !gcsRetryable(err) || (c.attempts > 0 && attempt >= c.attempts) || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(rand.N(wait))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, gcsMaxBackoff)
	}
}

// gcsRetryable tells the failures the SDK retries: a connection refused,
// reset or cut, and the answers 408, 429 and 5xx (of the API or of the
// token endpoint).
func gcsRetryable(err error) bool {
	var token *oauth2.RetrieveError
	if errors.As(err, &token) {
		return token.Response != nil && retryableStatus(token.Response.StatusCode)
	}
	var api *gcsAPIError
	if errors.As(err, &api) {
		return retryableStatus(api.Code)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op)
}

// retryableStatus tells the HTTP statuses another attempt may mend.
func retryableStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= http.StatusInternalServerError
}

// gcsNotFound tells whether err is a 404 answer.
func gcsNotFound(err error) bool {
	var api *gcsAPIError
	return errors.As(err, &api) && api.Code == http.StatusNotFound
}

// gcsError marks the answers that refuse the credentials: 401 and 403
// from the API, and a token endpoint refusing the key.
func gcsError(err error) error {
	var api *gcsAPIError
	if errors.As(err, &api) {
		return classified(err, api.Code == http.StatusUnauthorized || api.Code == http.StatusForbidden)
	}
	var token *oauth2.RetrieveError
	if errors.As(err, &token) && token.Response != nil {
		code := token.Response.StatusCode
		return classified(err, code == http.StatusBadRequest || code == http.StatusUnauthorized || code == http.StatusForbidden)
	}
	return err
}
