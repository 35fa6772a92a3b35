package receiver

import (
	"strings"
	"testing"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/apis/acl"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestMark(t *testing.T) {
	tests := []struct {
		name, reason, msg, path string
		ready                   metav1.ConditionStatus
		reconciling, stalled    bool
		observed                bool
	}{
		{name: "initialized", reason: meta.SucceededReason, msg: "Receiver initialized for path: /hook/ab", path: "/hook/ab",
			ready: metav1.ConditionTrue, observed: true},
		{name: "token missing", reason: notificationv1.TokenNotFoundReason, msg: "unable to read token",
			ready: metav1.ConditionFalse, reconciling: true},
		{name: "unsupported", reason: UnsupportedReason, msg: "receiver type 'harbor' is not supported",
			ready: metav1.ConditionFalse, stalled: true, observed: true},
		{name: "access denied", reason: acl.AccessDeniedReason, msg: "can't access 'GitRepository/b/x', cross-namespace references are not allowed",
			ready: metav1.ConditionFalse, stalled: true, observed: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			obj := &notificationv1.Receiver{ObjectMeta: metav1.ObjectMeta{Generation: 3,
				Annotations: map[string]string{meta.ReconcileRequestAnnotation: "now"}}}
			obj.Status.WebhookPath = "/hook/old"
			conditions.MarkStalled(obj, "Old", "old")
			mark(obj, tc.reason, tc.msg, tc.path)
			c := conditions.Get(obj, meta.ReadyCondition)
			if c == nil || c.Status != tc.ready || c.Reason != tc.reason || c.Message != tc.msg {
				t.Errorf("Ready %+v", c)
			}
			if got := conditions.Has(obj, meta.ReconcilingCondition); got != tc.reconciling {
				t.Errorf("Reconciling %v, want %v", got, tc.reconciling)
			}
			if got := conditions.IsTrue(obj, meta.StalledCondition); got != tc.stalled {
				t.Errorf("Stalled %v, want %v", got, tc.stalled)
			}
			if got := obj.Status.ObservedGeneration == 3; got != tc.observed {
				t.Errorf("observedGeneration %d", obj.Status.ObservedGeneration)
			}
			if obj.Status.WebhookPath != tc.path || obj.Status.LastHandledReconcileAt != "now" {
				t.Errorf("webhookPath %q, lastHandledReconcileAt %q", obj.Status.WebhookPath, obj.Status.LastHandledReconcileAt)
			}
			if ready(obj) != (tc.ready == metav1.ConditionTrue) {
				t.Errorf("ready() = %v", ready(obj))
			}
		})
	}
}

func TestUnsupported(t *testing.T) {
	res := func(filter string) notificationv1.ReceiverResource {
		return notificationv1.ReceiverResource{Filter: filter,
			CrossNamespaceObjectReference: notificationv1.CrossNamespaceObjectReference{Kind: "GitRepository", Name: "a"}}
	}
	tests := []struct {
		name string
		spec notificationv1.ReceiverSpec
		want string // a part of the message; "" for supported
	}{
		{"github", notificationv1.ReceiverSpec{Type: "github", Resources: []notificationv1.ReceiverResource{res("")}}, ""},
		{"generic-hmac", notificationv1.ReceiverSpec{Type: "generic-hmac"}, ""},
		{"harbor", notificationv1.ReceiverSpec{Type: "harbor"}, "receiver type 'harbor' is not supported"},
		{"resourceFilter", notificationv1.ReceiverSpec{Type: "github", ResourceFilter: "true"}, "spec.resourceFilter"},
		{"resource filter", notificationv1.ReceiverSpec{Type: "gitlab", Resources: []notificationv1.ReceiverResource{res("true")}},
			"the filter of resource GitRepository/a"},
	}
	for _, tc := range tests {
		got := unsupported(&notificationv1.Receiver{Spec: tc.spec})
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestCrossNamespace(t *testing.T) {
	res := func(ns, name string) notificationv1.ReceiverResource {
		return notificationv1.ReceiverResource{CrossNamespaceObjectReference: notificationv1.CrossNamespaceObjectReference{
			Kind: "GitRepository", Namespace: ns, Name: name}}
	}
	tests := []struct {
		name      string
		resources []notificationv1.ReceiverResource
		want      string
	}{
		{"own namespace implied", []notificationv1.ReceiverResource{res("", "a")}, ""},
		{"own namespace named", []notificationv1.ReceiverResource{res("tenant-a", "a")}, ""},
		{"another namespace", []notificationv1.ReceiverResource{res("", "a"), res("tenant-b", "*")},
			"can't access 'GitRepository/tenant-b/*', cross-namespace references are not allowed"},
	}
	for _, tc := range tests {
		rcv := &notificationv1.Receiver{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a"},
			Spec: notificationv1.ReceiverSpec{Type: "github", Resources: tc.resources}}
		if got := crossNamespace(rcv); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestEmptyTokenIsNoToken: a Secret whose token is empty leaves the
// Receiver without a webhook path (TokenNotFound), as a missing one does.
func TestEmptyTokenIsNoToken(t *testing.T) {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "token"}, Data: map[string][]byte{"token": {}}}
	r := &Reconciler{Live: fake.NewClientBuilder().WithObjects(secret).Build()}
	obj := &notificationv1.Receiver{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "r"},
		Spec: notificationv1.ReceiverSpec{Type: notificationv1.GenericReceiver, SecretRef: &meta.LocalObjectReference{Name: "token"}}}
	if token, err := r.token(t.Context(), obj); err == nil || err.Error() != "invalid 'apps/token' secret data: field 'token' is empty" {
		t.Errorf("token = %q, %v; want the empty-token error", token, err)
	}
	secret.Data["token"] = []byte("t")
	r.Live = fake.NewClientBuilder().WithObjects(secret).Build()
	if token, err := r.token(t.Context(), obj); err != nil || token != "t" {
		t.Errorf("token = %q, %v", token, err)
	}
}
