package source

import (
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
)

// Reasons Headwater adds to Flux's for failures Flux has no word for.
const (
	// UnsupportedKindReason: the fetcher does not fetch this kind of source.
	UnsupportedKindReason = "UnsupportedKind"
	// InvalidSpecReason: the job carries no usable spec for its kind.
	InvalidSpecReason = "InvalidSpec"
	// UnsupportedProviderReason: a provider Headwater cannot authenticate
	// with yet (a GitRepository's aws, or azure with serviceAccountName).
	UnsupportedProviderReason = "UnsupportedProvider"
	// EmptyGitRepositoryReason: the repository has no commits (Flux's reason).
	EmptyGitRepositoryReason = "EmptyGitRepository"
	// RateLimitedReason: the upstream host asked to be left alone (a 429
	// or 503 with Retry-After) or the fetcher's limit for it is spent; the
	// source is fetched again when the host allows.
	RateLimitedReason = "RateLimited"
)

// RateLimited is the failure of a fetch its upstream host holds until
// until: FetchFailed, reason RateLimited, "rate limited by <host>, next
// attempt in 40s" (whole seconds, rounded up), retried after the hold.
func RateLimited(host string, until, now time.Time) *failure.Error {
	after := max(until.Sub(now), time.Millisecond)
	secs := (after + time.Second - 1) / time.Second
	f := failure.New(failure.Throttled, sourcev1.FetchFailedCondition, RateLimitedReason,
		"rate limited by %s, next attempt in %s", host, secs*time.Second)
	f.RetryAfter = after
	return f
}

// Fetch failures are *failure.Error values (package failure). A failure of
// the fetch itself sets FetchFailed; the helpers below make those.

// Failed returns a transient FetchFailed failure with reason and a
// formatted cause.
func Failed(reason, format string, args ...any) *failure.Error {
	return failure.New(failure.Transient, sourcev1.FetchFailedCondition, reason, format, args...)
}

// FailedWith returns a FetchFailed failure with the given handling, reason
// and a formatted cause.
func FailedWith(h failure.Handling, reason, format string, args ...any) *failure.Error {
	return failure.New(h, sourcev1.FetchFailedCondition, reason, format, args...)
}

// StalledError returns a stalling FetchFailed failure with reason and a
// formatted cause.
func StalledError(reason, format string, args ...any) *failure.Error {
	return failure.New(failure.Stalling, sourcev1.FetchFailedCondition, reason, format, args...)
}

// MissingSpec is the stalling failure of a job that carries no spec of the
// kind it names (want, e.g. "GitRepository spec").
func MissingSpec(req *events.FetchRequested, want string) *failure.Error {
	return StalledError(InvalidSpecReason, "fetch request for %s '%s/%s' has no %s",
		req.Job.Object.Kind, req.Job.Object.Namespace, req.Job.Object.Name, want)
}

// AsError returns err as a *failure.Error: itself if it is one, else a
// transient FetchFailed failure with reason.
func AsError(err error, reason string) *failure.Error {
	return failure.Wrap(err, sourcev1.FetchFailedCondition, reason)
}

// Unverified is the cause of a failed signature check (a GitRepository's
// spec.verify): the failure sets no negative condition, and the watcher
// writes SourceVerified=False from Verification instead.
type Unverified struct {
	// Verification is the failed check, with Flux's reason and message.
	Verification *events.Verification
	// Err is why the check failed.
	Err error
}

// Error returns the cause's message.
func (e *Unverified) Error() string { return e.Err.Error() }

// Unwrap returns the cause.
func (e *Unverified) Unwrap() error { return e.Err }

// VerificationFailed returns the failure of a signature check in the given
// mode: no negative condition, SourceVerified False with reason and the
// (redacted) message of err.
func VerificationFailed(mode string, h failure.Handling, reason string, err error) *failure.Error {
	f := &failure.Error{Handling: h, Reason: reason, Err: err}
	f.Err = &Unverified{Verification: &events.Verification{Mode: mode, Reason: reason, Message: f.Error()}, Err: err}
	return f
}
