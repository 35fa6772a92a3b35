package clustertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	kustomizev1 "github.com/fluxcd/kustomize-controller/api/v1"
	notificationv1 "github.com/fluxcd/notification-controller/api/v1"
	notificationv1beta3 "github.com/fluxcd/notification-controller/api/v1beta3"
	eventv1 "github.com/fluxcd/pkg/apis/event/v1beta1"
	fluxmeta "github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
	"github.com/headwater-gitops/headwater/testsupport/registry"
)

// appsNamespace is where the test's Kustomizations apply what the sources
// hold.
const appsNamespace = "flux-apps"

// TestFluxControllers runs Flux's own kustomize-controller and
// notification-controller, built from their published modules
// (`make flux-image-archive`), as pods beside Headwater's drop-in in
// flux-system, unchanged and configured as `flux install` configures them,
// and checks that they work with Headwater as with Flux's source-controller:
// Kustomizations apply, update and prune from a GitRepository's and an
// OCIRepository's artifacts, downloaded by the Service's cluster DNS name;
// an Alert delivers the watcher's Events to a Provider; a Receiver's
// webhook makes Headwater fetch a new commit long before the source's
// interval; a HelmChart's artifact is installed and upgraded as
// helm-controller does.
func TestFluxControllers(t *testing.T) {
	requireFull(t)
	fluxInstalled(t)
	fluxControllers(t)
	install(t, "overlays/flux-system")
	cl := fluxClient(t)
	t.Cleanup(func() { deleteFluxObjects(t) })
	t.Cleanup(func() { fluxLogsOnFailure(t) })
	env.EnsureNamespace(t, appsNamespace)
	t.Cleanup(func() {
		_ = env.C.Client.CoreV1().Namespaces().Delete(context.Background(), appsNamespace, metav1.DeleteOptions{})
	})

	t.Run("KustomizationFromGitRepository", func(t *testing.T) { testKustomizeGit(t, cl) })
	t.Run("KustomizationFromOCIRepository", func(t *testing.T) { testKustomizeOCI(t, cl) })
	t.Run("Alert", func(t *testing.T) { testAlert(t, cl) })
	t.Run("Receiver", func(t *testing.T) { testReceiver(t, cl) })
	t.Run("HelmRelease", func(t *testing.T) { testHelmRelease(t, cl) })

	for name, n := range restartCounts(t) {
		if n > 0 {
			t.Errorf("pod %s restarted %d times", name, n)
		}
	}
}

// fluxControllers makes what `flux install` runs beside source-controller:
// it imports Flux's kustomize- and notification-controller's images
// (HEADWATER_FLUX_IMAGES), applies their CRDs from their modules
// (HEADWATER_FLUX_CRDS) and e2e/cluster/manifests/flux-controllers.yaml,
// and waits until both are Ready. Everything is removed when the test ends.
func fluxControllers(t *testing.T) {
	t.Helper()
	images, crds := os.Getenv("HEADWATER_FLUX_IMAGES"), os.Getenv("HEADWATER_FLUX_CRDS")
	if images == "" || crds == "" {
		t.Fatal("HEADWATER_FLUX_IMAGES or HEADWATER_FLUX_CRDS is not set: run through make test-cluster, which builds them (make flux-image-archive)")
	}
	ctx := context.Background()
	start := time.Now()
	if err := env.C.ImportImage(ctx, images); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(env.Deploy, "..", "e2e", "cluster", "manifests", "flux-controllers.yaml")
	checkImages(t, manifest)
	for _, dir := range strings.Split(crds, ":") {
		env.Kubectl(t, "apply", "--server-side", "-f", dir)
		t.Cleanup(func() {
			if out, err := env.C.Kubectl(context.Background(), "delete", "-f", dir, "--ignore-not-found", "--wait=true", "--timeout=3m").Run(); err != nil {
				t.Errorf("delete Flux's CRDs in %s: %v\n%s", dir, err, out)
			}
		})
	}
	env.Kubectl(t, "apply", "-f", manifest)
	t.Cleanup(func() {
		if out, err := env.C.Kubectl(context.Background(), "delete", "-f", manifest, "--ignore-not-found", "--wait=true", "--timeout=3m").Run(); err != nil {
			t.Errorf("delete Flux's controllers: %v\n%s", err, out)
		}
	})
	for _, d := range []string{"kustomize-controller", "notification-controller"} {
		if err := env.C.WaitRollout(ctx, "flux-system", "deployment/"+d, 5*time.Minute); err != nil {
			t.Fatalf("%v\n%s", err, env.Diagnose(ns))
		}
	}
	t.Logf("Flux's kustomize-controller and notification-controller imported and Ready in %s", time.Since(start).Round(100*time.Millisecond))
}

// checkImages fails t unless the node has every image manifest names: the
// Makefile's FLUX_*_VERSION and the manifest must agree.
func checkImages(t *testing.T, manifest string) {
	t.Helper()
	data, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	have, err := env.C.Images(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s+image:\s*(\S+)\s*$`).FindAllSubmatch(data, -1) {
		if ref := string(m[1]); !slices.Contains(have, ref) {
			t.Fatalf("the node has no image %s, which %s names: the Makefile's FLUX_*_VERSION and the manifest disagree", ref, manifest)
		}
	}
}

// fluxClient is a client of the cluster that knows the source,
// kustomize and notification kinds.
func fluxClient(t *testing.T) ctrlclient.Client {
	t.Helper()
	cl, err := ctrlclient.New(env.C.Config, ctrlclient.Options{Scheme: fluxScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// fluxScheme knows the built-in kinds and the source, kustomize and
// notification kinds.
func fluxScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, sourcev1.AddToScheme, kustomizev1.AddToScheme,
		notificationv1.AddToScheme, notificationv1beta3.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	return scheme
}

// deleteFluxObjects deletes the Kustomizations (pruning what they
// applied) and the notification kinds while their controllers still run
// to remove their finalizers, before the uninstall removes the namespace.
func deleteFluxObjects(t *testing.T) {
	for _, kind := range []string{"kustomizations", "receivers", "alerts", "providers"} {
		if out, err := env.C.Kubectl(context.Background(), "delete", kind, "--all", "--all-namespaces", "--wait=true", "--timeout=3m").Run(); err != nil {
			t.Errorf("delete %s: %v\n%s", kind, err, out)
		}
	}
}

// fluxLogsOnFailure logs the last lines of Flux's controllers when t
// failed (under app=source-controller, Flux's or the drop-in's
// artifact-servers, whichever run).
func fluxLogsOnFailure(t *testing.T) {
	if !t.Failed() {
		return
	}
	for _, app := range []string{"kustomize-controller", "notification-controller", "source-controller"} {
		list, err := env.C.Client.CoreV1().Pods("flux-system").List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			t.Logf("%s pods: %v", app, err)
			continue
		}
		for _, p := range list.Items {
			tailLines := int64(30)
			logs, err := env.C.Client.CoreV1().Pods("flux-system").GetLogs(p.Name, &corev1.PodLogOptions{TailLines: &tailLines}).DoRaw(context.Background())
			t.Logf("--- %s logs (%v):\n%s", p.Name, err, logs)
		}
	}
}

// configMap is the manifest of a ConfigMap name whose key value is value.
func configMap(name, value string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\ndata:\n  value: %q\n", name, value)
}

// kustomization creates a Kustomization in flux-system that applies path
// of the source kind/name into appsNamespace, pruning what leaves it,
// every 10 minutes (`flux install`'s flux-system Kustomization's interval).
func kustomization(t *testing.T, cl ctrlclient.Client, name, kind, source, path string) *kustomizev1.Kustomization {
	t.Helper()
	return kustomizationEvery(t, cl, name, kind, source, path, 10*time.Minute)
}

// kustomizationEvery is kustomization with the given interval.
func kustomizationEvery(t *testing.T, cl ctrlclient.Client, name, kind, source, path string, interval time.Duration) *kustomizev1.Kustomization {
	t.Helper()
	ks := &kustomizev1.Kustomization{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "flux-system"},
		Spec: kustomizev1.KustomizationSpec{
			Interval:        metav1.Duration{Duration: interval},
			Path:            path,
			Prune:           true,
			TargetNamespace: appsNamespace,
			Timeout:         &metav1.Duration{Duration: 2 * time.Minute},
			SourceRef:       kustomizev1.CrossNamespaceSourceReference{Kind: kind, Name: source},
		},
	}
	if err := cl.Create(context.Background(), ks); err != nil {
		t.Fatalf("create Kustomization %s: %v", name, err)
	}
	return ks
}

// fine is how often the waits whose duration the test reports poll.
const fine = 100 * time.Millisecond

// allOf is a check that runs checks in order and fails with the first
// that fails.
func allOf(checks ...func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		for _, c := range checks {
			if err := c(ctx); err != nil {
				return err
			}
		}
		return nil
	}
}

// applied checks that the Kustomization is Ready with *revision (read
// when the check runs) as its last applied revision.
func applied(cl ctrlclient.Client, ks *kustomizev1.Kustomization, revision *string) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := cl.Get(ctx, ctrlclient.ObjectKeyFromObject(ks), ks); err != nil {
			return err
		}
		ready := apimeta.FindStatusCondition(ks.Status.Conditions, fluxmeta.ReadyCondition)
		if ready == nil || ready.Status != metav1.ConditionTrue || ks.Status.LastAppliedRevision != *revision {
			return fmt.Errorf("Kustomization %s: last applied %q, want %q; Ready %+v", ks.Name, ks.Status.LastAppliedRevision, *revision, ready)
		}
		return nil
	}
}

// configMapIs checks that the ConfigMap name in appsNamespace holds value
// at key value; an empty value, that it is gone.
func configMapIs(name, value string) func(context.Context) error {
	if value != "" {
		return configMapKeyIs(name, "value", value)
	}
	return func(ctx context.Context) error {
		cm, err := env.C.Client.CoreV1().ConfigMaps(appsNamespace).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return fmt.Errorf("ConfigMap %s: %w", name, err)
		}
		return fmt.Errorf("ConfigMap %s not pruned: %v", name, cm.Data)
	}
}

// gitReadyAt checks that the GitRepository key is Ready with an artifact
// of commit, which it reads into gr.
func gitReadyAt(cl ctrlclient.Client, key types.NamespacedName, commit string, gr *sourcev1.GitRepository) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := isReadyAt(ctx, cl, key, commit, gr); err != nil {
			return fmt.Errorf("GitRepository %s: %w", key.Name, err)
		}
		return nil
	}
}

// testKustomizeGit: a Kustomization applies two ConfigMaps from a
// GitRepository's artifact; a commit that changes one changes it in the
// cluster, and a commit that removes the other's file prunes it.
func testKustomizeGit(t *testing.T, cl ctrlclient.Client) {
	repo, head := newRepo(t, "flux-apps", map[string]string{
		"apps/one.yaml": configMap("one", "1"),
		"apps/two.yaml": configMap("two", "1"),
	})
	// A long interval: every new commit below is fetched because the
	// test asks, as `flux reconcile source git` does.
	gitRepository(t, cl, "flux-system", "apps", "flux-apps", time.Hour)
	start := time.Now()
	ks := kustomization(t, cl, "apps-git", sourcev1.GitRepositoryKind, "apps", "./apps")
	key := types.NamespacedName{Namespace: "flux-system", Name: "apps"}
	var gr sourcev1.GitRepository
	var rev string
	revision := func(context.Context) error { rev = gr.Status.Artifact.Revision; return nil }
	kubetest.EventuallyEvery(t, 3*time.Minute, fine, "both ConfigMaps applied from the first commit", allOf(
		gitReadyAt(cl, key, head, &gr), revision, applied(cl, ks, &rev), configMapIs("one", "1"), configMapIs("two", "1")))
	t.Logf("applied: both ConfigMaps, Kustomization Ready at %s, %s after the GitRepository and the Kustomization were created",
		rev, time.Since(start).Round(10*time.Millisecond))

	if err := repo.Write(map[string]string{"apps/one.yaml": configMap("one", "2")}); err != nil {
		t.Fatal(err)
	}
	head, err := repo.Commit("one: 2")
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	requestReconcile(t, cl, &gr)
	kubetest.EventuallyEvery(t, 2*time.Minute, fine, "ConfigMap one changed by the second commit", allOf(
		gitReadyAt(cl, key, head, &gr), revision, applied(cl, ks, &rev), configMapIs("one", "2"), configMapIs("two", "1")))
	t.Logf("updated: ConfigMap one changed, Kustomization Ready at %s, %s after the reconcile request",
		rev, time.Since(start).Round(10*time.Millisecond))

	if err := repo.Git("rm", "--quiet", "apps/two.yaml"); err != nil {
		t.Fatal(err)
	}
	if head, err = repo.Commit("remove two"); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	requestReconcile(t, cl, &gr)
	kubetest.EventuallyEvery(t, 2*time.Minute, fine, "ConfigMap two pruned after the third commit", allOf(
		gitReadyAt(cl, key, head, &gr), revision, applied(cl, ks, &rev), configMapIs("two", ""), configMapIs("one", "2")))
	t.Logf("pruned: ConfigMap two deleted, Kustomization Ready at %s, %s after the reconcile request",
		rev, time.Since(start).Round(10*time.Millisecond))
}

// testKustomizeOCI: a Kustomization applies a ConfigMap from an
// OCIRepository's artifact, pushed as `flux push artifact` does to a
// registry the pods reach, and a new push to the same tag updates it.
func testKustomizeOCI(t *testing.T, cl ctrlclient.Client) {
	ctx := context.Background()
	reg, err := registry.Start(filepath.Join(t.TempDir(), "registry"), registry.Options{ListenIP: env.C.HostIP})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Stop() })
	push := func(value string) string {
		files := map[string]string{"from-oci.yaml": configMap("from-oci", value)}
		d := reg.Push(t, "apps", "stable", registry.FluxArtifact(t, files, "https://example.com/apps", "main@sha1:0123456789abcdef0123456789abcdef0123456"+value))
		return "stable@" + d.String()
	}
	want := push("1")
	oci := &sourcev1.OCIRepository{
		ObjectMeta: metav1.ObjectMeta{Name: "apps-oci", Namespace: "flux-system"},
		Spec: sourcev1.OCIRepositorySpec{
			URL: reg.URL("apps"), Insecure: true,
			Reference: &sourcev1.OCIRepositoryRef{Tag: "stable"},
			Interval:  metav1.Duration{Duration: time.Hour},
		},
	}
	if err := cl.Create(ctx, oci); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ks := kustomization(t, cl, "apps-oci", sourcev1.OCIRepositoryKind, "apps-oci", "./")
	kubetest.EventuallyEvery(t, 3*time.Minute, fine, "ConfigMap applied from the first push", allOf(
		ociReadyAt(cl, oci, &want), applied(cl, ks, &want), configMapIs("from-oci", "1")))
	t.Logf("applied: ConfigMap from-oci, Kustomization Ready at %s, %s after the OCIRepository and the Kustomization were created",
		want, time.Since(start).Round(10*time.Millisecond))

	want = push("2")
	start = time.Now()
	requestReconcile(t, cl, oci)
	kubetest.EventuallyEvery(t, 2*time.Minute, fine, "ConfigMap changed by the second push", allOf(
		ociReadyAt(cl, oci, &want), applied(cl, ks, &want), configMapIs("from-oci", "2")))
	t.Logf("updated: ConfigMap from-oci changed, Kustomization Ready at %s, %s after the reconcile request",
		want, time.Since(start).Round(10*time.Millisecond))
}

// ociReadyAt checks that the OCIRepository is Ready with an artifact of
// *revision.
func ociReadyAt(cl ctrlclient.Client, oci *sourcev1.OCIRepository, revision *string) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := cl.Get(ctx, ctrlclient.ObjectKeyFromObject(oci), oci); err != nil {
			return err
		}
		ready := apimeta.FindStatusCondition(oci.Status.Conditions, fluxmeta.ReadyCondition)
		if ready == nil || ready.Status != metav1.ConditionTrue || oci.Status.Artifact == nil || oci.Status.Artifact.Revision != *revision {
			return fmt.Errorf("OCIRepository %s: artifact %+v, want revision %s; Ready %+v", oci.Name, oci.Status.Artifact, *revision, ready)
		}
		return nil
	}
}

// testAlert: an Alert on a GitRepository delivers, through a generic
// Provider, the NewArtifact Event Headwater's watcher posts to
// notification-controller (its -events-addr in the drop-in).
func testAlert(t *testing.T, cl ctrlclient.Client) {
	ctx := context.Background()
	sink := startEventSink(t)
	provider := &notificationv1beta3.Provider{
		ObjectMeta: metav1.ObjectMeta{Name: "sink", Namespace: "flux-system"},
		Spec:       notificationv1beta3.ProviderSpec{Type: notificationv1beta3.GenericProvider, Address: sink.url},
	}
	alert := &notificationv1beta3.Alert{
		ObjectMeta: metav1.ObjectMeta{Name: "sources", Namespace: "flux-system"},
		Spec: notificationv1beta3.AlertSpec{
			ProviderRef:   fluxmeta.LocalObjectReference{Name: "sink"},
			EventSeverity: "info",
			EventSources:  []notificationv1.CrossNamespaceObjectReference{{Kind: sourcev1.GitRepositoryKind, Name: "notified"}},
		},
	}
	for _, o := range []ctrlclient.Object{alert, provider} {
		if err := cl.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// Alerts have no status: the Provider's finalizer, made after the
	// Alert, says notification-controller's caches have both, so the
	// Event below is not matched against a cache without the Alert.
	kubetest.Eventually(t, time.Minute, "notification-controller's finalizer on the Provider", func(ctx context.Context) error {
		if err := cl.Get(ctx, ctrlclient.ObjectKeyFromObject(provider), provider); err != nil {
			return err
		}
		if !slices.Contains(provider.Finalizers, notificationv1.NotificationFinalizer) {
			return fmt.Errorf("finalizers %v", provider.Finalizers)
		}
		return nil
	})
	_, head := newRepo(t, "flux-notified", map[string]string{"app.yaml": "notified\n"})
	start := time.Now()
	gitRepository(t, cl, "flux-system", "notified", "flux-notified", time.Hour)
	ev := sink.wait(t, 3*time.Minute, func(e eventv1.Event) bool {
		return e.InvolvedObject.Kind == sourcev1.GitRepositoryKind && e.InvolvedObject.Name == "notified" && e.Reason == "NewArtifact"
	})
	took := time.Since(start)
	gr := readyAt(t, cl, "flux-system", "notified", head, time.Minute)
	// notification-controller passes the metadata keys of the object's
	// API group on without the group (Flux's RFC 0008).
	if got := ev.Metadata[eventv1.MetaRevisionKey]; got != gr.Status.Artifact.Revision {
		t.Errorf("delivered Event's metadata %v: revision %q, want the artifact's %q", ev.Metadata, got, gr.Status.Artifact.Revision)
	}
	if ev.Severity != eventv1.EventSeverityInfo || ev.ReportingController != "source-controller" {
		t.Errorf("delivered Event: severity %q, reporting controller %q; want info from source-controller", ev.Severity, ev.ReportingController)
	}
	t.Logf("delivered: %s %s %q (revision %s) at the generic Provider %s after the GitRepository was created",
		ev.Severity, ev.Reason, ev.Message, gr.Status.Artifact.Revision, took.Round(10*time.Millisecond))
}

// eventSink is the address of a generic Provider: it keeps the Flux
// Events posted to it. It listens on the node's link, which pods reach.
type eventSink struct {
	url    string
	mu     sync.Mutex
	events []eventv1.Event
	bad    []string
}

func startEventSink(t *testing.T) *eventSink {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(env.C.HostIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	s := &eventSink{url: "http://" + ln.Addr().String() + "/"}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

func (s *eventSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(r.Body)
	var e eventv1.Event
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := json.Unmarshal(buf.Bytes(), &e); err != nil {
		s.bad = append(s.bad, fmt.Sprintf("%s: %v", buf.String(), err))
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.events = append(s.events, e)
}

// wait returns the first Event posted that match accepts, failing t
// after timeout with what was posted.
func (s *eventSink) wait(t *testing.T, timeout time.Duration, match func(eventv1.Event) bool) eventv1.Event {
	t.Helper()
	var found eventv1.Event
	kubetest.EventuallyEvery(t, timeout, fine, "an Event delivered to the generic Provider", func(context.Context) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		var seen []string
		for _, e := range s.events {
			if match(e) {
				found = e
				return nil
			}
			seen = append(seen, e.InvolvedObject.Kind+"/"+e.InvolvedObject.Name+" "+e.Reason)
		}
		return fmt.Errorf("posted: %v; undecodable: %v", seen, s.bad)
	})
	return found
}

// testReceiver: a generic Receiver's webhook, called through
// notification-controller's Service, makes it annotate the GitRepository,
// and Headwater fetches the new commit at once, not at the source's hour
// interval.
func testReceiver(t *testing.T, cl ctrlclient.Client) {
	ctx := context.Background()
	repo, head := newRepo(t, "flux-hooked", map[string]string{"app.yaml": "hooked 1\n"})
	gitRepository(t, cl, "flux-system", "hooked", "flux-hooked", time.Hour)
	readyAt(t, cl, "flux-system", "hooked", head, 3*time.Minute)

	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "webhook-token", Namespace: "flux-system"},
		StringData: map[string]string{"token": randomText(24)},
	}
	rcv := &notificationv1.Receiver{
		ObjectMeta: metav1.ObjectMeta{Name: "hooked", Namespace: "flux-system"},
		Spec: notificationv1.ReceiverSpec{
			Type: notificationv1.GenericReceiver,
			Resources: []notificationv1.ReceiverResource{{CrossNamespaceObjectReference: notificationv1.CrossNamespaceObjectReference{
				APIVersion: sourcev1.GroupVersion.String(), Kind: sourcev1.GitRepositoryKind, Name: "hooked",
			}}},
			SecretRef: &fluxmeta.LocalObjectReference{Name: secret.Name},
		},
	}
	for _, o := range []ctrlclient.Object{secret, rcv} {
		if err := cl.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	kubetest.Eventually(t, 2*time.Minute, "Receiver Ready with a webhook path", func(ctx context.Context) error {
		if err := cl.Get(ctx, ctrlclient.ObjectKeyFromObject(rcv), rcv); err != nil {
			return err
		}
		ready := apimeta.FindStatusCondition(rcv.Status.Conditions, fluxmeta.ReadyCondition)
		if ready == nil || ready.Status != metav1.ConditionTrue || rcv.Status.WebhookPath == "" {
			return fmt.Errorf("Ready %+v, path %q", ready, rcv.Status.WebhookPath)
		}
		return nil
	})
	svc, err := env.C.ServiceURL(ctx, "flux-system", "webhook-receiver", "")
	if err != nil {
		t.Fatal(err)
	}

	if err := repo.Write(map[string]string{"app.yaml": "hooked 2\n"}); err != nil {
		t.Fatal(err)
	}
	if head, err = repo.Commit("hooked 2"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	kubetest.Eventually(t, time.Minute, "POST "+rcv.Status.WebhookPath+" answered 200", func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, svc+rcv.Status.WebhookPath, strings.NewReader(`{}`))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := env.C.HTTPClient().Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s", resp.Status)
		}
		return nil
	})
	var gr sourcev1.GitRepository
	kubetest.EventuallyEvery(t, time.Minute, fine, "the new commit fetched after the webhook",
		gitReadyAt(cl, types.NamespacedName{Namespace: "flux-system", Name: "hooked"}, head, &gr))
	took := time.Since(start)
	requested := gr.GetAnnotations()[fluxmeta.ReconcileRequestAnnotation]
	if requested == "" || gr.Status.LastHandledReconcileAt != requested {
		t.Errorf("GitRepository annotated %s=%q by notification-controller, last handled %q: want the two equal",
			fluxmeta.ReconcileRequestAnnotation, requested, gr.Status.LastHandledReconcileAt)
	}
	t.Logf("webhook: GitRepository Ready at %s %s after POST %s (interval 1h)",
		gr.Status.Artifact.Revision, took.Round(10*time.Millisecond), rcv.Status.WebhookPath)
}
