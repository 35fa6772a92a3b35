package hook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"hash"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/headwater-gitops/headwater/pkg/events"
)

const testToken = "s3cr3t-t0ken"

// receivers is a Receivers over a fixed list (the handler has nothing
// else to ask; the e2e tests use the real cache).
type receivers []*notificationv1.Receiver

func (rs receivers) ByWebhookPath(_ context.Context, path string) (*notificationv1.Receiver, error) {
	for _, r := range rs {
		if r.Status.WebhookPath == path {
			return r, nil
		}
	}
	return nil, nil
}

type tokens map[string]string

func (t tokens) Token(_ context.Context, namespace, name string) ([]byte, error) {
	if name == "unreachable" {
		return nil, os.ErrDeadlineExceeded
	}
	v, ok := t[namespace+"/"+name]
	if !ok {
		return nil, fmt.Errorf("%w: secret %s/%s not found", ErrNoToken, namespace, name)
	}
	return []byte(v), nil
}

// published records the hooks published.
type published struct{ hooks []*events.HookReceived }

func (p *published) Publish(_ context.Context, subject, eventType string, job events.Job, data any) error {
	h := data.(*events.HookReceived)
	if subject != events.HookSubject(h.Job.Object.Namespace, h.Job.Object.Name) || eventType != events.TypeHookReceived || job.ID != h.Job.ID {
		panic("hook published on the wrong subject or with the wrong type")
	}
	p.hooks = append(p.hooks, h)
	return nil
}

func receiver(name, typ string, evts ...string) *notificationv1.Receiver {
	r := &notificationv1.Receiver{
		ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name, UID: types.UID("uid-" + name)},
		Spec: notificationv1.ReceiverSpec{
			Type: typ, Events: evts, SecretRef: &meta.LocalObjectReference{Name: "webhook-token"},
			Resources: []notificationv1.ReceiverResource{
				{CrossNamespaceObjectReference: notificationv1.CrossNamespaceObjectReference{Kind: "GitRepository", Name: "podinfo"}},
				{CrossNamespaceObjectReference: notificationv1.CrossNamespaceObjectReference{Kind: "GitRepository", Name: "*",
					Namespace: "other", MatchLabels: map[string]string{"team": "a"}}},
			},
		},
	}
	r.Status.WebhookPath = r.GetWebhookPath(testToken)
	r.Status.Conditions = []metav1.Condition{{Type: meta.ReadyCondition, Status: metav1.ConditionTrue, Reason: meta.SucceededReason}}
	return r
}

func sign(h func() hash.Hash, key string, body []byte) string {
	m := hmac.New(h, []byte(key))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

func TestHandler(t *testing.T) {
	push, err := os.ReadFile("testdata/github-push.json")
	if err != nil {
		t.Fatal(err)
	}
	github := receiver("github", notificationv1.GitHubReceiver, "ping", "push")
	gitlab := receiver("gitlab", notificationv1.GitLabReceiver, "Push Hook")
	bitbucket := receiver("bitbucket", notificationv1.BitbucketReceiver, "repo:refs_changed")
	generic := receiver("generic", notificationv1.GenericReceiver)
	hmacRcv := receiver("hmac", notificationv1.GenericHMACReceiver)
	harbor := receiver("harbor", notificationv1.HarborReceiver)
	suspended := receiver("suspended", notificationv1.GenericReceiver)
	suspended.Spec.Suspend = true
	notReady := receiver("not-ready", notificationv1.GenericReceiver)
	notReady.Status.Conditions[0].Status = metav1.ConditionFalse
	noSecret := receiver("no-secret", notificationv1.GenericReceiver)
	noSecret.Spec.SecretRef.Name = "missing"
	apiDown := receiver("api-down", notificationv1.GenericReceiver)
	apiDown.Spec.SecretRef.Name = "unreachable"
	all := receivers{github, gitlab, bitbucket, generic, hmacRcv, harbor, suspended, notReady, noSecret, apiDown}

	sha256sig := "sha256=" + sign(sha256.New, testToken, push)
	tests := []struct {
		name    string
		rcv     *notificationv1.Receiver
		path    string // default: rcv's webhook path
		headers map[string]string
		body    []byte
		code    int
		hooked  bool
		event   string
	}{
		{name: "github push signed with sha256", rcv: github, body: push, code: 200, hooked: true, event: "push",
			headers: map[string]string{"X-Hub-Signature-256": sha256sig, "X-GitHub-Event": "push", "X-GitHub-Delivery": "d-1"}},
		{name: "github push signed with sha1", rcv: github, body: push, code: 200, hooked: true, event: "push",
			headers: map[string]string{"X-Hub-Signature": "sha1=" + sign(sha1.New, testToken, push), "X-GitHub-Event": "push"}},
		{name: "github event matched case-insensitively", rcv: github, body: push, code: 200, hooked: true, event: "PUSH",
			headers: map[string]string{"X-Hub-Signature-256": sha256sig, "X-GitHub-Event": "PUSH"}},
		{name: "github ping is answered, triggers nothing", rcv: github, body: push, code: 200,
			headers: map[string]string{"X-Hub-Signature-256": sha256sig, "X-GitHub-Event": "ping"}},
		{name: "github signed with another token", rcv: github, body: push, code: 400,
			headers: map[string]string{"X-Hub-Signature-256": "sha256=" + sign(sha256.New, "wrong", push), "X-GitHub-Event": "push"}},
		{name: "github body changed after signing", rcv: github, body: append(bytes.Clone(push), ' '), code: 400,
			headers: map[string]string{"X-Hub-Signature-256": sha256sig, "X-GitHub-Event": "push"}},
		{name: "github unsigned", rcv: github, body: push, code: 400, headers: map[string]string{"X-GitHub-Event": "push"}},
		{name: "github event not allowed", rcv: github, body: push, code: 400,
			headers: map[string]string{"X-Hub-Signature-256": sha256sig, "X-GitHub-Event": "issues"}},
		{name: "github unsupported content type", rcv: github, body: push, code: 400,
			headers: map[string]string{"X-Hub-Signature-256": sha256sig, "X-GitHub-Event": "push", "Content-Type": "text/plain"}},
		{name: "gitlab token", rcv: gitlab, body: push, code: 200, hooked: true, event: "Push Hook",
			headers: map[string]string{"X-Gitlab-Token": testToken, "X-Gitlab-Event": "Push Hook"}},
		{name: "gitlab wrong token", rcv: gitlab, body: push, code: 400,
			headers: map[string]string{"X-Gitlab-Token": "wrong", "X-Gitlab-Event": "Push Hook"}},
		{name: "gitlab event not allowed", rcv: gitlab, body: push, code: 400,
			headers: map[string]string{"X-Gitlab-Token": testToken, "X-Gitlab-Event": "Tag Push Hook"}},
		{name: "bitbucket signed", rcv: bitbucket, body: push, code: 200, hooked: true, event: "repo:refs_changed",
			headers: map[string]string{"X-Hub-Signature": "sha256=" + sign(sha256.New, testToken, push), "X-Event-Key": "repo:refs_changed"}},
		{name: "bitbucket wrong signature", rcv: bitbucket, body: push, code: 400,
			headers: map[string]string{"X-Hub-Signature": "sha256=" + sign(sha256.New, "x", push), "X-Event-Key": "repo:refs_changed"}},
		{name: "bitbucket event not allowed", rcv: bitbucket, body: push, code: 400,
			headers: map[string]string{"X-Hub-Signature": "sha256=" + sign(sha256.New, testToken, push), "X-Event-Key": "pr:opened"}},
		{name: "generic needs only the path", rcv: generic, body: nil, code: 200, hooked: true},
		{name: "generic-hmac sha1", rcv: hmacRcv, body: push, code: 200, hooked: true,
			headers: map[string]string{"X-Signature": "sha1=" + sign(sha1.New, testToken, push)}},
		{name: "generic-hmac sha256", rcv: hmacRcv, body: push, code: 200, hooked: true,
			headers: map[string]string{"X-Signature": "sha256=" + sign(sha256.New, testToken, push)}},
		{name: "generic-hmac sha512", rcv: hmacRcv, body: push, code: 200, hooked: true,
			headers: map[string]string{"X-Signature": "sha512=" + sign(sha512.New, testToken, push)}},
		{name: "generic-hmac wrong signature", rcv: hmacRcv, body: push, code: 400,
			headers: map[string]string{"X-Signature": "sha256=" + sign(sha256.New, "wrong", push)}},
		{name: "generic-hmac unknown algorithm", rcv: hmacRcv, body: push, code: 400,
			headers: map[string]string{"X-Signature": "md5=00"}},
		{name: "unsupported type", rcv: harbor, body: push, code: 400, headers: map[string]string{"Authorization": testToken}},
		{name: "unknown path", rcv: generic, path: "/hook/" + strings.Repeat("0", 64), code: 404},
		{name: "outside /hook/", rcv: generic, path: "/other", code: 404},
		{name: "suspended", rcv: suspended, code: 503},
		{name: "not ready", rcv: notReady, code: 503},
		{name: "token secret missing", rcv: noSecret, code: 400},
		{name: "API server unreachable", rcv: apiDown, code: 500},
		{name: "body over 3 MiB", rcv: generic, body: bytes.Repeat([]byte("a"), MaxBodyBytes+1), code: 413},
		{name: "body of exactly 3 MiB", rcv: generic, body: bytes.Repeat([]byte("a"), MaxBodyBytes), code: 200, hooked: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pub := &published{}
			h := &Handler{Receivers: all, Tokens: tokens{"apps/webhook-token": testToken}, Hooks: pub, Log: logr.Discard()}
			path := tc.path
			if path == "" {
				path = tc.rcv.Status.WebhookPath
			}
			req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Fatalf("status %d, want %d", rec.Code, tc.code)
			}
			if got := len(pub.hooks) == 1; got != tc.hooked || len(pub.hooks) > 1 {
				t.Fatalf("%d hooks published, want hooked=%v", len(pub.hooks), tc.hooked)
			}
			if !tc.hooked {
				return
			}
			hk := pub.hooks[0]
			if hk.Job.Object.Kind != events.ReceiverKind || hk.Job.Object.Name != tc.rcv.Name || hk.Job.Object.Namespace != "apps" ||
				hk.Type != tc.rcv.Spec.Type || hk.Event != tc.event {
				t.Errorf("hook %+v", hk)
			}
			want := []events.HookResource{{Kind: "GitRepository", Name: "podinfo", Namespace: "apps"},
				{Kind: "GitRepository", Name: "*", Namespace: "other", MatchLabels: map[string]string{"team": "a"}}}
			if len(hk.Resources) != 2 || hk.Resources[0].Namespace != want[0].Namespace || hk.Resources[1].Namespace != want[1].Namespace ||
				hk.Resources[1].MatchLabels["team"] != "a" {
				t.Errorf("resources %+v, want %+v", hk.Resources, want)
			}
		})
	}
}

// TestHookIDFollowsTheDelivery checks that a provider's redelivery makes
// the same message ID (stored once), and deliveries without an ID differ.
func TestHookIDFollowsTheDelivery(t *testing.T) {
	h := &Handler{}
	r := receiver("github", notificationv1.GitHubReceiver)
	a, b := h.hook(r, "push", "d-1"), h.hook(r, "push", "d-1")
	if a.Job.ID != b.Job.ID {
		t.Errorf("redelivery IDs %q and %q differ", a.Job.ID, b.Job.ID)
	}
	if c := h.hook(r, "push", "d-2"); c.Job.ID == a.Job.ID {
		t.Errorf("deliveries d-1 and d-2 share ID %q", a.Job.ID)
	}
	if x, y := h.hook(r, "", ""), h.hook(r, "", ""); x.Job.ID == y.Job.ID {
		t.Errorf("two deliveries without an ID share ID %q", x.Job.ID)
	}
}
