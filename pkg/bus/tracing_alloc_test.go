package bus

import (
	"context"
	"testing"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// TestTracingOffAllocations: with no tracer provider installed (tracing
// off), the spans of a publish and of a delivery cost a few allocations
// (the no-op spans and their contexts), never their attributes.
func TestTracingOffAllocations(t *testing.T) {
	job := events.Job{ID: "j", Object: events.ObjectRef{Kind: "GitRepository", Namespace: "n", Name: "o"}}
	body, err := events.Encode("test", events.TypePackaged, "id", "gitrepository/n/o", &events.Outcome{Job: job})
	if err != nil {
		t.Fatal(err)
	}
	m, err := events.Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	subject := events.PublishSubject("GitRepository")
	allocs := testing.AllocsPerRun(100, func() {
		_, span := startPublishSpan(ctx, "test", subject, events.TypePackaged, "id", "gitrepository/n/o")
		endSpan(span, "", nil)
		_, span = startProcessSpan(ctx, "test", subject, m, Delivery{Attempt: 1})
		endSpan(span, "success", nil)
	})
	t.Logf("%v allocations for a publish span and a process span", allocs)
	if allocs > 6 {
		t.Errorf("%v allocations for two no-op spans, want at most 6", allocs)
	}
}
