package fairshare

import (
	"fmt"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func request(ns string, i int) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("s%d", i)}}
}

// drain gets every request of q now queued, marking each done.
func drain(t *testing.T, q workqueue.TypedRateLimitingInterface[reconcile.Request]) []string {
	t.Helper()
	var got []string
	for q.Len() > 0 {
		r, shutdown := q.Get()
		if shutdown {
			t.Fatal("queue shut down")
		}
		got = append(got, r.Namespace+"/"+r.Name)
		q.Done(r)
	}
	return got
}

// TestWorkQueueTakesNamespacesInTurn floods the controller's queue with
// one namespace's requests before two others add theirs: the later
// namespaces' requests are taken in turn with the flood's, not after it;
// a request added again while it waits is still taken once.
func TestWorkQueueTakesNamespacesInTurn(t *testing.T) {
	newQueue := Options{MaxInFlight: DefaultMaxInFlight}.NewWorkQueue()
	if newQueue == nil {
		t.Fatal("no work queue with fair share on")
	}
	q := newQueue("test-turns", workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	for i := range 5 {
		q.Add(request("big", i))
	}
	q.Add(request("small", 0))
	q.Add(request("small", 1))
	q.Add(request("other", 0))
	q.Add(request("big", 2)) // already waiting: taken once
	got := drain(t, q)
	want := []string{"big/s0", "small/s0", "other/s0", "big/s1", "small/s1", "big/s2", "big/s3", "big/s4"}
	if !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}

	// A namespace that emptied and comes back takes its turn after the
	// ones waiting.
	q.Add(request("big", 5))
	q.Add(request("big", 6))
	q.Add(request("small", 2))
	if got, want := drain(t, q), []string{"big/s5", "small/s2", "big/s6"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

// TestWorkQueueOffWithoutFairShare leaves controller-runtime's own queue
// in place when fair share is off.
func TestWorkQueueOffWithoutFairShare(t *testing.T) {
	if (Options{MaxInFlight: 0}).NewWorkQueue() != nil {
		t.Error("a work queue with fair share off")
	}
}

// TestRoundRobinLen counts what is pushed and popped across groups.
func TestRoundRobinLen(t *testing.T) {
	r := newRoundRobin(func(s string) string { return s[:1] })
	for _, s := range []string{"a1", "a2", "b1", "c1", "c2", "c3"} {
		r.Push(s)
	}
	var got []string
	for r.Len() > 0 {
		got = append(got, r.Pop())
	}
	if want := []string{"a1", "b1", "c1", "a2", "c2", "c3"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	if len(r.queues) != 0 || len(r.turns) != 0 {
		t.Errorf("left %d queues, %d turns", len(r.queues), len(r.turns))
	}
}
