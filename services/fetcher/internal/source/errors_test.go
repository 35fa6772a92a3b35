package source

import (
	"errors"
	"testing"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
)

func TestErrorFailure(t *testing.T) {
	cases := []struct {
		name string
		err  *failure.Error
		want events.Failure
	}{
		{
			name: "transient, redacted and trimmed",
			err:  Failed("GitOperationFailed", "unable to clone '%s': %w", "https://u:p@h/r.git", errors.New("repository not found: \n")),
			want: events.Failure{Condition: "FetchFailed", Reason: "GitOperationFailed", Message: "unable to clone 'https://h/r.git': repository not found", Transient: true},
		},
		{
			name: "stalled",
			err:  StalledError("URLInvalid", "failed to parse url"),
			want: events.Failure{Condition: "FetchFailed", Reason: "URLInvalid", Message: "failed to parse url", Stalled: true},
		},
		{
			name: "final is not stalled, condition kept",
			err:  FailedWith(failure.Final, "ArchiveOperationFailed", "too large"),
			want: events.Failure{Condition: "FetchFailed", Reason: "ArchiveOperationFailed", Message: "too large"},
		},
		{
			name: "failed verification sets no condition",
			err:  VerificationFailed("HEAD", failure.Final, "InvalidCommitSignature", errors.New("signature of 'https://u:p@h/r.git' invalid")),
			want: events.Failure{Reason: "InvalidCommitSignature", Message: "signature of 'https://h/r.git' invalid"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := *tc.err.Data(); got != tc.want {
				t.Errorf("Data() = %+v, want %+v", got, tc.want)
			}
		})
	}
	wrapped := AsError(errors.New("boom"), "GitOperationFailed")
	if wrapped.Handling != failure.Transient || wrapped.Reason != "GitOperationFailed" {
		t.Errorf("AsError of a plain error = %+v", wrapped)
	}
	inner := StalledError("URLInvalid", "bad")
	if AsError(inner, "other") != inner {
		t.Errorf("AsError does not keep a *failure.Error")
	}
}

func TestVerificationFailedCarriesTheCheck(t *testing.T) {
	f := VerificationFailed("Tag", failure.Final, "InvalidTagSignature", errors.New("tag 'v1' is not signed by 'https://t@h/k'"))
	var u *Unverified
	if !errors.As(f, &u) {
		t.Fatal("the failure does not carry an *Unverified")
	}
	want := events.Verification{Mode: "Tag", Reason: "InvalidTagSignature", Message: "tag 'v1' is not signed by 'https://h/k'"}
	if *u.Verification != want {
		t.Errorf("verification = %+v, want %+v", *u.Verification, want)
	}
}
