// Package failure is Headwater's one vocabulary for a failed reconcile step,
// shared by every service: what went wrong (the negative-polarity condition,
// Flux's reason and a message safe to show) and what retrying can achieve
// (the Handling).
//
// A step returns a *Error; exactly one place per service turns it into what
// follows from it:
//
//   - the bus worker (package bus) settles the job: Transient failures are
//     retried with a backoff until the last attempt, Final and Stalling ones
//     are terminated, Waiting ones are delivered again after RetryAfter;
//   - the service's reporter publishes it on the bus as an events.Failure
//     (Data), from which the watcher writes conditions and Events;
//   - the watcher's reconciler writes the conditions of the failures it
//     finds itself (a Waiting include) the same way.
//
// Compare Flux's internal/error (Generic, Stalling, Waiting).
package failure

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// Handling says what retrying a failed step can achieve.
type Handling int

const (
	// Transient failures may pass by themselves (a server that is down, a
	// timeout): the job is retried with a growing backoff until its last
	// attempt; then the next interval makes a new job.
	Transient Handling = iota
	// Final failures will fail again for this job (a file over the size
	// limit, a bad signature on the fetched commit), but a later job, for
	// a new upstream revision, may succeed: the job is not retried and the
	// object is not stalled.
	Final
	// Stalling failures need a change of the spec or of a Secret (an
	// invalid URL, a malformed Secret): the job is not retried and the
	// object is marked Stalled.
	Stalling
	// Waiting failures wait for something else to change (an included
	// source to get an artifact): the work is looked at again after
	// RetryAfter, without counting as a failed attempt.
	Waiting
	// Throttled failures are an upstream host asking to be left alone
	// (a 429 or 503 with Retry-After), or the fetcher's own limit for it
	// spent: the job is not retried by the bus, and the watcher makes the
	// next one after RetryAfter, which the outcome carries, not on a
	// backoff.
	Throttled
)

// String names the handling for logs and metrics.
func (h Handling) String() string {
	switch h {
	case Transient:
		return "transient"
	case Final:
		return "final"
	case Stalling:
		return "stalling"
	case Waiting:
		return "waiting"
	case Throttled:
		return "throttled"
	}
	return fmt.Sprintf("Handling(%d)", int(h))
}

// DeadlineExceededReason is the reason of a job that did not finish within
// its deadline (the bus worker's JobTimeout): Headwater's, as Flux has no
// deadline on a whole job.
const DeadlineExceededReason = "DeadlineExceeded"

// Error is a failed reconcile step. Its message never contains credentials:
// Error() removes user-info and query strings from every URL in it.
type Error struct {
	// Handling decides retries.
	Handling Handling
	// Condition is the negative-polarity condition the failure sets to True
	// (e.g. FetchFailed, StorageOperationFailed, IncludeUnavailable); empty
	// when the failure is reported by another field of the outcome (a
	// failed signature check sets SourceVerified=False instead).
	Condition string
	// Reason is Flux's reason, e.g. "GitOperationFailed", "URLInvalid".
	Reason string
	// Err is the cause, worded as Flux words it.
	Err error
	// Revision is the upstream revision resolved before the step failed,
	// if any: the watcher reports the stored artifact as outdated.
	Revision string
	// RetryAfter is when a Waiting failure is looked at again, and when
	// the source of a Throttled one may be fetched again.
	RetryAfter time.Duration
	// Notices are things noticed on the way to the failure that deserve
	// an Event of their own (a stored artifact found corrupt while the
	// upstream was unreachable); the outcome carries them.
	Notices []events.Notice
	// Retrying is set by the bus worker when it delivers the job again
	// after reporting this failure (a transient failure before the last
	// attempt): the report is not the job's last word.
	Retrying bool
}

// New returns an *Error with the given handling, condition, reason and a
// formatted cause (which may wrap an error with %w).
func New(h Handling, condition, reason, format string, args ...any) *Error {
	return &Error{Handling: h, Condition: condition, Reason: reason, Err: fmt.Errorf(format, args...)}
}

// Wrap returns err as an *Error: itself if it is one, otherwise a transient
// failure of condition with reason. It returns nil for a nil err.
func Wrap(err error, condition, reason string) *Error {
	if err == nil {
		return nil
	}
	if e := As(err); e != nil {
		return e
	}
	return &Error{Handling: Transient, Condition: condition, Reason: reason, Err: err}
}

// As returns the *Error in err's chain, or nil.
func As(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// Error returns the message with credentials removed from any URL in it
// and without the trailing space or colon an empty server reason leaves.
func (e *Error) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return strings.TrimRight(Redact(e.Err.Error()), " \t\r\n:")
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Stalled reports whether the failure stalls the object.
func (e *Error) Stalled() bool { return e.Handling == Stalling }

// Data returns the failure as it travels on the bus.
func (e *Error) Data() *events.Failure {
	return &events.Failure{Condition: e.Condition, Reason: e.Reason, Message: e.Error(), Stalled: e.Stalled(),
		Transient: e.Handling == Transient, Retrying: e.Retrying, RetryAfterMilliseconds: e.retryAfterMilliseconds()}
}

// retryAfterMilliseconds is RetryAfter for the bus: only a Throttled
// failure's travels, rounded up to a millisecond.
func (e *Error) retryAfterMilliseconds() int64 {
	if e.Handling != Throttled || e.RetryAfter <= 0 {
		return 0
	}
	return int64((e.RetryAfter + time.Millisecond - 1) / time.Millisecond)
}

// FromData returns the failure a bus message describes, for the service
// that writes it into conditions. Its handling is Stalling, Throttled (with
// RetryAfter), Transient or Final (a failure none of those).
func FromData(f *events.Failure) *Error {
	h := Final
	var after time.Duration
	switch {
	case f.Stalled:
		h = Stalling
	case f.RetryAfterMilliseconds > 0:
		h, after = Throttled, time.Duration(f.RetryAfterMilliseconds)*time.Millisecond
	case f.Transient:
		h = Transient
	}
	return &Error{Handling: h, Condition: f.Condition, Reason: f.Reason, Err: errors.New(f.Message), Retrying: f.Retrying, RetryAfter: after}
}

// urlPattern finds URLs in free text; quotes and whitespace end them, as in
// Go's and go-git's error messages.
var urlPattern = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'"<>]+`)

// Redact removes user-info, query strings and fragments from every URL in s,
// so no credential reaches a message, a log or the bus.
func Redact(s string) string {
	return urlPattern.ReplaceAllStringFunc(s, RedactURL)
}

// RedactURL returns raw without user-info, query string and fragment.
func RedactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		u.User = nil
		u.RawQuery = ""
		u.ForceQuery = false
		u.Fragment = ""
		u.RawFragment = ""
		return u.String()
	}
	// Not parseable: cut by hand.
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i]
	}
	host, path, _ := strings.Cut(rest, "/")
	if i := strings.LastIndex(host, "@"); i >= 0 {
		host = host[i+1:]
	}
	if path != "" || strings.Contains(rest, "/") {
		return scheme + "://" + host + "/" + path
	}
	return scheme + "://" + host
}
