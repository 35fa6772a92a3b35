package source

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// Reasons Headwater adds to Flux's for failures Flux has no word for.
const (
	// UnsupportedKindReason: the fetcher does not fetch this kind of source.
	UnsupportedKindReason = "UnsupportedKind"
	// InvalidSpecReason: the job carries no usable spec for its kind.
	InvalidSpecReason = "InvalidSpec"
	// UnsupportedProviderReason: a provider Headwater cannot authenticate
	// with yet (a GitRepository's github, azure or aws).
	UnsupportedProviderReason = "UnsupportedProvider"
	// EmptyGitRepositoryReason: the repository has no commits (Flux's reason).
	EmptyGitRepositoryReason = "EmptyGitRepository"
)

// Handling says what retrying a failed fetch can achieve.
type Handling int

const (
	// Transient failures may pass: the job is retried with a backoff.
	Transient Handling = iota
	// Final failures will fail again for this job, but a later job (a new
	// upstream revision) may succeed: the job is not retried, the object
	// is not stalled.
	Final
	// Stalled failures need a change of the spec or a Secret: the job is
	// not retried and the object is marked stalled.
	Stalled
)

// Error is a failed fetch: the condition, reason and message the watcher
// writes, and how to handle it. Its message never contains credentials.
type Error struct {
	// Condition is the negative-polarity condition; FetchFailed when empty,
	// except for a failed verification, which sets none.
	Condition string
	// Reason is Flux's reason, e.g. sourcev1.GitOperationFailedReason.
	Reason string
	// Handling decides retries.
	Handling Handling
	// Err is the cause, worded as Flux words it.
	Err error
	// Revision is the upstream revision resolved before the failure, if
	// any: the watcher reports the stored artifact as outdated.
	Revision string
	// Verification, when set, is the failed check of signatures this error
	// reports: the watcher sets SourceVerified=False from it instead of a
	// negative condition.
	Verification *events.Verification
}

// Error returns the message with credentials removed from any URL in it
// and without the trailing space or colon an empty server reason leaves.
func (e *Error) Error() string {
	return strings.TrimRight(Redact(e.Err.Error()), " \t\r\n:")
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Failure converts the error into the failure of an outcome.
func (e *Error) Failure() *events.Failure {
	cond := e.Condition
	if cond == "" && e.Verification == nil {
		cond = sourcev1.FetchFailedCondition
	}
	return &events.Failure{Condition: cond, Reason: e.Reason, Message: e.Error(), Stalled: e.Handling == Stalled}
}

// Failed returns a transient *Error with reason and a formatted cause.
func Failed(reason, format string, args ...any) *Error {
	return &Error{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// StalledError returns a stalled *Error with reason and a formatted cause.
func StalledError(reason, format string, args ...any) *Error {
	return &Error{Reason: reason, Handling: Stalled, Err: fmt.Errorf(format, args...)}
}

// AsError returns err as an *Error: itself if it is one, else a transient
// failure with reason.
func AsError(err error, reason string) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Reason: reason, Err: err}
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
