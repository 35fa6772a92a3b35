package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// TestReports: deliveries are batched into one report per Flush; problems
// and new generations are reported even without deliveries, once.
func TestReports(t *testing.T) {
	rec := &recorder{}
	r := &Reports{Publisher: rec, Dispatcher: "d", Log: testr.New(t)}
	ref := events.SubscriptionRef{Namespace: "a", Name: "b", UID: "u", Generation: 1}
	ctx := context.Background()
	flush := func() []events.DeliveryReport {
		rec.mu.Lock()
		n := len(rec.reports)
		rec.mu.Unlock()
		r.Flush(ctx)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.reports[n:]
	}

	r.Problem(ref, nil)
	if got := flush(); len(got) != 1 || got[0].Problem != nil || got[0].Subscription != ref {
		t.Fatalf("first sight: %+v, want one report without a problem", got)
	}
	r.Problem(ref, nil)
	if got := flush(); len(got) != 0 {
		t.Errorf("nothing new: %d reports, want none", len(got))
	}
	now := time.Now()
	for range 3 {
		r.Delivered(ref, now)
	}
	r.Failed(ref)
	if got := flush(); len(got) != 1 || got[0].Delivered != 3 || got[0].Failed != 1 || !got[0].LastDelivered.Equal(now) {
		t.Errorf("deliveries: %+v, want one report of 3 delivered and 1 failed", got)
	}
	bad := &events.Failure{Reason: "SecretNotFound", Message: "m"}
	r.Problem(ref, bad)
	if got := flush(); len(got) != 1 || got[0].Problem == nil || *got[0].Problem != *bad {
		t.Errorf("problem: %+v", got)
	}
	r.Delivered(ref, now)
	if got := flush(); len(got) != 1 || got[0].Problem == nil {
		t.Errorf("a report while the problem lasts: %+v, want it to carry the problem", got)
	}
	ref.Generation = 2
	r.Problem(ref, bad)
	if got := flush(); len(got) != 1 || got[0].Subscription.Generation != 2 {
		t.Errorf("new generation: %+v, want a report of generation 2", got)
	}
	r.Forget("u")
	r.Delivered(events.SubscriptionRef{Namespace: "a", Name: "c", UID: "v"}, now)
	if got := flush(); len(got) != 1 || got[0].Subscription.UID != "v" {
		t.Errorf("after Forget: %+v", got)
	}
}
