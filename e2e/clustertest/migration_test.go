package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	kustomizev1 "github.com/fluxcd/kustomize-controller/api/v1"
	fluxmeta "github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// TestFluxMigration switches a cluster from Flux's own source-controller
// to Headwater as docs/migrate-from-flux.md says ("With flux install or by
// hand"), and back, while Flux's kustomize-controller applies a
// GitRepository's artifact: Flux's source-controller v1.9.1, kustomize-
// and notification-controller run as `flux install` runs them, a
// Kustomization applies two ConfigMaps, then
//   - to Headwater: source-controller scaled to 0,
//     deploy/overlays/flux-system applied (which takes Flux's Service
//     source-controller over);
//   - back: the overlay but its Service deleted, source-controller's
//     Deployment and Service applied again.
//
// The Service stays the same object with the same cluster IP throughout:
// the consumers' cluster DNS answers (cached for up to 30 s) stay right.
//
// Each way the artifact is rebuilt under the same URL at the same
// revision and served by the new controller; the Kustomization is not
// reconciled (its history's count), never leaves Ready=True (a watch),
// keeps its last applied revision and changes no object it applied (their
// resourceVersions); and a commit made after the switch is fetched and
// applied. Headwater never empties status.artifact while it rebuilds the
// artifact and records a Warning ArtifactMissing; Flux's source-controller
// empties it for a moment, which kustomize-controller ignores.
func TestFluxMigration(t *testing.T) {
	requireFull(t)
	manifest := fluxSourceControllerManifest()
	m := fromFlux(t, func() { env.Kubectl(t, "apply", "-f", manifest) }, func() { removeDropIn(t) })
	m.switchTo("Headwater", func() {
		env.Kubectl(t, "-n", "flux-system", "scale", "deployment/source-controller", "--replicas=0")
		m.waitGone("app=source-controller")
		// kubectl apply takes Flux's Service over: the same object, the
		// same cluster IP, which the consumers' DNS answers still name.
		env.Kubectl(t, "apply", "-k", env.DeployPath("overlays/flux-system"))
		waitPodsReady(t, 8*time.Minute)
	}, m.rebuiltByHeadwater)
	m.newCommit("Headwater", "2")

	m.switchTo("Flux's source-controller", func() {
		// Everything of the overlay but the Service, which Flux's
		// manifest takes back.
		env.Kubectl(t, "delete", "-k", withoutService(t), "--wait=true", "--timeout=5m")
		m.waitGone("app.kubernetes.io/part-of=headwater")
		env.Kubectl(t, "apply", "-f", manifest)
		m.waitFluxRollout()
	}, m.rebuiltByFlux)
	m.newCommit("Flux's source-controller", "3")
}

// fluxSourceControllerManifest is Flux's source-controller as `flux
// install` lays it out.
func fluxSourceControllerManifest() string {
	return filepath.Join(env.Deploy, "..", "e2e", "cluster", "manifests", "flux-source-controller.yaml")
}

// fromFlux makes what every switch starts from: Flux's CRDs and
// kustomize- and notification-controller, Flux's source-controller
// installed by installFlux (and removed at the end with the manifest),
// and a Kustomization that has applied two ConfigMaps from a
// GitRepository's artifact served by Flux. removeHeadwater removes
// Headwater at the end, if the test stopped while it ran.
func fromFlux(t *testing.T, installFlux, removeHeadwater func()) *migration {
	t.Helper()
	fluxInstalled(t)
	t.Cleanup(func() { removeNamespace(t, "flux-system") })
	fluxControllers(t)
	ctx := context.Background()
	manifest := fluxSourceControllerManifest()
	checkImages(t, manifest)
	start := time.Now()
	installFlux()
	t.Cleanup(func() {
		if out, err := env.C.Kubectl(context.Background(), "delete", "-f", manifest, "--ignore-not-found", "--wait=true", "--timeout=3m").Run(); err != nil {
			t.Errorf("delete Flux's source-controller: %v\n%s", err, out)
		}
	})
	if err := env.C.WaitRollout(ctx, "flux-system", "deployment/source-controller", 5*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, env.Diagnose(ns))
	}
	t.Logf("Flux's source-controller Ready in %s", time.Since(start).Round(100*time.Millisecond))
	cl := fluxClient(t)
	wcl, err := ctrlclient.NewWithWatch(env.C.Config, ctrlclient.Options{Scheme: fluxScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Kustomizations first, while kustomize-controller runs to prune
		// and remove its finalizer; then the sources, whichever
		// controller is left; then Headwater, if the test stopped on it.
		deleteFluxObjects(t)
		dropSources(t)
		removeHeadwater()
	})
	t.Cleanup(func() { fluxLogsOnFailure(t) })
	env.EnsureNamespace(t, appsNamespace)
	t.Cleanup(func() {
		_ = env.C.Client.CoreV1().Namespaces().Delete(context.Background(), appsNamespace, metav1.DeleteOptions{})
	})

	// Flux alone: a GitRepository and a Kustomization of it, both with an
	// hour's interval, so that nothing but the switch and the test's
	// reconcile requests makes either controller work.
	// A repository of the test's own on the shared git server; the
	// GitRepository is "migrate" in every test.
	repoName := "migrate-" + strings.ToLower(t.Name())
	repo, head := newRepo(t, repoName, map[string]string{
		"apps/one.yaml": configMap("one", "1"),
		"apps/two.yaml": configMap("two", "1"),
	})
	gitRepository(t, cl, "flux-system", "migrate", repoName, time.Hour)
	start = time.Now()
	ks := kustomizationEvery(t, cl, "migrate", sourcev1.GitRepositoryKind, "migrate", "./apps", time.Hour)
	key := types.NamespacedName{Namespace: "flux-system", Name: "migrate"}
	var gr sourcev1.GitRepository
	var rev string
	revision := func(context.Context) error { rev = gr.Status.Artifact.Revision; return nil }
	kubetest.EventuallyEvery(t, 3*time.Minute, fine, "both ConfigMaps applied from Flux's artifact", allOf(
		gitReadyAt(cl, key, head, &gr), revision, applied(cl, ks, &rev), configMapIs("one", "1"), configMapIs("two", "1")))
	t.Logf("Flux: both ConfigMaps applied, Kustomization Ready at %s, %s after it was created; artifact %s %s",
		rev, time.Since(start).Round(10*time.Millisecond), gr.Status.Artifact.URL, gr.Status.Artifact.Digest)
	return &migration{t: t, cl: cl, wcl: wcl, key: key, ks: ks, repo: repo, serviceIP: serviceIP(t)}
}

// removeDropIn deletes deploy/overlays/flux-system, whatever of it is
// there: the cleanup of a test that may stop while Headwater serves.
func removeDropIn(t *testing.T) {
	t.Helper()
	if out, err := env.C.Kubectl(context.Background(), "delete", "-k", env.DeployPath("overlays/flux-system"), "--ignore-not-found", "--wait=true", "--timeout=5m").Run(); err != nil {
		t.Errorf("delete the overlay: %v\n%s", err, out)
	}
}

// rebuiltByHeadwater checks a switch to Headwater: it keeps the artifact
// in status while it rebuilds it, and says so with an Event.
func (m *migration) rebuiltByHeadwater(s *switchSeen) {
	t := m.t
	t.Helper()
	if s.artifactCleared {
		t.Error("Headwater emptied status.artifact during the switch")
	}
	missing := events(t, "flux-system", m.key.Name, "ArtifactMissing")
	if len(missing) == 0 {
		t.Error("no Warning ArtifactMissing Event on the GitRepository: docs/migrate-from-flux.md says Headwater records one as it rebuilds Flux's artifact")
	} else {
		t.Logf("Event %s %s: %s", missing[0].Type, missing[0].Reason, missing[0].Message)
	}
}

// rebuiltByFlux notes how Flux's source-controller rebuilt the artifact:
// it finds the artifact of the status missing from its (empty) storage
// and empties status.artifact before it rebuilds it (its
// reconcileStorage), which kustomize-controller ignores (it reconciles a
// Kustomization only for a revision it has not applied).
func (m *migration) rebuiltByFlux(s *switchSeen) {
	if s.artifactCleared {
		m.t.Logf("  Flux's source-controller emptied status.artifact while it rebuilt the artifact, as it does")
	}
}

// waitFluxRollout waits until Flux's source-controller is rolled out.
func (m *migration) waitFluxRollout() {
	m.t.Helper()
	if err := env.C.WaitRollout(context.Background(), "flux-system", "deployment/source-controller", 5*time.Minute); err != nil {
		m.t.Fatalf("%v\n%s", err, env.Diagnose(ns))
	}
}

// migration is the state TestFluxMigration carries from one switch to the
// next.
type migration struct {
	t    *testing.T
	cl   ctrlclient.Client
	wcl  ctrlclient.WithWatch
	key  types.NamespacedName
	ks   *kustomizev1.Kustomization
	repo *gitserver.Repo
	// serviceIP is the cluster IP of the Service source-controller
	// before the first switch.
	serviceIP string
}

// serviceIP is the cluster IP of the Service source-controller in
// flux-system.
func serviceIP(t *testing.T) string {
	t.Helper()
	svc, err := env.C.Client.CoreV1().Services("flux-system").Get(context.Background(), "source-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// withoutService is a kustomization of the test's own: the flux-system
// overlay without its Service source-controller, what a user deletes to
// switch back while the Service keeps its address (docs/migrate-from-flux.md).
func withoutService(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	overlay, err := filepath.Rel(dir, env.DeployPath("overlays/flux-system"))
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [%q]
patches:
  - target: {kind: Service, name: source-controller}
    patch: |
      $patch: delete
      apiVersion: v1
      kind: Service
      metadata:
        name: source-controller
`, overlay)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// applyState is what must not change across a switch: the source's
// artifact revision and URL, and what kustomize-controller applied.
type applyState struct {
	artifact     fluxmeta.Artifact
	lastApplied  string
	reconciles   int64
	resourceVers map[string]string
}

// state reads the source, the Kustomization and the ConfigMaps it applied.
func (m *migration) state(ctx context.Context) (applyState, error) {
	var s applyState
	var gr sourcev1.GitRepository
	if err := m.cl.Get(ctx, m.key, &gr); err != nil {
		return s, err
	}
	if gr.Status.Artifact == nil {
		return s, fmt.Errorf("GitRepository %s has no artifact", m.key)
	}
	s.artifact = *gr.Status.Artifact
	var ks kustomizev1.Kustomization
	if err := m.cl.Get(ctx, ctrlclient.ObjectKeyFromObject(m.ks), &ks); err != nil {
		return s, err
	}
	s.lastApplied = ks.Status.LastAppliedRevision
	s.reconciles = totalReconciliations(&ks)
	s.resourceVers = map[string]string{}
	if ks.Status.Inventory == nil {
		return s, fmt.Errorf("Kustomization %s has no inventory", ks.Name)
	}
	for _, e := range ks.Status.Inventory.Entries {
		// <namespace>_<name>_<group>_<kind>
		parts := strings.Split(e.ID, "_")
		if len(parts) != 4 || parts[3] != "ConfigMap" {
			continue
		}
		cm, err := env.C.Client.CoreV1().ConfigMaps(parts[0]).Get(ctx, parts[1], metav1.GetOptions{})
		if err != nil {
			return s, err
		}
		s.resourceVers[parts[1]] = cm.ResourceVersion
	}
	return s, nil
}

// totalReconciliations counts the reconciles kustomize-controller has
// recorded in the Kustomization's history: one for each that reached the
// apply.
func totalReconciliations(ks *kustomizev1.Kustomization) int64 {
	var n int64
	for _, h := range ks.Status.History {
		n += h.TotalReconciliations
	}
	return n
}

// switchSeen is what the watches saw during one switch.
type switchSeen struct {
	mu sync.Mutex
	// sourceChanges are the GitRepository's status writes, as
	// "time Ready=<status> <reason> artifact=<revision digest | none>".
	sourceChanges []string
	// artifactCleared is whether status.artifact was ever empty.
	artifactCleared bool
	// kustomizationNotReady are the moments the Kustomization's Ready was
	// not True.
	kustomizationNotReady []string
	// kustomizationReconciles counts the reconciles kustomize-controller
	// recorded in the history.
	kustomizationReconciles int64
	// served are the changes in what the artifact URL answered, as
	// "time digest" or "time error".
	served []string
	// unavailableFrom and availableAt bound the time the URL did not
	// answer with the artifact of the status.
	unavailableFrom, availableAt time.Time
}

// switchTo runs do (a switch of controllers) while it watches the
// GitRepository and the Kustomization and downloads the artifact from the
// Service source-controller, waits until the artifact is served again at
// the same revision and URL, and checks what must hold whichever way the
// switch goes; check adds the direction's own checks.
func (m *migration) switchTo(to string, do func(), check func(*switchSeen)) {
	t := m.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	before, err := m.state(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	seen := &switchSeen{}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); m.watchSource(ctx, seen) }()
	go func() { defer wg.Done(); m.watchKustomization(ctx, seen) }()
	go func() { defer wg.Done(); m.probeArtifact(ctx, before.artifact, seen) }()
	stop := func() { cancel(); wg.Wait() }
	defer stop()

	start := time.Now()
	do()
	switched := time.Since(start)
	var gr sourcev1.GitRepository
	kubetest.EventuallyEvery(t, 5*time.Minute, fine, "the artifact served again at the same revision after the switch to "+to, func(ctx context.Context) error {
		if err := isReadyAt(ctx, m.cl, m.key, commitOfRevision(before.artifact.Revision), &gr); err != nil {
			return err
		}
		// As the probe: a connection hung by the switch is an answer
		// after 2 s, not after the HTTP client's 30.
		fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		d, err := fetchArtifact(fctx, gr.Status.Artifact)
		if err != nil {
			return err
		}
		if d != gr.Status.Artifact.Digest {
			return fmt.Errorf("the URL serves %s, the status says %s", d, gr.Status.Artifact.Digest)
		}
		return nil
	})
	rebuilt := time.Since(start)
	servedAt := time.Now()
	stop()
	if seen.availableAt.IsZero() {
		// The wait saw the artifact before the probe's next download.
		seen.availableAt = servedAt
	}
	after, err := m.state(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	seen.kustomizationReconciles = after.reconciles - before.reconciles

	t.Logf("switch to %s: done in %s; the artifact served again, by %s, %s after the switch began", to, switched.Round(100*time.Millisecond), to, rebuilt.Round(100*time.Millisecond))
	if seen.unavailableFrom.IsZero() {
		t.Logf("  the artifact's URL never failed to answer")
	} else {
		t.Logf("  the artifact's URL answered no artifact for %s (%s)", seen.availableAt.Sub(seen.unavailableFrom).Round(100*time.Millisecond), strings.Join(seen.served, "; "))
	}
	if ip := serviceIP(t); ip != m.serviceIP {
		t.Errorf("the Service source-controller's cluster IP went from %s to %s: the consumers' cluster DNS answers name the old one for up to its TTL", m.serviceIP, ip)
	}
	t.Logf("  artifact before %s %s, after %s %s (digest %s)", before.artifact.Revision, before.artifact.Digest, after.artifact.Revision, after.artifact.Digest,
		map[bool]string{true: "the same", false: "differs: another archive of the same tree"}[before.artifact.Digest == after.artifact.Digest])
	t.Logf("  GitRepository status writes: %s", strings.Join(seen.sourceChanges, "; "))
	t.Logf("  Kustomization: reconciled %d times, not Ready at %v; last applied %s -> %s; ConfigMaps' resourceVersions %v -> %v",
		seen.kustomizationReconciles, seen.kustomizationNotReady, before.lastApplied, after.lastApplied, before.resourceVers, after.resourceVers)

	if after.artifact.URL != before.artifact.URL || after.artifact.Revision != before.artifact.Revision {
		t.Errorf("artifact %s at %s after the switch, want %s at %s", after.artifact.Revision, after.artifact.URL, before.artifact.Revision, before.artifact.URL)
	}
	// The same revision at the same URL gives kustomize-controller no
	// reason to reconcile: nothing is re-applied.
	if seen.kustomizationReconciles != 0 || len(seen.kustomizationNotReady) > 0 {
		t.Errorf("the Kustomization was reconciled %d times during the switch to %s (not Ready: %v); a rebuild of the same revision should trigger nothing",
			seen.kustomizationReconciles, to, seen.kustomizationNotReady)
	}
	if after.lastApplied != before.lastApplied {
		t.Errorf("the Kustomization's last applied revision went from %s to %s", before.lastApplied, after.lastApplied)
	}
	if len(after.resourceVers) != len(before.resourceVers) || len(before.resourceVers) == 0 {
		t.Errorf("the Kustomization's ConfigMaps were %v before the switch, %v after", before.resourceVers, after.resourceVers)
	}
	for name, rv := range before.resourceVers {
		if after.resourceVers[name] != rv {
			t.Errorf("ConfigMap %s changed during the switch (resourceVersion %s -> %s): re-applied", name, rv, after.resourceVers[name])
		}
	}
	check(seen)
	out := download(t, gr.Status.Artifact.URL, gr.Status.Artifact.Digest)
	t.Logf("  downloaded from a pod through the cluster's DNS: %s", strings.TrimSpace(out))
	noRestarts(t, "the switch to "+to)
}

// newCommit commits a new value of ConfigMap one, asks for a reconcile
// of the source, as `flux reconcile source git` does, and waits until the
// Kustomization applied it.
func (m *migration) newCommit(by, value string) {
	t := m.t
	t.Helper()
	if err := m.repo.Write(map[string]string{"apps/one.yaml": configMap("one", value)}); err != nil {
		t.Fatal(err)
	}
	head, err := m.repo.Commit("one: " + value)
	if err != nil {
		t.Fatal(err)
	}
	var gr sourcev1.GitRepository
	if err := m.cl.Get(context.Background(), m.key, &gr); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	requestReconcile(t, m.cl, &gr)
	var rev string
	revision := func(context.Context) error { rev = gr.Status.Artifact.Revision; return nil }
	kubetest.EventuallyEvery(t, 3*time.Minute, fine, "a new commit applied from "+by+"'s artifact", allOf(
		gitReadyAt(m.cl, m.key, head, &gr), revision, applied(m.cl, m.ks, &rev), configMapIs("one", value), configMapIs("two", "1")))
	t.Logf("%s: a new commit fetched and applied (Kustomization Ready at %s) %s after the reconcile request",
		by, rev, time.Since(start).Round(10*time.Millisecond))
}

// waitGone waits until no pod of flux-system matches selector.
func (m *migration) waitGone(selector string) {
	m.t.Helper()
	kubetest.Eventually(m.t, 3*time.Minute, "pods "+selector+" gone", func(ctx context.Context) error {
		list, err := env.C.Client.CoreV1().Pods("flux-system").List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d left, such as %s", len(list.Items), list.Items[0].Name)
		}
		return nil
	})
}

// watchSource records every status the GitRepository is written with
// until ctx ends.
func (m *migration) watchSource(ctx context.Context, seen *switchSeen) {
	m.watch(ctx, &sourcev1.GitRepositoryList{}, func(obj any) {
		gr, ok := obj.(*sourcev1.GitRepository)
		if !ok {
			return
		}
		ready := apimeta.FindStatusCondition(gr.Status.Conditions, fluxmeta.ReadyCondition)
		s := time.Now().Format("15:04:05.000") + " Ready="
		if ready != nil {
			s += string(ready.Status) + " " + ready.Reason
		}
		if gr.Status.Artifact == nil {
			s += " artifact=none"
		} else {
			s += " artifact=" + gr.Status.Artifact.Revision + " " + gr.Status.Artifact.Digest
		}
		seen.mu.Lock()
		defer seen.mu.Unlock()
		if gr.Status.Artifact == nil {
			seen.artifactCleared = true
		}
		seen.sourceChanges = append(seen.sourceChanges, s)
	})
}

// watchKustomization records every moment the Kustomization was not
// Ready until ctx ends.
func (m *migration) watchKustomization(ctx context.Context, seen *switchSeen) {
	m.watch(ctx, &kustomizev1.KustomizationList{}, func(obj any) {
		ks, ok := obj.(*kustomizev1.Kustomization)
		if !ok {
			return
		}
		ready := apimeta.FindStatusCondition(ks.Status.Conditions, fluxmeta.ReadyCondition)
		if ready != nil && ready.Status == metav1.ConditionTrue {
			return
		}
		s := fmt.Sprintf("%s %+v", time.Now().Format("15:04:05.000"), ready)
		if ready != nil {
			s = fmt.Sprintf("%s %s %s: %s", time.Now().Format("15:04:05.000"), ready.Status, ready.Reason, ready.Message)
		}
		seen.mu.Lock()
		defer seen.mu.Unlock()
		seen.kustomizationNotReady = append(seen.kustomizationNotReady, s)
	})
}

// watch calls seen with every object of list's kind named m.key.Name
// (the GitRepository's name, which the Kustomization shares) in
// flux-system, as the API server sends it, until ctx ends; a watch the
// server ends is started again.
func (m *migration) watch(ctx context.Context, list ctrlclient.ObjectList, seen func(any)) {
	for ctx.Err() == nil {
		w, err := m.wcl.Watch(ctx, list, ctrlclient.InNamespace(m.key.Namespace), ctrlclient.MatchingFields{"metadata.name": m.key.Name})
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Added || ev.Type == watch.Modified {
				seen(ev.Object)
			}
		}
		w.Stop()
	}
}

// probeArtifact downloads the artifact by its URL's path from the Service
// source-controller every 100 ms until ctx ends, and records when the
// answer changes and how long no artifact was served.
func (m *migration) probeArtifact(ctx context.Context, a fluxmeta.Artifact, seen *switchSeen) {
	last := a.Digest
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		// A Service deleted under a connection attempt leaves it
		// hanging: 2 s is an answer.
		fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		d, err := fetchArtifact(fctx, &a)
		cancel()
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		answer := d
		if err != nil {
			answer = "error " + err.Error()
		}
		seen.mu.Lock()
		if answer != last {
			seen.served = append(seen.served, now.Format("15:04:05.000")+" "+answer)
			last = answer
		}
		switch {
		case err != nil && seen.unavailableFrom.IsZero():
			seen.unavailableFrom = now
		case err == nil && !seen.unavailableFrom.IsZero() && seen.availableAt.IsZero():
			seen.availableAt = now
		}
		seen.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
