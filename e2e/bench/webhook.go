package bench

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
)

// Scenario k's shape.
const (
	// webhookPushes is how many pushes, each followed by its hook, are
	// timed.
	webhookPushes = 50
	// webhookPace is the least time between two hooks: the watcher's
	// default -hook-min-interval, so that what is timed is a hook's way
	// through the system, not the per-source rate limit (pushes to one
	// branch seconds apart are already a busy repository).
	webhookPace   = time.Second
	webhookToken  = "bench-webhook-token"
	webhookRepo   = "webhook"
	webhookPoll   = 10 * time.Millisecond
	webhookWait   = 30 * time.Second
	webhookSource = "webhook"
)

// Latency summarises the latencies a scenario timed.
type Latency struct {
	// What is timed, e.g. "hook POST -> new revision in status".
	What string
	// N is the number of samples.
	N int
	// P50, P99 and Max are the median, the 99th percentile (nearest rank)
	// and the largest.
	P50, P99, Max time.Duration
}

// latencyOf summarises samples.
func latencyOf(what string, samples []time.Duration) *Latency {
	if len(samples) == 0 {
		return nil
	}
	s := slices.Sorted(slices.Values(samples))
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return &Latency{What: what, N: len(s), P50: rank(0.50), P99: rank(0.99), Max: s[len(s)-1]}
}

// String prints the latencies in seconds.
func (l *Latency) String() string {
	return fmt.Sprintf("p50 %.2f s, p99 %.2f s, max %.2f s over %d", l.P50.Seconds(), l.P99.Seconds(), l.Max.Seconds(), l.N)
}

// WebhookPush runs scenario k on Headwater with the receiver: one
// GitRepository of a small repository (interval 1h) and a GitHub Receiver
// for it; then webhookPushes times a commit is pushed and a GitHub push
// payload signed with the Receiver's token is POSTed to the receiver, and
// the time from the POST until the GitRepository's status shows the new
// revision is taken. Flux's source-controller has no receiver (its
// notification-controller annotates the source), so there is no baseline.
func WebhookPush(ctx context.Context, o Options) (m *Measurement, err error) {
	o.Harness.Receivers = true
	env, stop, err := startEnv(ctx, o, "webhook", Headwater)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	c, err := benchClient(ctx, env)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, scenarioTimeout)
	defer cancel()

	repo, err := env.NewRepo(webhookRepo, branch)
	if err != nil {
		return nil, err
	}
	commit := func(i int) (string, error) {
		if err := repo.Write(map[string]string{"app.yaml": fmt.Sprintf("version: %d\n", i)}); err != nil {
			return "", err
		}
		return repo.Commit(fmt.Sprintf("Release %d", i))
	}
	head, err := commit(0)
	if err != nil {
		return nil, err
	}
	if err := c.Create(sctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "webhook-token", Namespace: namespace},
		StringData: map[string]string{"token": webhookToken}}); err != nil {
		return nil, fmt.Errorf("create token secret: %w", err)
	}
	if err := c.Create(sctx, gitRepository(webhookSource, env.Git.RepoURL(webhookRepo), time.Hour)); err != nil {
		return nil, fmt.Errorf("create gitrepository: %w", err)
	}
	rcv := &notificationv1.Receiver{
		ObjectMeta: metav1.ObjectMeta{Name: "github", Namespace: namespace},
		Spec: notificationv1.ReceiverSpec{
			Type: notificationv1.GitHubReceiver, Events: []string{"push"},
			SecretRef: &meta.LocalObjectReference{Name: "webhook-token"},
			Resources: []notificationv1.ReceiverResource{{CrossNamespaceObjectReference: notificationv1.CrossNamespaceObjectReference{
				Kind: sourcev1.GitRepositoryKind, Name: webhookSource}}},
		},
	}
	if err := c.Create(sctx, rcv); err != nil {
		return nil, fmt.Errorf("create receiver: %w", err)
	}
	o.progress("k: waiting for the GitRepository and the Receiver")
	if err := waitRevision(sctx, c, head, webhookWait); err != nil {
		return nil, err
	}
	path := rcv.GetWebhookPath(webhookToken)
	if err := pollUntil(sctx, webhookWait, func() (bool, error) {
		if err := c.Get(sctx, client.ObjectKeyFromObject(rcv), rcv); err != nil {
			return false, err
		}
		return apimeta.IsStatusConditionTrue(rcv.Status.Conditions, meta.ReadyCondition) && rcv.Status.WebhookPath == path, nil
	}); err != nil {
		return nil, fmt.Errorf("receiver Ready: %w", err)
	}
	url := "http://" + env.ReceiverAddr + path

	meter, err := startMeter(sctx, env)
	if err != nil {
		return nil, err
	}
	samples := make([]time.Duration, 0, webhookPushes)
	var last time.Time
	for i := 1; i <= webhookPushes; i++ {
		before := head
		if head, err = commit(i); err != nil {
			return nil, err
		}
		if wait := webhookPace - time.Since(last); wait > 0 && !sleep(sctx, wait) {
			return nil, sctx.Err()
		}
		body := githubPush(env, before, head)
		last = time.Now()
		if err := postGitHubHook(sctx, url, body); err != nil {
			return nil, fmt.Errorf("push %d: %w", i, err)
		}
		if err := waitRevision(sctx, c, head, webhookWait); err != nil {
			return nil, fmt.Errorf("push %d: %w", i, err)
		}
		samples = append(samples, time.Since(last))
		if i%10 == 0 {
			o.progress("k: %d/%d pushes, last %.2f s", i, webhookPushes, samples[len(samples)-1].Seconds())
		}
	}
	end := time.Now()
	settle(sctx, env)
	m, err = meter.stop(sctx, end)
	if err != nil {
		return nil, err
	}
	m.Latency = latencyOf("hook POST -> new revision in status", samples)
	m.Notes = append(m.Notes, fmt.Sprintf("%s: %s; hooks at least %s apart (the watcher's -hook-min-interval)",
		m.Latency.What, m.Latency, webhookPace))
	return m, nil
}

// waitRevision waits until the benchmark's GitRepository has an artifact
// of commit.
func waitRevision(ctx context.Context, c client.Client, commit string, within time.Duration) error {
	want := branch + "@sha1:" + commit
	obj := &sourcev1.GitRepository{}
	err := pollUntil(ctx, within, func() (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: webhookSource}, obj); err != nil {
			return false, err
		}
		return obj.Status.Artifact != nil && obj.Status.Artifact.Revision == want, nil
	})
	if err != nil {
		return fmt.Errorf("revision %s in status: %w", want, err)
	}
	return nil
}

// pollUntil calls done every webhookPoll until it reports true, fails, or
// within passes.
func pollUntil(ctx context.Context, within time.Duration, done func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		ok, err := done()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if !sleep(ctx, webhookPoll) {
			return ctx.Err()
		}
	}
}

// githubPush is GitHub's push event payload for a push of after onto the
// benchmark branch.
func githubPush(env *harness.Env, before, after string) []byte {
	b, _ := json.Marshal(map[string]any{
		"ref": "refs/heads/" + branch, "before": before, "after": after,
		"head_commit": map[string]any{"id": after, "message": "Release", "timestamp": time.Now().UTC().Format(time.RFC3339)},
		"repository":  map[string]any{"name": webhookRepo, "full_name": "bench/" + webhookRepo, "clone_url": env.Git.RepoURL(webhookRepo)},
		"pusher":      map[string]string{"name": "bench", "email": "bench@example.com"},
	})
	return b
}

// postGitHubHook POSTs body as GitHub does, signed with the token.
func postGitHubHook(ctx context.Context, url string, body []byte) error {
	mac := hmac.New(sha256.New, []byte(webhookToken))
	mac.Write(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-GitHub-Delivery", fmt.Sprintf("bench-%d", time.Now().UnixNano()))
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("post hook: %w", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("post hook: status %d", resp.StatusCode)
	}
	return nil
}
