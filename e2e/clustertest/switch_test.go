package clustertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	kustomizev1 "github.com/fluxcd/kustomize-controller/api/v1"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/storage/driver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// TestFluxHelmSwitch switches from Flux's source-controller to Headwater's
// chart in drop-in mode and back, as docs/migrate-from-flux.md says for
// Helm users, with the checks of TestFluxMigration each way (the artifact
// rebuilt under the same URL, the Service's cluster IP kept, nothing
// re-applied, a new commit applied after each switch):
//   - to Headwater: Flux's source-controller scaled to 0, its Service
//     marked for adoption by the release, `helm install headwater
//     charts/headwater -n flux-system --set fluxDropIn.enabled=true`;
//   - back: `helm uninstall` (the Service stays: the drop-in's template
//     says helm.sh/resource-policy: keep), Flux's manifest applied again
//     server-side, as `flux install` does, which gives the Service Flux's
//     selector back.
func TestFluxHelmSwitch(t *testing.T) {
	requireFull(t)
	manifest := fluxSourceControllerManifest()
	h := newHelm(t, "flux-system")
	m := fromFlux(t, func() { env.Kubectl(t, "apply", "-f", manifest) }, func() {
		if _, err := action.NewStatus(h.cfg).Run(release); err == nil {
			u := action.NewUninstall(h.cfg)
			u.Wait = true
			u.Timeout = 5 * time.Minute
			if _, err := u.Run(release); err != nil {
				t.Errorf("cleanup: helm uninstall: %v", err)
			}
		}
	})
	chrt, err := loader.Load(filepath.Join(env.Deploy, "..", "charts", "headwater"))
	if err != nil {
		t.Fatal(err)
	}

	m.switchTo("Headwater (helm install)", func() {
		env.Kubectl(t, "-n", "flux-system", "scale", "deployment/source-controller", "--replicas=0")
		m.waitGone("app=source-controller")
		// Helm installs over an object only when it carries the
		// release's marks: the release adopts Flux's Service, the same
		// object with the same cluster IP.
		env.Kubectl(t, "-n", "flux-system", "annotate", "service", "source-controller",
			"meta.helm.sh/release-name="+release, "meta.helm.sh/release-namespace=flux-system")
		env.Kubectl(t, "-n", "flux-system", "label", "service", "source-controller", "app.kubernetes.io/managed-by=Helm")
		install := action.NewInstall(h.cfg)
		install.ReleaseName = release
		install.Namespace = "flux-system"
		install.Wait = true
		install.WaitForJobs = true
		install.Timeout = 8 * time.Minute
		start := time.Now()
		rel, err := install.RunWithContext(context.Background(), chrt, env.WithTestServers(map[string]any{"fluxDropIn": map[string]any{"enabled": true}}))
		if err != nil {
			t.Fatalf("helm install -n flux-system --set fluxDropIn.enabled=true: %v\n%s", err, env.Diagnose(ns))
		}
		waitPodsReady(t, 2*time.Minute)
		t.Logf("helm install: release %s revision %d %s, every pod Ready %s after the install began", rel.Name, rel.Version, rel.Info.Status,
			time.Since(start).Round(100*time.Millisecond))
		t.Logf("  the Service source-controller selects %v", serviceSelector(t))
	}, m.rebuiltByHeadwater)
	m.newCommit("Headwater", "2")

	m.switchTo("Flux's source-controller (helm uninstall)", func() {
		// The Service outlives the release (the drop-in's template says
		// helm.sh/resource-policy: keep), so it keeps its cluster IP.
		u := action.NewUninstall(h.cfg)
		u.Wait = true
		u.Timeout = 5 * time.Minute
		if _, err := u.Run(release); err != nil {
			t.Fatalf("helm uninstall: %v", err)
		}
		if _, err := action.NewStatus(h.cfg).Run(release); !errors.Is(err, driver.ErrReleaseNotFound) {
			t.Errorf("helm status after the uninstall: %v, want %v", err, driver.ErrReleaseNotFound)
		}
		m.waitGone("app.kubernetes.io/part-of=headwater")
		// Server-side, as `flux install` applies: the Service's selector
		// is an atomic map, so the forced apply sets Flux's alone (a
		// client-side apply would keep the key Helm's adoption added,
		// which Flux's pods lack).
		env.Kubectl(t, "apply", "--server-side", "--force-conflicts", "-f", manifest)
		m.waitFluxRollout()
		fluxSelector(t)
	}, m.rebuiltByFlux)
	m.newCommit("Flux's source-controller", "3")
}

// TestFluxBootstrapSwitch switches from Flux's source-controller to
// Headwater and back the way docs/migrate-from-flux.md says for `flux
// bootstrap` users, whose Flux is applied from Git by Flux itself: a
// fleet repository holds clusters/test/flux-system (Flux's
// source-controller as gotk-components.yaml, and gotk-sync.yaml: the
// GitRepository and the Kustomization flux-system of the fleet), applied
// once by hand as `flux bootstrap` does, then by kustomize-controller from
// the GitRepository flux-system.
//   - to Headwater: one commit patches Flux's source-controller to 0
//     replicas, deletes its Service from the build and adds Headwater's
//     flux-system overlay, rendered, under clusters/test/headwater;
//   - back: one commit reverts it, fetched and served by Headwater itself.
//
// The checks of TestFluxMigration hold each way, and the Kustomization
// flux-system applies both commits.
//
// gotk-components.yaml holds Flux's source-controller alone: kustomize-
// and notification-controller are installed beside it, as in the other
// tests, since the switch does not touch them.
func TestFluxBootstrapSwitch(t *testing.T) {
	requireFull(t)
	var fleet *gitserver.Repo
	m := fromFlux(t, func() {
		fleet = bootstrapFleet(t)
		env.Kubectl(t, "apply", "-k", filepath.Join(fleet.Dir, "clusters", "test", "flux-system"))
	}, func() { removeDropIn(t) })
	ctx := context.Background()
	// Deleting the Kustomization flux-system at the end must not prune
	// what it applied (Flux itself, or Headwater): the cleanups remove
	// those, as for the other tests.
	t.Cleanup(func() {
		if out, err := env.C.Kubectl(ctx, "-n", "flux-system", "patch", "kustomization", "flux-system", "--type=merge", "-p", `{"spec":{"prune":false}}`).Run(); err != nil {
			t.Logf("cleanup: keep what the Kustomization flux-system applied: %v\n%s", err, out)
		}
	})
	gitops := fleetSync{t: t, cl: m.cl, repo: fleet}
	gitops.applied("flux bootstrap")

	rendered, err := env.C.Kubectl(ctx, "kustomize", env.DeployPath("overlays/flux-system")).Run()
	if err != nil || !strings.HasPrefix(rendered, "apiVersion: ") {
		t.Fatalf("kubectl kustomize deploy/overlays/flux-system: %v\n%s", err, rendered)
	}
	m.switchTo("Headwater (a commit to the fleet)", func() {
		gitops.commit("switch to Headwater", map[string]string{
			"clusters/test/flux-system/kustomization.yaml": fleetKustomization(true),
			"clusters/test/headwater/headwater.yaml":       rendered,
		}, nil)
		// Flux's pods; the drop-in's artifact-servers carry
		// app=source-controller too.
		m.waitGone("app=source-controller,!app.kubernetes.io/part-of")
		waitPodsReady(t, 8*time.Minute)
		t.Logf("  the Service source-controller selects %v", serviceSelector(t))
	}, m.rebuiltByHeadwater)
	m.newCommit("Headwater", "2")

	m.switchTo("Flux's source-controller (a commit to the fleet)", func() {
		// Headwater fetches and serves the commit that removes it.
		gitops.commit("switch back to Flux's source-controller", map[string]string{
			"clusters/test/flux-system/kustomization.yaml": fleetKustomization(false),
		}, []string{"clusters/test/headwater/headwater.yaml"})
		m.waitGone("app.kubernetes.io/part-of=headwater")
		m.waitFluxRollout()
		fluxSelector(t)
	}, m.rebuiltByFlux)
	m.newCommit("Flux's source-controller", "3")
}

// bootstrapFleet makes the fleet repository `flux bootstrap` would push
// for the cluster test, on the test's git server.
func bootstrapFleet(t *testing.T) *gitserver.Repo {
	t.Helper()
	components, err := os.ReadFile(fluxSourceControllerManifest())
	if err != nil {
		t.Fatal(err)
	}
	sync := fmt.Sprintf(`apiVersion: source.toolkit.fluxcd.io/v1
kind: GitRepository
metadata:
  name: flux-system
  namespace: flux-system
spec:
  interval: 1h
  ref:
    branch: main
  url: %s
---
apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata:
  name: flux-system
  namespace: flux-system
spec:
  interval: 1h
  path: ./clusters/test
  prune: true
  sourceRef:
    kind: GitRepository
    name: flux-system
`, env.Git.RepoURL("fleet"))
	repo, _ := newRepo(t, "fleet", map[string]string{
		"clusters/test/flux-system/gotk-components.yaml": string(components),
		"clusters/test/flux-system/gotk-sync.yaml":       sync,
		"clusters/test/flux-system/kustomization.yaml":   fleetKustomization(false),
	})
	return repo
}

// fleetKustomization is clusters/test/flux-system/kustomization.yaml;
// toHeadwater adds the patches docs/migrate-from-flux.md gives.
func fleetKustomization(toHeadwater bool) string {
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - gotk-components.yaml\n  - gotk-sync.yaml\n"
	if !toHeadwater {
		return k
	}
	return k + `patches:
  # Headwater serves the source API: Flux's source-controller stays
  # installed, scaled to 0, to switch back by deleting these patches.
  - target:
      kind: Deployment
      name: source-controller
    patch: |
      - op: replace
        path: /spec/replicas
        value: 0
  # Headwater's Service of the same name serves the artifacts.
  - target:
      kind: Service
      name: source-controller
    patch: |
      $patch: delete
      apiVersion: v1
      kind: Service
      metadata:
        name: source-controller
`
}

// fleetSync follows the fleet repository through the GitRepository and
// the Kustomization flux-system.
type fleetSync struct {
	t    *testing.T
	cl   ctrlclient.Client
	repo *gitserver.Repo
}

// commit writes files, removes the paths in remove, commits, asks for a
// reconcile of the GitRepository flux-system (as `flux reconcile source
// git flux-system` does) and waits until the Kustomization flux-system
// applied the commit.
func (f fleetSync) commit(message string, files map[string]string, remove []string) {
	t := f.t
	t.Helper()
	if err := f.repo.Write(files); err != nil {
		t.Fatal(err)
	}
	for _, p := range remove {
		if err := f.repo.Git("rm", "--quiet", p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.repo.Commit(message); err != nil {
		t.Fatal(err)
	}
	var gr sourcev1.GitRepository
	if err := f.cl.Get(context.Background(), types.NamespacedName{Namespace: "flux-system", Name: "flux-system"}, &gr); err != nil {
		t.Fatal(err)
	}
	requestReconcile(t, f.cl, &gr)
	f.applied(message)
}

// applied waits until the Kustomization flux-system has applied the
// fleet's head.
func (f fleetSync) applied(what string) {
	t := f.t
	t.Helper()
	head, err := f.repo.Output("rev-parse", "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	head = strings.TrimSpace(head)
	start := time.Now()
	key := types.NamespacedName{Namespace: "flux-system", Name: "flux-system"}
	var gr sourcev1.GitRepository
	var rev string
	revision := func(context.Context) error { rev = gr.Status.Artifact.Revision; return nil }
	ks := &kustomizev1.Kustomization{ObjectMeta: metav1.ObjectMeta{Namespace: "flux-system", Name: "flux-system"}}
	kubetest.EventuallyEvery(t, 5*time.Minute, fine, "the fleet's commit applied: "+what, allOf(
		gitReadyAt(f.cl, key, head, &gr), revision, applied(f.cl, ks, &rev)))
	t.Logf("%s: the Kustomization flux-system applied %s %s after the reconcile request", what, rev, time.Since(start).Round(10*time.Millisecond))
}

// fluxSelector checks that the Service source-controller in flux-system
// selects Flux's pods as Flux's manifest says, and nothing else.
func fluxSelector(t *testing.T) {
	t.Helper()
	got := serviceSelector(t)
	if len(got) != 1 || got["app"] != "source-controller" {
		t.Errorf("the Service source-controller selects %v after the switch back, want Flux's map[app:source-controller]", got)
		return
	}
	t.Logf("  the Service source-controller selects %v", got)
}

// serviceSelector is the selector of the Service source-controller in
// flux-system.
func serviceSelector(t *testing.T) map[string]string {
	t.Helper()
	svc, err := env.C.Client.CoreV1().Services("flux-system").Get(context.Background(), "source-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc.Spec.Selector
}

// TestDropInBesideFlux applies the drop-in while Flux's source-controller
// still runs, the order docs/migrate-from-flux.md warns against: the
// watcher does not reconcile, its /readyz (so its pod's readiness) says
// what to do, and it writes no source's status and records no Event; once
// Flux's controller is scaled to 0 it takes over, with the checks of
// TestFluxMigration.
func TestDropInBesideFlux(t *testing.T) {
	requireFull(t)
	manifest := fluxSourceControllerManifest()
	m := fromFlux(t, func() { env.Kubectl(t, "apply", "-f", manifest) }, func() { removeDropIn(t) })
	var flux sourcev1.GitRepository
	if err := m.cl.Get(context.Background(), m.key, &flux); err != nil {
		t.Fatal(err)
	}

	m.switchTo("Headwater (applied first, Flux scaled to 0 after)", func() {
		env.Kubectl(t, "apply", "-k", env.DeployPath("overlays/flux-system"))
		const want = "Flux's source-controller Deployment is running in flux-system (1 replicas); scale it to 0"
		var said string
		kubetest.Eventually(t, 5*time.Minute, "the watcher's /readyz saying Flux's controller runs", func(ctx context.Context) error {
			list := pods(t, "watcher")
			if len(list) == 0 {
				return errors.New("no watcher pod")
			}
			for _, p := range list {
				if kubetest.PodReady(&p) {
					t.Fatalf("watcher pod %s is Ready while Flux's source-controller runs", p.Name)
				}
				if p.Status.PodIP == "" {
					return fmt.Errorf("watcher pod %s has no IP yet", p.Name)
				}
				body, err := readyzBody(ctx, p.Status.PodIP, 9110)
				if err != nil {
					return err
				}
				if !strings.Contains(body, want) {
					return fmt.Errorf("watcher pod %s /readyz: %q", p.Name, body)
				}
				said = firstLine(body)
			}
			return nil
		})
		t.Logf("  beside Flux's running controller the watcher is not Ready; /readyz: %s", said)
		// Every other service is up, and the watcher has had its start:
		// a reconcile would have written the source by now.
		for _, name := range []string{"fetcher", "packager", "artifact-server"} {
			kubetest.Eventually(t, 3*time.Minute, name+" Ready", func(context.Context) error {
				if len(readyPods(t, name)) == 0 {
					return fmt.Errorf("no %s pod Ready", name)
				}
				return nil
			})
		}
		var gr sourcev1.GitRepository
		if err := m.cl.Get(context.Background(), m.key, &gr); err != nil {
			t.Fatal(err)
		}
		if gr.Status.Artifact == nil || gr.Status.Artifact.Digest != flux.Status.Artifact.Digest {
			t.Errorf("the GitRepository's artifact changed while Flux's controller ran beside the waiting watcher: %+v, Flux's was %+v", gr.Status.Artifact, flux.Status.Artifact)
		}
		if list := events(t, "flux-system", m.key.Name, "ArtifactMissing"); len(list) > 0 {
			t.Errorf("the waiting watcher recorded %s: %s", list[0].Reason, list[0].Message)
		}
		env.Kubectl(t, "-n", "flux-system", "scale", "deployment/source-controller", "--replicas=0")
		m.waitGone("app=source-controller,!app.kubernetes.io/part-of")
		waitPodsReady(t, 5*time.Minute)
	}, m.rebuiltByHeadwater)
	m.newCommit("Headwater", "2")
}
