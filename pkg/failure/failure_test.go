package failure_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
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
		if got := failure.Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestDataAndBack(t *testing.T) {
	cases := []struct {
		name string
		err  *failure.Error
		want events.Failure
	}{
		{"transient, redacted and trimmed",
			failure.New(failure.Transient, "FetchFailed", "GitOperationFailed", "unable to clone '%s': %w", "https://u:p@h/r.git", errors.New("not found: \n")),
			events.Failure{Condition: "FetchFailed", Reason: "GitOperationFailed", Message: "unable to clone 'https://h/r.git': not found", Transient: true}},
		{"transient, retried by the bus",
			&failure.Error{Handling: failure.Transient, Condition: "FetchFailed", Reason: "GitOperationFailed", Err: errors.New("503"), Retrying: true},
			events.Failure{Condition: "FetchFailed", Reason: "GitOperationFailed", Message: "503", Transient: true, Retrying: true}},
		{"stalling",
			failure.New(failure.Stalling, "FetchFailed", "URLInvalid", "failed to parse url"),
			events.Failure{Condition: "FetchFailed", Reason: "URLInvalid", Message: "failed to parse url", Stalled: true}},
		{"final is not stalled",
			failure.New(failure.Final, "StorageOperationFailed", "ArchiveOperationFailed", "too large"),
			events.Failure{Condition: "StorageOperationFailed", Reason: "ArchiveOperationFailed", Message: "too large"}},
		{"waiting is not stalled",
			&failure.Error{Handling: failure.Waiting, Condition: "IncludeUnavailable", Reason: "NoArtifact", Err: errors.New("no artifact"), RetryAfter: time.Second},
			events.Failure{Condition: "IncludeUnavailable", Reason: "NoArtifact", Message: "no artifact"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.err.Data()
			if *got != tc.want {
				t.Fatalf("Data() = %+v, want %+v", *got, tc.want)
			}
			back := failure.FromData(got)
			if back.Error() != tc.want.Message || back.Reason != tc.want.Reason || back.Condition != tc.want.Condition ||
				back.Stalled() != tc.want.Stalled || back.Retrying != tc.want.Retrying ||
				(back.Handling == failure.Transient) != tc.want.Transient {
				t.Errorf("FromData(Data()) = %+v, want the same failure", back)
			}
		})
	}
}

func TestWrapAndAs(t *testing.T) {
	if failure.Wrap(nil, "FetchFailed", "Failed") != nil {
		t.Error("Wrap(nil) is not nil")
	}
	plain := failure.Wrap(errors.New("boom"), "FetchFailed", "GitOperationFailed")
	if plain.Handling != failure.Transient || plain.Condition != "FetchFailed" || plain.Reason != "GitOperationFailed" {
		t.Errorf("Wrap of a plain error = %+v", plain)
	}
	inner := failure.New(failure.Stalling, "FetchFailed", "URLInvalid", "bad")
	wrapped := fmt.Errorf("resolve: %w", inner)
	if failure.Wrap(wrapped, "other", "other") != inner || failure.As(wrapped) != inner {
		t.Error("Wrap and As do not find the *Error in the chain")
	}
	if failure.As(errors.New("plain")) != nil {
		t.Error("As of a plain error is not nil")
	}
	for h, want := range map[failure.Handling]string{failure.Transient: "transient", failure.Final: "final",
		failure.Stalling: "stalling", failure.Waiting: "waiting", failure.Handling(9): "Handling(9)"} {
		if h.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(h), h.String(), want)
		}
	}
}
