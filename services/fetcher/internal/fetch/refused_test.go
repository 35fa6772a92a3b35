package fetch

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/fluxcd/pkg/apis/acl"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/egress"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// flattened is a cause that keeps only the words of the error it was
// made from, as go-git's UnexpectedError does.
type flattened struct{ msg string }

func (e *flattened) Error() string { return "unexpected client error: " + e.msg }

// TestRefused: a failure the egress policy caused, through the error
// chain or in words only, stalls with AccessDenied in its condition and
// keeps its message; any other failure is left alone.
func TestRefused(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: egress.ErrRefused}
	for name, tc := range map[string]struct {
		err       error
		refused   bool
		condition string
	}{
		"chain":        {source.Failed(sourcev1.GitOperationFailedReason, "unable to clone 'http://x/app.git': %w", dial), true, sourcev1.FetchFailedCondition},
		"words":        {source.Failed(sourcev1.GitOperationFailedReason, "unable to fetch: %w", &flattened{dial.Error()}), true, sourcev1.FetchFailedCondition},
		"condition":    {&failure.Error{Handling: failure.Final, Condition: sourcev1.StorageOperationFailedCondition, Reason: "X", Err: dial}, true, sourcev1.StorageOperationFailedCondition},
		"no condition": {&failure.Error{Handling: failure.Transient, Reason: "X", Err: dial}, true, sourcev1.FetchFailedCondition},
		"other":        {source.Failed(sourcev1.GitOperationFailedReason, "unable to clone: %w", errors.New("connection refused")), false, ""},
		"platform":     {fmt.Errorf("publish: %w", dial), false, ""},
	} {
		got := refused(tc.err)
		if !tc.refused {
			if got != tc.err {
				t.Errorf("%s: %v became %v", name, tc.err, got)
			}
			continue
		}
		f := failure.As(got)
		if f == nil || f.Handling != failure.Stalling || f.Reason != acl.AccessDeniedReason || f.Condition != tc.condition || f.Error() != failure.As(tc.err).Error() {
			t.Errorf("%s: %#v, want stalling AccessDenied in %s with the message %q", name, f, tc.condition, tc.err)
		}
	}
}
