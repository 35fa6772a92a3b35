package hostlimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Bounds of a hold: a Retry-After in the past, of zero, or years ahead is
// taken as the nearest of them.
const (
	// MinHold is the shortest hold.
	MinHold = time.Second
	// MaxHold is the longest hold: a host asking for more is asked again
	// after MaxHold.
	MaxHold = 10 * time.Minute
	// DefaultHold is the hold after a 429 without a Retry-After the
	// fetcher can read.
	DefaultHold = 10 * time.Second
)

// RetryAfter returns how long a response asks to be left alone: for a 429
// or a 503, its Retry-After (delay-seconds or an HTTP date), clamped to
// [MinHold, MaxHold]; for a 429 without a readable one, DefaultHold. ok is
// false for any other response, and for a 503 without a readable
// Retry-After (a server down, not a server pacing its clients).
func RetryAfter(resp *http.Response, now time.Time) (d time.Duration, ok bool) {
	if resp == nil || (resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable) {
		return 0, false
	}
	d, ok = ParseRetryAfter(resp.Header.Get("Retry-After"), now)
	switch {
	case ok:
		return d, true
	case resp.StatusCode == http.StatusTooManyRequests:
		return DefaultHold, true
	}
	return 0, false
}

// ParseRetryAfter reads a Retry-After value, delay-seconds or an HTTP
// date, as a delay from now clamped to [MinHold, MaxHold]. ok is false when
// the value is empty or malformed.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	var d time.Duration
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs > int64(MaxHold/time.Second) {
			return MaxHold, true
		}
		d = time.Duration(secs) * time.Second
	} else if at, err := http.ParseTime(v); err == nil {
		d = at.Sub(now)
	} else {
		return 0, false
	}
	return min(max(d, MinHold), MaxHold), true
}
