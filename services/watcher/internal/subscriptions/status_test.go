package subscriptions

import (
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
	"github.com/headwater-gitops/headwater/pkg/events"
)

func TestApply(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(s int) *time.Time { v := t0.Add(time.Duration(s) * time.Second); return &v }
	ref := func(gen int64) events.SubscriptionRef {
		return events.SubscriptionRef{Namespace: "a", Name: "b", UID: "u", Generation: gen}
	}
	dead := func(s int) *events.DeadLetter {
		return &events.DeadLetter{EventID: "e", EventType: events.TypeArtifactStored, Subject: "gitrepository/a/p", Time: *at(s), Attempts: 3, Error: "endpoint answered 500"}
	}
	tests := []struct {
		name         string
		reports      []events.DeliveryReport
		delivered    int64
		failed, dead int64
		status       metav1.ConditionStatus
		reason       string
		observed     int64
	}{
		{"first report, nothing yet", []events.DeliveryReport{{Subscription: ref(1)}}, 0, 0, 0, metav1.ConditionTrue, v1alpha1.SucceededReason, 1},
		{"counts add up across replicas", []events.DeliveryReport{
			{Subscription: ref(1), Delivered: 3, Failed: 1, LastDelivered: at(1)},
			{Subscription: ref(1), Delivered: 2, LastDelivered: at(2)},
		}, 5, 1, 0, metav1.ConditionTrue, v1alpha1.SucceededReason, 1},
		{"dead letter after the last delivery", []events.DeliveryReport{
			{Subscription: ref(1), Delivered: 1, LastDelivered: at(1)},
			{Subscription: ref(1), Failed: 3, DeadLettered: 1, LastDeadLetter: dead(5)},
		}, 1, 3, 1, metav1.ConditionFalse, v1alpha1.DeliveryFailedReason, 1},
		{"recovered: a delivery after the dead letter", []events.DeliveryReport{
			{Subscription: ref(1), Failed: 3, DeadLettered: 1, LastDeadLetter: dead(5)},
			{Subscription: ref(1), Delivered: 1, LastDelivered: at(6)},
		}, 1, 3, 1, metav1.ConditionTrue, v1alpha1.SucceededReason, 1},
		{"a problem wins", []events.DeliveryReport{
			{Subscription: ref(2), Delivered: 1, LastDelivered: at(1), Problem: &events.Failure{Reason: v1alpha1.SecretNotFoundReason, Message: "secret a/k: not found"}},
		}, 1, 0, 0, metav1.ConditionFalse, v1alpha1.SecretNotFoundReason, 2},
		{"a late report of an older generation keeps the newer verdict", []events.DeliveryReport{
			{Subscription: ref(3), Delivered: 1, LastDelivered: at(1)},
			{Subscription: ref(2), Delivered: 1, Problem: &events.Failure{Reason: v1alpha1.InvalidSpecReason, Message: "bad"}},
		}, 2, 0, 0, metav1.ConditionTrue, v1alpha1.SucceededReason, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var st v1alpha1.SubscriptionStatus
			for _, r := range tc.reports {
				Apply(&st, &r, metav1.NewTime(t0))
			}
			if st.Delivered != tc.delivered || st.FailedAttempts != tc.failed || st.DeadLetters != tc.dead {
				t.Errorf("delivered %d failed %d dead %d, want %d %d %d", st.Delivered, st.FailedAttempts, st.DeadLetters, tc.delivered, tc.failed, tc.dead)
			}
			c := apimeta.FindStatusCondition(st.Conditions, v1alpha1.ReadyCondition)
			if c == nil || c.Status != tc.status || c.Reason != tc.reason {
				t.Fatalf("Ready %+v, want %s %s", c, tc.status, tc.reason)
			}
			if st.ObservedGeneration != tc.observed || c.ObservedGeneration != tc.observed {
				t.Errorf("observed generation %d (condition %d), want %d", st.ObservedGeneration, c.ObservedGeneration, tc.observed)
			}
			if tc.dead > 0 && (st.LastDeadLetter == nil || st.LastDeadLetter.EventID != "e" || st.LastDeadLetter.Attempts != 3) {
				t.Errorf("last dead letter %+v", st.LastDeadLetter)
			}
		})
	}
}
