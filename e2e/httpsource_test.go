package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// unservedKind is a plug-in kind the watcher reconciles but whose fetcher
// is never deployed (e2e/testdata/crds).
const unservedKind = "e2e.headwater.dev/v1alpha1/UnservedSource"

var httpSourceGVK = schema.GroupVersionKind{Group: "source.headwater.dev", Version: "v1alpha1", Kind: "HTTPSource"}

// bundleServer serves one tarball at /bundle.tar.gz with an ETag,
// answering a matching If-None-Match with 304, and counts the requests.
type bundleServer struct {
	mu          sync.Mutex
	body        []byte
	version     int
	requests    int
	conditional int // requests with If-None-Match
	notModified int
}

func (s *bundleServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	etag := `"v` + strconv.Itoa(s.version) + `"`
	if inm := r.Header.Get("If-None-Match"); inm != "" {
		s.conditional++
		if inm == etag {
			s.notModified++
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	w.Header().Set("ETag", etag)
	w.Header().Set("Content-Type", "application/gzip")
	_, _ = w.Write(s.body)
}

// serve replaces the content (a new version, a new ETag).
func (s *bundleServer) serve(body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.body, s.version = body, s.version+1
}

func (s *bundleServer) counts() (requests, conditional, notModified int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests, s.conditional, s.notModified
}

// gzTar is a gzipped tarball of files (name to content), in order.
func gzTar(t *testing.T, files ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f[0], Mode: 0o644, Size: int64(len(f[1])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// pluginStatus is what the test reads of a plug-in kind's status.
type pluginStatus struct {
	Conditions             []metav1.Condition `json:"conditions"`
	Artifact               *meta.Artifact     `json:"artifact"`
	ObservedGeneration     int64              `json:"observedGeneration"`
	LastHandledReconcileAt string             `json:"lastHandledReconcileAt"`
}

func getPlugin(t *testing.T, gvk schema.GroupVersionKind, name string) (*unstructured.Unstructured, pluginStatus) {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, u); err != nil {
		t.Fatalf("get %s %s: %v", gvk.Kind, name, err)
	}
	var st pluginStatus
	if m, ok := u.Object["status"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &st); err != nil {
			t.Fatalf("status of %s: %v", name, err)
		}
	}
	return u, st
}

// waitPlugin waits until the object's status satisfies check.
func waitPlugin(t *testing.T, gvk schema.GroupVersionKind, name, what string, check func(pluginStatus) error) pluginStatus {
	t.Helper()
	var st pluginStatus
	eventually(t, fmt.Sprintf("%s %s: %s", gvk.Kind, name, what), func() error {
		_, st = getPlugin(t, gvk, name)
		return check(st)
	})
	return st
}

// hasCondition is a check that the condition typ has status and reason.
func hasCondition(typ string, status metav1.ConditionStatus, reason string) func(pluginStatus) error {
	return func(st pluginStatus) error {
		c := apimeta.FindStatusCondition(st.Conditions, typ)
		if c == nil || c.Status != status || c.Reason != reason {
			return fmt.Errorf("%s is %+v, want %s %s", typ, c, status, reason)
		}
		return nil
	}
}

// reconcilePlugin asks for a reconcile of the object and waits until the
// watcher has handled it (status.lastHandledReconcileAt).
func reconcilePlugin(t *testing.T, gvk schema.GroupVersionKind, name string) pluginStatus {
	t.Helper()
	u, _ := getPlugin(t, gvk, name)
	token := requestReconcileOf(t, u)
	return waitPlugin(t, gvk, name, "reconcile "+token+" handled", func(st pluginStatus) error {
		if st.LastHandledReconcileAt != token {
			return fmt.Errorf("lastHandledReconcileAt %q", st.LastHandledReconcileAt)
		}
		return nil
	})
}

// TestHTTPSource drives the plug-in kind shipped as the example through
// the real system: the watcher reconciles HTTPSources from its
// registration alone, the httpsource-fetcher (its own bus identity) makes
// one conditional request per check, and the packager and artifact-server
// store and serve the artifact as any kind's.
func TestHTTPSource(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	srv := &bundleServer{}
	srv.serve(gzTar(t, [2]string{"deploy/app.yaml", "kind: ConfigMap\n"}, [2]string{"README", "v1\n"}))
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)

	const name = "http-bundle"
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(httpSourceGVK)
	obj.SetNamespace(namespace)
	obj.SetName(name)
	obj.Object["spec"] = map[string]any{"url": ts.URL + "/bundle.tar.gz", "interval": "1h"}
	createObject(t, obj)

	// Ready, with an artifact the artifact-server serves, of that digest.
	first := waitPlugin(t, httpSourceGVK, name, "Ready", hasCondition(meta.ReadyCondition, metav1.ConditionTrue, meta.SucceededReason))
	if first.Artifact == nil || first.Artifact.URL == "" {
		t.Fatalf("no artifact in status: %+v", first)
	}
	body := download(t, first.Artifact.URL)
	if got := sha256Digest(body); got != first.Artifact.Digest {
		t.Fatalf("artifact digest %s, status says %s", got, first.Artifact.Digest)
	}
	if files := untarArtifact(t, body); files["deploy/app.yaml"] != "kind: ConfigMap\n" || files["README"] != "v1\n" {
		t.Fatalf("artifact holds %v", files)
	}
	if first.Artifact.Metadata["etag"] != `"v1"` {
		t.Errorf("artifact metadata %v, want the ETag", first.Artifact.Metadata)
	}
	waitKindEvent(t, "HTTPSource", name, corev1.EventTypeNormal, "NewArtifact", func(msg string) bool { return strings.Contains(msg, "stored artifact for revision") })
	// Published as an ExternalArtifact of its name, which Flux's
	// kustomize- and helm-controller consume: the same artifact, the
	// HTTPSource as its source and controller owner.
	ea := waitExternalArtifact(t, name, func(a *meta.Artifact) bool { return a.Digest == first.Artifact.Digest })
	if ref := ea.Spec.SourceRef; ref == nil || ref.APIVersion != httpSourceGVK.GroupVersion().String() || ref.Kind != "HTTPSource" || ref.Name != name {
		t.Errorf("ExternalArtifact sourceRef %+v, want the HTTPSource", ref)
	}
	if owner := metav1.GetControllerOf(ea); owner == nil || owner.Kind != "HTTPSource" || owner.Name != name {
		t.Errorf("ExternalArtifact controller %+v, want the HTTPSource", owner)
	}
	if files := eaFiles(t, ea); files["README"] != "v1\n" {
		t.Errorf("the ExternalArtifact's artifact holds %v", files)
	}
	// Exported as Flux's kinds are (the leader's headwater_source_condition).
	eventually(t, "headwater_source_condition of the HTTPSource", func() error {
		for _, w := range env.Watchers() {
			if v, err := metricSum(w.TelemetryAddr, "headwater_source_condition", `kind="HTTPSource"`, `name="`+name+`"`, `status="True"`); err == nil && v == 1 {
				return nil
			}
		}
		return fmt.Errorf("no watcher reports Ready True")
	})

	// Unchanged: one conditional request, answered 304, no new artifact.
	requests, conditional, notModified := srv.counts()
	newArtifacts := kindEventCount(t, "HTTPSource", name, "NewArtifact")
	st := reconcilePlugin(t, httpSourceGVK, name)
	r2, c2, n2 := srv.counts()
	if r2-requests != 1 || c2-conditional != 1 || n2-notModified != 1 {
		t.Errorf("unchanged check: %d requests, %d conditional, %d not modified; want one conditional request answered 304",
			r2-requests, c2-conditional, n2-notModified)
	}
	if st.Artifact == nil || st.Artifact.Digest != first.Artifact.Digest {
		t.Errorf("unchanged check changed the artifact: %+v", st.Artifact)
	}
	if n := kindEventCount(t, "HTTPSource", name, "NewArtifact"); n != newArtifacts {
		t.Errorf("NewArtifact Events: %d after the unchanged check, %d before", n, newArtifacts)
	}

	// Changed content: a new revision and artifact.
	srv.serve(gzTar(t, [2]string{"README", "v2\n"}))
	second := waitPluginAfterReconcile(t, name, func(st pluginStatus) error {
		if st.Artifact == nil || st.Artifact.Revision == first.Artifact.Revision {
			return fmt.Errorf("artifact %+v", st.Artifact)
		}
		return nil
	})
	if files := untarArtifact(t, download(t, second.Artifact.URL)); files["README"] != "v2\n" || len(files) != 1 {
		t.Fatalf("new artifact holds %v", files)
	}
	waitExternalArtifact(t, name, func(a *meta.Artifact) bool { return a.Digest == second.Artifact.Digest })

	// A tarball whose entry leaves its root: refused, said so, the last
	// artifact kept.
	srv.serve(gzTar(t, [2]string{"../../escape", "x"}))
	bad := waitPluginAfterReconcile(t, name, hasCondition("FetchFailed", metav1.ConditionTrue, "InvalidArchive"))
	if bad.Artifact == nil || bad.Artifact.Digest != second.Artifact.Digest {
		t.Errorf("the path-escaping tarball replaced the artifact: %+v", bad.Artifact)
	}
	if c := apimeta.FindStatusCondition(bad.Conditions, meta.ReadyCondition); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Ready is %+v after a refused tarball", c)
	}
	waitKindEvent(t, "HTTPSource", name, corev1.EventTypeWarning, "InvalidArchive", func(msg string) bool { return strings.Contains(msg, "leaves its root") })
	if status, _ := httpGet(t, second.Artifact.URL); status != http.StatusOK {
		t.Errorf("the last artifact is no longer served: %d", status)
	}

	// A URL nothing listens on: a clear condition and Event, the last
	// artifact kept.
	u, _ := getPlugin(t, httpSourceGVK, name)
	patchObject(t, u, func(o *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(o.Object, fmt.Sprintf("http://127.0.0.1:%d/gone.tar.gz", closedPort(t)), "spec", "url")
	})
	down := waitPlugin(t, httpSourceGVK, name, "FetchFailed for an unreachable URL", func(st pluginStatus) error {
		c := apimeta.FindStatusCondition(st.Conditions, "FetchFailed")
		if c == nil || c.Status != metav1.ConditionTrue || !bytes.Contains([]byte(c.Message), []byte("gone.tar.gz")) {
			return fmt.Errorf("FetchFailed is %+v", c)
		}
		return nil
	})
	if down.Artifact == nil || down.Artifact.Digest != second.Artifact.Digest {
		t.Errorf("an unreachable URL lost the artifact: %+v", down.Artifact)
	}
	waitKindEvent(t, "HTTPSource", name, corev1.EventTypeWarning, "URLInvalid", func(msg string) bool { return strings.Contains(msg, "gone.tar.gz") })
}

// waitPluginAfterReconcile asks for a reconcile of the HTTPSource and
// waits for check.
func waitPluginAfterReconcile(t *testing.T, name string, check func(pluginStatus) error) pluginStatus {
	t.Helper()
	reconcilePlugin(t, httpSourceGVK, name)
	return waitPlugin(t, httpSourceGVK, name, "after a reconcile", check)
}

// TestPluginKindWithoutFetcher: an object of a plug-in kind the watcher is
// configured with, but whose fetcher was never deployed, says so in a
// condition and an Event rather than waiting for ever.
func TestPluginKindWithoutFetcher(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	gvk := schema.GroupVersionKind{Group: "e2e.headwater.dev", Version: "v1alpha1", Kind: "UnservedSource"}
	const name = "unserved"
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	obj.SetNamespace(namespace)
	obj.SetName(name)
	obj.Object["spec"] = map[string]any{"interval": "1h"}
	createObject(t, obj)
	st := waitPlugin(t, gvk, name, "FetchFailed NoFetcher", hasCondition("FetchFailed", metav1.ConditionTrue, "NoFetcher"))
	if c := apimeta.FindStatusCondition(st.Conditions, meta.ReadyCondition); c == nil || c.Status != metav1.ConditionFalse ||
		!bytes.Contains([]byte(c.Message), []byte("plugin-unservedsource")) {
		t.Errorf("Ready is %+v, want False naming the fetcher's identity", c)
	}
	waitKindEvent(t, "UnservedSource", name, corev1.EventTypeWarning, "NoFetcher", func(msg string) bool { return strings.Contains(msg, "deploy its fetcher") })
}

// TestPluginCannotAnswerForAnotherKind: a plug-in fetcher is the least
// trusted process on the bus. With its identity, a result for another
// kind is refused by NATS on that kind's subjects, and by the packager on
// its own kind's (counted as rejected); a result for its own kind with a
// job the watcher did not issue is refused by the watcher (counted as
// forged). No status changes.
func TestPluginCannotAnswerForAnotherKind(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "plugin-victim"
	_, commit := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	victim := waitArtifact(t, name, revision(commit))

	identity := events.PluginIdentity("HTTPSource")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := bus.Connect(ctx, bus.Options{URL: env.NATSURL, NKeyFile: env.NATSIdentities.SeedFiles[identity]}, identity, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pub := conn.NewPublisher(identity)
	job := events.Job{ID: "plugin-forged-" + name, RequestedAt: time.Now().UTC(), Object: events.ObjectRef{Kind: kind, Namespace: namespace,
		Name: name, UID: string(victim.UID), Generation: victim.Generation}, Seal: victim.Status.Artifact.Digest}
	fetched := &events.Fetched{Job: job, Revision: "evil@sha1:" + strings.Repeat("e", 40), Staging: "staging/evil.tar", ArtifactName: "evil.tar.gz"}

	// Another kind's subject: NATS refuses the publish.
	refused, cancelRefused := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancelRefused()
	if err := pub.Publish(refused, events.PackageSubject(kind), events.TypeFetched, job, fetched); err == nil {
		t.Errorf("%s published on %s", identity, events.PackageSubject(kind))
	}

	// Its own kind's subject, another kind's job: the packager refuses it.
	packager := env.Service(harness.Packager)
	rejectedBefore, err := metricSum(packager.TelemetryAddr, "headwater_jobs_total", `result="rejected"`)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, events.PackageSubject("HTTPSource"), events.TypeFetched, job, fetched); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the packager rejects a GitRepository's job on the HTTPSource subject", func() error {
		n, err := metricSum(packager.TelemetryAddr, "headwater_jobs_total", `result="rejected"`)
		if err != nil {
			return err
		}
		if n <= rejectedBefore {
			return fmt.Errorf("rejected %v, want more than %v", n, rejectedBefore)
		}
		return nil
	})

	// Its own kind, a job the watcher never issued: the watcher refuses
	// the outcome.
	src := &unstructured.Unstructured{}
	src.SetGroupVersionKind(httpSourceGVK)
	src.SetNamespace(namespace)
	src.SetName(name)
	src.Object["spec"] = map[string]any{"url": "http://127.0.0.1:1/never.tar.gz", "interval": "1h", "suspend": true}
	createObject(t, src)
	u, _ := getPlugin(t, httpSourceGVK, name)
	watcher := env.Service(harness.Watcher)
	forgedBefore, err := metricSum(watcher.TelemetryAddr, "headwater_forged_outcomes_total")
	if err != nil {
		t.Fatal(err)
	}
	own := events.Job{ID: "plugin-forged-own-" + name, RequestedAt: time.Now().UTC(), Seal: "made-up",
		Object: events.ObjectRef{Kind: "HTTPSource", Namespace: namespace, Name: name, UID: string(u.GetUID()), Generation: u.GetGeneration()}}
	failed := &events.Outcome{Job: own, Failure: &events.Failure{Condition: "FetchFailed", Reason: "Forged", Message: "forged"}}
	if err := pub.Publish(ctx, events.PublishSubject("HTTPSource"), events.TypeFetchFailed, own, failed); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watcher refuses the made-up job's outcome", func() error {
		n, err := metricSum(watcher.TelemetryAddr, "headwater_forged_outcomes_total")
		if err != nil {
			return err
		}
		if n <= forgedBefore {
			return fmt.Errorf("headwater_forged_outcomes_total %v, want more than %v", n, forgedBefore)
		}
		return nil
	})
	if _, st := getPlugin(t, httpSourceGVK, name); apimeta.FindStatusCondition(st.Conditions, "FetchFailed") != nil {
		t.Errorf("the forged outcome reached the HTTPSource's status: %+v", st.Conditions)
	}
	if got := get(t, name); got.Status.Artifact == nil || got.Status.Artifact.Digest != victim.Status.Artifact.Digest {
		t.Errorf("the GitRepository's artifact changed: %+v", got.Status.Artifact)
	}
}
