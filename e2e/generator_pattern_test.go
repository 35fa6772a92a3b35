package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestArtifactGeneratorPathPattern: a generator with spec.pathPattern
// makes one ExternalArtifact per matching directory of the monorepo
// (names from the lowercased captures, paths as written, captures as
// labels); a commit adding a directory adds its ExternalArtifact, one
// removing a directory deletes its ExternalArtifact; a pattern that
// matches nothing is Ready False with BuildFailed, a message saying what
// to fix and a Warning Event, and the ExternalArtifacts published before
// stay and are served.
func TestArtifactGeneratorPathPattern(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const src, gen = "agen-pp-mono", "agen-pp"
	files := map[string]string{
		"apps/Auth/base/deploy.yaml":      "kind: Deployment # auth\n",
		"apps/Auth/envs/dev/patch.yaml":   "replicas: 1\n",
		"apps/Auth/envs/prod/patch.yaml":  "replicas: 3\n",
		"apps/pay/base/deploy.yaml":       "kind: Deployment # pay\n",
		"apps/pay/envs/dev/patch.yaml":    "replicas: 1\n",
		"apps/pay/README.md":              "not an env\n",
		"clusters/prod/kustomization.yml": "resources: []\n",
	}
	repo, c1 := newRepo(t, src, files)
	createSource(t, src, env.Git.RepoURL(src), branch)
	waitArtifact(t, src, revision(c1))
	g := &swv1beta1.ArtifactGenerator{
		ObjectMeta: metav1.ObjectMeta{Name: gen, Namespace: namespace},
		Spec: swv1beta1.ArtifactGeneratorSpec{
			Sources:        []swv1beta1.SourceReference{{Alias: "mono", Kind: sourcev1.GitRepositoryKind, Name: src}},
			CommonMetadata: &swv1beta1.CommonMetadata{Labels: map[string]string{"team": "platform"}},
			PathPattern:    "@mono/apps/{app}/envs/{env}",
			OutputArtifacts: []swv1beta1.OutputArtifact{{
				Name:           "pp-{app}-{env}",
				OriginRevision: "@mono",
				Copy: []swv1beta1.CopyOperation{
					{From: "@mono/apps/{app}/base/**", To: "@artifact/base/"},
					{From: "@mono/apps/{app}/envs/{env}/**", To: "@artifact/envs/{env}/"},
				},
			}},
		},
	}
	createObject(t, g)

	check := func(name, app, env, base string) *sourcev1.ExternalArtifact {
		t.Helper()
		ea := waitExternalArtifact(t, name, nil)
		if ea.Labels["app"] != app || ea.Labels["env"] != env || ea.Labels["team"] != "platform" {
			t.Errorf("%s: labels %v, want app=%s env=%s team=platform", name, ea.Labels, app, env)
		}
		want := map[string]string{"base/deploy.yaml": files["apps/"+base+"/base/deploy.yaml"],
			"envs/" + env + "/patch.yaml": files["apps/"+base+"/envs/"+env+"/patch.yaml"]}
		if d := diffTrees(eaFiles(t, ea), want); d != "" {
			t.Errorf("%s: %s", name, d)
		}
		if ea.Status.Artifact.Metadata[swv1beta1.ArtifactOriginRevisionAnnotation] != revision(c1) {
			t.Errorf("%s: metadata %v", name, ea.Status.Artifact.Metadata)
		}
		return ea
	}
	check("pp-auth-dev", "auth", "dev", "Auth")
	prod := check("pp-auth-prod", "auth", "prod", "Auth")
	check("pp-pay-dev", "pay", "dev", "pay")
	g = waitGenerator(t, gen, metav1.ConditionTrue, meta.SucceededReason)
	if len(g.Status.Inventory) != 3 {
		t.Errorf("inventory = %+v", g.Status.Inventory)
	}

	// A new directory gets its ExternalArtifact; a removed one loses it.
	files["apps/pay/envs/prod/patch.yaml"] = "replicas: 5\n"
	if err := repo.Write(map[string]string{"apps/pay/envs/prod/patch.yaml": files["apps/pay/envs/prod/patch.yaml"]}); err != nil {
		t.Fatal(err)
	}
	if err := repo.Git("rm", "-r", "-q", "apps/Auth/envs/prod"); err != nil {
		t.Fatal(err)
	}
	delete(files, "apps/Auth/envs/prod/patch.yaml")
	c2 := commit(t, repo, nil, "Add pay prod, drop auth prod")
	requestReconcile(t, src)
	waitArtifact(t, src, revision(c2))
	c1 = c2
	check("pp-pay-prod", "pay", "prod", "pay")
	eventually(t, "pp-auth-prod deleted", func() error {
		err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: "pp-auth-prod"}, &sourcev1.ExternalArtifact{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return client.IgnoreNotFound(err)
	})
	eventually(t, "pp-auth-prod's artifact no longer served", func() error {
		if code, _ := httpGet(t, prod.Status.Artifact.URL); code != http.StatusNotFound {
			return fmt.Errorf("GET %s: %d", prod.Status.Artifact.URL, code)
		}
		return nil
	})

	// A pattern that matches nothing: the published artifacts stay.
	before := waitExternalArtifact(t, "pp-pay-dev", nil)
	g = &swv1beta1.ArtifactGenerator{}
	getObject(t, gen, g)
	patchObject(t, g, func(g *swv1beta1.ArtifactGenerator) { g.Spec.PathPattern = "@mono/services/{app}/envs/{env}" })
	g = waitGenerator(t, gen, metav1.ConditionFalse, meta.BuildFailedReason)
	c := apimeta.FindStatusCondition(g.Status.Conditions, meta.ReadyCondition)
	if !strings.Contains(c.Message, `pathPattern "@mono/services/{app}/envs/{env}" matches no directory in source "mono"`) ||
		!strings.Contains(c.Message, "correct spec.pathPattern") {
		t.Errorf("Ready message %q does not say what matched nothing and what to fix", c.Message)
	}
	waitKindEvent(t, swv1beta1.ArtifactGeneratorKind, gen, corev1.EventTypeWarning, meta.BuildFailedReason,
		func(msg string) bool { return strings.Contains(msg, "matches no directory") })
	if len(g.Status.Inventory) != 3 {
		t.Errorf("inventory after a failed build = %+v", g.Status.Inventory)
	}
	kept := waitExternalArtifact(t, "pp-pay-dev", nil)
	if kept.Status.Artifact.Digest != before.Status.Artifact.Digest {
		t.Errorf("artifact changed by a failed build: %s -> %s", before.Status.Artifact.Digest, kept.Status.Artifact.Digest)
	}
	if code, _ := httpGet(t, kept.Status.Artifact.URL); code != http.StatusOK {
		t.Errorf("GET %s: %d", kept.Status.Artifact.URL, code)
	}
	requireServicesRunning(t)
}
