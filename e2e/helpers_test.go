package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// The machine is slow and shared: every wait is generous. Nothing here
// asserts on speed.
const (
	timeout  = 60 * time.Second
	pollStep = 200 * time.Millisecond
)

const (
	namespace = "default"
	branch    = "master"
	kind      = sourcev1.GitRepositoryKind
)

// requireEnv skips in -short mode and, for a failed test, logs the tail of
// every service's output.
func requireEnv(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: needs the service and control-plane binaries; skipped with -short")
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, s := range env.Services() {
			t.Logf("--- %s (running=%v)\n%s", s.Name, s.Running(), s.LogTail(80))
		}
	})
}

// eventually polls check until it returns nil, failing the test with the
// last error after timeout.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("%s: %v", what, t.Context().Err())
		case <-time.After(pollStep):
		}
	}
}

// consistently polls check for d and fails the test as soon as it errs.
func consistently(t *testing.T, what string, d time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := check(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("%s: %v", what, t.Context().Err())
		case <-time.After(pollStep):
		}
	}
}

// newRepo creates a served repository with files committed on master and
// returns it with the commit.
func newRepo(t *testing.T, name string, files map[string]string) (*gitserver.Repo, string) {
	t.Helper()
	repo, err := env.NewRepo(name, branch)
	if err != nil {
		t.Fatal(err)
	}
	return repo, commit(t, repo, files, "Initial commit of "+name)
}

// commit writes files, commits them with message, pushes and returns the commit.
func commit(t *testing.T, repo *gitserver.Repo, files map[string]string, message string) string {
	t.Helper()
	if err := repo.Write(files); err != nil {
		t.Fatal(err)
	}
	c, err := repo.Commit(message)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// createSource creates the GitRepository name as a user would: interval,
// url and branch, and whatever the options set.
func createSource(t *testing.T, name, url, ref string, opts ...func(*sourcev1.GitRepository)) {
	t.Helper()
	obj := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: sourcev1.GitRepositorySpec{
			URL:       url,
			Interval:  metav1.Duration{Duration: 5 * time.Minute},
			Reference: &sourcev1.GitRepositoryRef{Branch: ref},
		},
	}
	for _, o := range opts {
		o(obj)
	}
	if err := env.Client.Create(t.Context(), obj); err != nil {
		t.Fatalf("create gitrepository %s: %v", name, err)
	}
}

// get returns the GitRepository name.
func get(t *testing.T, name string) *sourcev1.GitRepository {
	t.Helper()
	var obj sourcev1.GitRepository
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, &obj); err != nil {
		t.Fatalf("get gitrepository %s: %v", name, err)
	}
	return &obj
}

// patch applies mutate to the GitRepository name with a merge patch.
func patch(t *testing.T, name string, mutate func(*sourcev1.GitRepository)) {
	t.Helper()
	obj := get(t, name)
	base := client.MergeFrom(obj.DeepCopy())
	mutate(obj)
	if err := env.Client.Patch(t.Context(), obj, base); err != nil {
		t.Fatalf("patch gitrepository %s: %v", name, err)
	}
}

// requestReconcile sets reconcile.fluxcd.io/requestedAt to now, as
// `flux reconcile source git` does, and returns the token.
func requestReconcile(t *testing.T, name string) string {
	t.Helper()
	token := time.Now().UTC().Format(time.RFC3339Nano)
	patch(t, name, func(o *sourcev1.GitRepository) {
		if o.Annotations == nil {
			o.Annotations = map[string]string{}
		}
		o.Annotations[meta.ReconcileRequestAnnotation] = token
	})
	return token
}

// revision is Flux's revision of a commit on the test branch.
func revision(commit string) string { return branch + "@sha1:" + commit }

// fluxSource is what the wait helpers need of a Flux source object.
type fluxSource interface {
	client.Object
	GetConditions() []metav1.Condition
	GetArtifact() *meta.Artifact
}

// waitReady waits until the source returned by get is Ready for its current
// generation (observed returns its status.observedGeneration) with an
// artifact of revision rev, and returns it.
func waitReady[T fluxSource](t *testing.T, what string, get func() T, observed func(T) int64, rev string) T {
	t.Helper()
	var obj T
	eventually(t, fmt.Sprintf("%s Ready with revision %s", what, rev), func() error {
		obj = get()
		ready := apimeta.FindStatusCondition(obj.GetConditions(), meta.ReadyCondition)
		switch {
		case ready == nil:
			return errors.New("no Ready condition yet")
		case ready.Status != metav1.ConditionTrue:
			return fmt.Errorf("Ready=%s %s: %s", ready.Status, ready.Reason, ready.Message)
		case obj.GetArtifact() == nil:
			return errors.New("Ready but no artifact")
		case obj.GetArtifact().Revision != rev:
			return fmt.Errorf("artifact revision %s", obj.GetArtifact().Revision)
		case observed(obj) != obj.GetGeneration():
			return fmt.Errorf("observedGeneration %d, generation %d", observed(obj), obj.GetGeneration())
		}
		return nil
	})
	return obj
}

// waitConditionOf waits until the source returned by get has a condition of
// type with status and reason, and returns it.
func waitConditionOf[T fluxSource](t *testing.T, what string, get func() T, typ string, status metav1.ConditionStatus, reason string) T {
	t.Helper()
	var obj T
	eventually(t, fmt.Sprintf("%s %s=%s %s", what, typ, status, reason), func() error {
		obj = get()
		c := apimeta.FindStatusCondition(obj.GetConditions(), typ)
		if c == nil {
			return fmt.Errorf("no %s condition; conditions: %v", typ, obj.GetConditions())
		}
		if c.Status != status || c.Reason != reason {
			return fmt.Errorf("%s=%s %s: %s", typ, c.Status, c.Reason, c.Message)
		}
		return nil
	})
	return obj
}

// conditionOf returns the condition of type, failing the test if there is
// none.
func conditionOf(t *testing.T, obj fluxSource, typ string) metav1.Condition {
	t.Helper()
	c := apimeta.FindStatusCondition(obj.GetConditions(), typ)
	if c == nil {
		t.Fatalf("%s has no %s condition: %+v", obj.GetName(), typ, obj.GetConditions())
	}
	return *c
}

// waitArtifact waits until the GitRepository name is Ready for its current
// generation with an artifact of revision, and returns it.
func waitArtifact(t *testing.T, name, rev string) *sourcev1.GitRepository {
	t.Helper()
	return waitReady(t, "gitrepository "+name, func() *sourcev1.GitRepository { return get(t, name) },
		func(o *sourcev1.GitRepository) int64 { return o.Status.ObservedGeneration }, rev)
}

// waitCondition waits until the GitRepository name has a condition of type
// with status and reason, and returns the object.
func waitCondition(t *testing.T, name, typ string, status metav1.ConditionStatus, reason string) *sourcev1.GitRepository {
	t.Helper()
	return waitConditionOf(t, "gitrepository "+name, func() *sourcev1.GitRepository { return get(t, name) }, typ, status, reason)
}

// condition returns the condition of type, failing the test if there is none.
func condition(t *testing.T, obj *sourcev1.GitRepository, typ string) metav1.Condition {
	t.Helper()
	return conditionOf(t, obj, typ)
}

// waitKubeEvent waits for a Kubernetes Event of type and reason about the
// GitRepository name whose message satisfies match, and returns it.
func waitKubeEvent(t *testing.T, name, eventType, reason string, match func(msg string) bool) corev1.Event {
	t.Helper()
	return waitKindEvent(t, kind, name, eventType, reason, match)
}

// kubeEventCount counts the Kubernetes Events of reason about the
// GitRepository name, repetitions included.
func kubeEventCount(t *testing.T, name, reason string) int {
	t.Helper()
	return kindEventCount(t, kind, name, reason)
}

// waitKindEvent waits for a Kubernetes Event of type and reason about the
// object kind/name whose message satisfies match, and returns it.
func waitKindEvent(t *testing.T, kind, name, eventType, reason string, match func(msg string) bool) corev1.Event {
	t.Helper()
	var found corev1.Event
	eventually(t, fmt.Sprintf("%s Event %s for %s %s", eventType, reason, kind, name), func() error {
		var list corev1.EventList
		if err := env.Client.List(t.Context(), &list, client.InNamespace(namespace)); err != nil {
			return err
		}
		var seen []string
		for _, e := range list.Items {
			if e.InvolvedObject.Kind != kind || e.InvolvedObject.Name != name {
				continue
			}
			seen = append(seen, fmt.Sprintf("%s %s %q", e.Type, e.Reason, e.Message))
			if e.Type == eventType && e.Reason == reason && (match == nil || match(e.Message)) {
				found = e
				return nil
			}
		}
		return fmt.Errorf("events seen: %v", seen)
	})
	return found
}

// kindEventCount counts the Kubernetes Events of reason about the object
// kind/name, repetitions included.
func kindEventCount(t *testing.T, kind, name, reason string) int {
	t.Helper()
	var list corev1.EventList
	if err := env.Client.List(t.Context(), &list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name && e.Reason == reason {
			n += max(int(e.Count), 1)
		}
	}
	return n
}

// download GETs url and returns the body, failing unless it answers 200.
func download(t *testing.T, url string) []byte {
	t.Helper()
	status, body := httpGet(t, url)
	if status != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, status, body)
	}
	return body
}

// httpGet GETs url and returns the status code and body.
func httpGet(t *testing.T, url string) (int, []byte) {
	t.Helper()
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, body
}

// sha256Digest is Flux's digest of b.
func sha256Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// untarArtifact reads a tar.gz artifact into path -> content for its
// regular files, failing the test on an entry whose header is not canonical
// (uid/gid 0, no owner names, epoch mtime) or that lies under .git.
func untarArtifact(t *testing.T, body []byte) map[string]string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("artifact is not gzip: %v", err)
	}
	files := readTar(t, zr)
	for _, h := range files.headers {
		if h.Name == ".git" || h.Name == ".git/" || strings.HasPrefix(h.Name, ".git/") {
			t.Errorf("artifact contains %s", h.Name)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || h.ModTime.Unix() != 0 {
			t.Errorf("artifact entry %s is not canonical: uid %d gid %d uname %q gname %q mtime %s",
				h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime)
		}
	}
	return files.content
}

// treeAt is the repository's tree at commit, path -> content, as `git
// archive` gives it.
func treeAt(t *testing.T, repo *gitserver.Repo, commit string) map[string]string {
	t.Helper()
	cmd := exec.Command("git", "-C", repo.Dir, "archive", "--format=tar", commit)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git archive %s: %v", commit, err)
	}
	return readTar(t, bytes.NewReader(out)).content
}

type tarFiles struct {
	headers []*tar.Header
	content map[string]string
}

func readTar(t *testing.T, r io.Reader) tarFiles {
	t.Helper()
	tf := tarFiles{content: map[string]string{}}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return tf
		}
		if err != nil {
			t.Fatalf("read tar: %v", err)
		}
		h.Name = strings.TrimPrefix(h.Name, "./")
		tf.headers = append(tf.headers, h)
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read tar %s: %v", h.Name, err)
		}
		tf.content[h.Name] = string(b)
	}
}

// diffTrees describes how got differs from want, "" when they are equal.
func diffTrees(got, want map[string]string) string {
	var d []string
	for p, w := range want {
		g, ok := got[p]
		switch {
		case !ok:
			d = append(d, "missing "+p)
		case g != w:
			d = append(d, "different content in "+p)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			d = append(d, "unexpected "+p)
		}
	}
	slices.Sort(d)
	return strings.Join(d, "; ")
}

// storedFiles lists the files in a source's storage directory with their
// modification times; a missing directory gives an empty map.
func storedFiles(t *testing.T, name string) map[string]time.Time {
	t.Helper()
	dir := filepath.Join(env.StoragePath, "gitrepository", namespace, name)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	files := map[string]time.Time{}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = fi.ModTime()
	}
	return files
}

// closedPort returns a port on 127.0.0.1 that nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// requireServicesRunning fails the test if a service process has exited.
func requireServicesRunning(t *testing.T) {
	t.Helper()
	for _, s := range env.Services() {
		if !s.Running() {
			t.Errorf("%s is not running (exit: %v)", s.Name, s.ExitErr())
		}
	}
}

// recordedEvent is one public CloudEvent seen on NATS.
type recordedEvent struct {
	subject string // the NATS subject
	msg     *events.Message
	err     error
}

// outcome is the event's data.
func (r recordedEvent) outcome() *events.Outcome {
	if r.msg == nil {
		return nil
	}
	o, _ := r.msg.Data.(*events.Outcome)
	return o
}

// eventRecorder keeps every public CloudEvent, for the whole package.
type eventRecorder struct {
	mu     sync.Mutex
	events []recordedEvent
}

func (r *eventRecorder) record(subject string, m *events.Message, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recordedEvent{subject: subject, msg: m, err: err})
}

// forSource returns the events about the GitRepository name so far.
func (r *eventRecorder) forSource(name string) []recordedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	want := events.EventSubject(kind, namespace, name)
	var out []recordedEvent
	for _, e := range r.events {
		if e.subject == want {
			out = append(out, e)
		}
	}
	return out
}

// wait waits for an event about the GitRepository name of eventType that
// satisfies match, and returns it.
func (r *eventRecorder) wait(t *testing.T, name, eventType string, match func(*events.Outcome) bool) recordedEvent {
	t.Helper()
	var found recordedEvent
	eventually(t, fmt.Sprintf("CloudEvent %s for gitrepository %s", eventType, name), func() error {
		var seen []string
		for _, e := range r.forSource(name) {
			if e.err != nil {
				return fmt.Errorf("an event on %s does not decode: %w", e.subject, e.err)
			}
			seen = append(seen, e.msg.Event.Type())
			if e.msg.Event.Type() == eventType && e.outcome() != nil && (match == nil || match(e.outcome())) {
				found = e
				return nil
			}
		}
		return fmt.Errorf("events seen: %v", seen)
	})
	return found
}

// sampleFiles is the sample tree `make run` serves.
func sampleFiles(t *testing.T) map[string]string {
	t.Helper()
	files, err := harness.SampleFiles()
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// subscriberAuth authenticates a test's event subscription as the
// read-only subscriber identity, as a user's subscriber would.
func subscriberAuth(e *harness.Env) nats.Option {
	opt, err := e.NATSOption(events.SubscriberIdentity)
	if err != nil {
		panic(fmt.Sprintf("subscriber key: %v", err))
	}
	return opt
}

// createObject creates obj and deletes it when the test ends (before the
// servers the test started stop).
func createObject(t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(t.Context(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := env.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %T %s: %v", obj, obj.GetName(), err)
		}
	})
}

// getObject reads the object name of the test namespace into obj and
// returns it.
func getObject[T client.Object](t *testing.T, name string, obj T) T {
	t.Helper()
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, obj); err != nil {
		t.Fatalf("get %T %s: %v", obj, name, err)
	}
	return obj
}

// patchObject applies mutate to obj, as read, with a merge patch.
func patchObject[T client.Object](t *testing.T, obj T, mutate func(T)) {
	t.Helper()
	base := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	mutate(obj)
	if err := env.Client.Patch(t.Context(), obj, base); err != nil {
		t.Fatalf("patch %T %s: %v", obj, obj.GetName(), err)
	}
}

// requestReconcileOf sets reconcile.fluxcd.io/requestedAt on obj, as read,
// to now, as `flux reconcile` does, and returns the token.
func requestReconcileOf(t *testing.T, obj client.Object) string {
	t.Helper()
	token := time.Now().UTC().Format(time.RFC3339Nano)
	patchObject(t, obj, func(o client.Object) {
		a := o.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		a[meta.ReconcileRequestAnnotation] = token
		o.SetAnnotations(a)
	})
	return token
}
