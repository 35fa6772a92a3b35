package providertoken

import (
	"errors"
	"fmt"
	"net/http"
)

// ResponseError is a token or identity endpoint's answer that is not a
// token: its status and what it said. Its message names the request
// without query string and never holds a credential.
type ResponseError struct {
	// Method and URL are the request's (the URL without query string).
	Method, URL string
	// StatusCode is the HTTP status.
	StatusCode int
	// Message is what the endpoint said: GitHub's "message", Entra ID's
	// "error" and "error_description", or the status text.
	Message string
	// format words the error as the provider's client library does.
	format func(*ResponseError) string
}

// Error words the answer as the provider's client library does.
func (e *ResponseError) Error() string {
	if e.format != nil {
		return e.format(e)
	}
	return fmt.Sprintf("%s %s: %d %s", e.Method, e.URL, e.StatusCode, e.Message)
}

// Refused reports whether err is an endpoint's refusal of the request as
// it is (a 4xx other than 408 Request Timeout and 429 Too Many Requests):
// sending it again cannot succeed until the credentials, the installation
// or the configuration change. Any other failure (5xx, a network error, a
// timeout) may pass by itself.
func Refused(err error) bool {
	var re *ResponseError
	if !errors.As(err, &re) {
		return false
	}
	return re.StatusCode >= 400 && re.StatusCode < 500 &&
		re.StatusCode != http.StatusRequestTimeout && re.StatusCode != http.StatusTooManyRequests
}

// ConfigError is a configuration that cannot work: a Secret missing a key
// or holding a malformed one, or a fetcher without the environment of a
// workload identity. Retrying cannot help until it changes.
type ConfigError struct {
	Err error
}

// Error returns the cause's message.
func (e *ConfigError) Error() string { return e.Err.Error() }

// Unwrap returns the cause.
func (e *ConfigError) Unwrap() error { return e.Err }

// configErrorf returns a *ConfigError with a formatted cause.
func configErrorf(format string, args ...any) error {
	return &ConfigError{Err: fmt.Errorf(format, args...)}
}
