package source

import (
	"errors"
	"testing"

	"github.com/headwater-gitops/headwater/pkg/events"
)

func TestRedact(t *testing.T) {
	cases := []struct{ in, want string }{
		{"plain text", "plain text"},
		{"unable to clone 'https://user:pass@example.com/org/repo.git': boom", "unable to clone 'https://example.com/org/repo.git': boom"},
		{`Get "http://tok@127.0.0.1:8080/r.git/info/refs?service=git-upload-pack": refused`, `Get "http://127.0.0.1:8080/r.git/info/refs": refused`},
		{"https://example.com/repo.git?access_token=abc#frag and more", "https://example.com/repo.git and more"},
		{"failed to parse url 'http://u:p@host:bad/x?y=z'", "failed to parse url 'http://host:bad/x'"},
		{"two http://a:b@h1/x and https://c@h2/y", "two http://h1/x and https://h2/y"},
	}
	for _, tc := range cases {
		if got := Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestErrorFailure(t *testing.T) {
	cases := []struct {
		name string
		err  *Error
		want events.Failure
	}{
		{
			name: "transient, redacted and trimmed",
			err:  Failed("GitOperationFailed", "unable to clone '%s': %w", "https://u:p@h/r.git", errors.New("repository not found: \n")),
			want: events.Failure{Condition: "FetchFailed", Reason: "GitOperationFailed", Message: "unable to clone 'https://h/r.git': repository not found"},
		},
		{
			name: "stalled",
			err:  StalledError("URLInvalid", "failed to parse url"),
			want: events.Failure{Condition: "FetchFailed", Reason: "URLInvalid", Message: "failed to parse url", Stalled: true},
		},
		{
			name: "final is not stalled, condition kept",
			err:  &Error{Condition: "StorageOperationFailed", Reason: "ArchiveOperationFailed", Handling: Final, Err: errors.New("too large")},
			want: events.Failure{Condition: "StorageOperationFailed", Reason: "ArchiveOperationFailed", Message: "too large"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := *tc.err.Failure(); got != tc.want {
				t.Errorf("Failure() = %+v, want %+v", got, tc.want)
			}
		})
	}
	wrapped := AsError(errors.New("boom"), "GitOperationFailed")
	if wrapped.Handling != Transient || wrapped.Reason != "GitOperationFailed" {
		t.Errorf("AsError of a plain error = %+v", wrapped)
	}
	inner := StalledError("URLInvalid", "bad")
	if AsError(inner, "other") != inner {
		t.Errorf("AsError does not keep an *Error")
	}
}
