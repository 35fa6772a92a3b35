package bus

import (
	"context"
	"testing"
	"time"
)

// TestPastDeadline: a job's context counts as out of time once its
// deadline has passed, even before its timer has set the cause (the
// instant in which a handler's own context of the same deadline can
// fail first), and not before.
func TestPastDeadline(t *testing.T) {
	future, cancel := context.WithTimeoutCause(context.Background(), time.Hour, errDeadline)
	defer cancel()
	if pastDeadline(future) {
		t.Error("a context an hour from its deadline is past it")
	}
	fired, cancel := context.WithTimeoutCause(context.Background(), time.Nanosecond, errDeadline)
	defer cancel()
	<-fired.Done()
	if !pastDeadline(fired) {
		t.Error("a context whose timer fired with errDeadline is not past its deadline")
	}
	// A deadline already passed, its cause not (yet) errDeadline.
	passed, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if !pastDeadline(passed) {
		t.Error("a context whose deadline has passed is not past it")
	}
	if pastDeadline(context.Background()) {
		t.Error("a context without a deadline is past it")
	}
}
