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

// perAppGenerator is an ArtifactGenerator splitting the GitRepository
// source into one output "<prefix>-<app>" per app of apps/.
func perAppGenerator(name, source, prefix string, apps ...string) *swv1beta1.ArtifactGenerator {
	g := &swv1beta1.ArtifactGenerator{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: swv1beta1.ArtifactGeneratorSpec{
			Sources: []swv1beta1.SourceReference{{Alias: "repo", Kind: sourcev1.GitRepositoryKind, Name: source}},
		},
	}
	for _, app := range apps {
		g.Spec.OutputArtifacts = append(g.Spec.OutputArtifacts, swv1beta1.OutputArtifact{
			Name: prefix + "-" + app, OriginRevision: "@repo",
			Copy: []swv1beta1.CopyOperation{{From: "@repo/apps/" + app + "/**", To: "@artifact/"}},
		})
	}
	return g
}

// waitExternalArtifact waits until the ExternalArtifact name is Ready with
// an artifact accepted by ok, and returns it.
func waitExternalArtifact(t *testing.T, name string, ok func(*meta.Artifact) bool) *sourcev1.ExternalArtifact {
	t.Helper()
	ea := &sourcev1.ExternalArtifact{}
	eventually(t, "ExternalArtifact "+name+" Ready", func() error {
		if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, ea); err != nil {
			return err
		}
		ready := apimeta.FindStatusCondition(ea.Status.Conditions, meta.ReadyCondition)
		if ready == nil || ready.Status != metav1.ConditionTrue || ea.Status.Artifact == nil {
			return fmt.Errorf("not Ready: %+v", ea.Status)
		}
		if ok != nil && !ok(ea.Status.Artifact) {
			return fmt.Errorf("artifact %s not the one awaited", ea.Status.Artifact.Revision)
		}
		return nil
	})
	return ea
}

// waitGenerator waits until the generator's Ready condition has status
// and reason, and returns it.
func waitGenerator(t *testing.T, name string, status metav1.ConditionStatus, reason string) *swv1beta1.ArtifactGenerator {
	t.Helper()
	g := &swv1beta1.ArtifactGenerator{}
	eventually(t, fmt.Sprintf("ArtifactGenerator %s Ready %s %s", name, status, reason), func() error {
		if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, g); err != nil {
			return err
		}
		c := apimeta.FindStatusCondition(g.Status.Conditions, meta.ReadyCondition)
		if c == nil || c.Status != status || c.Reason != reason || c.ObservedGeneration != g.Generation {
			return fmt.Errorf("Ready = %+v", c)
		}
		return nil
	})
	return g
}

// eaFiles downloads an ExternalArtifact's artifact, checks its digest and
// returns its files.
func eaFiles(t *testing.T, ea *sourcev1.ExternalArtifact) map[string]string {
	t.Helper()
	body := download(t, ea.Status.Artifact.URL)
	if got := sha256Digest(body); got != ea.Status.Artifact.Digest {
		t.Fatalf("%s: downloaded digest %s, status says %s", ea.Name, got, ea.Status.Artifact.Digest)
	}
	return untarArtifact(t, body)
}

// TestArtifactGenerator splits a monorepo GitRepository with apps/a..c
// into one ExternalArtifact per app with one ArtifactGenerator; a commit
// touching app b gives only b's ExternalArtifact a new revision; an app
// dropped from the spec loses its ExternalArtifact and its stored files.
func TestArtifactGenerator(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const src, gen = "agen-mono", "agen-split"
	files := map[string]string{
		"README.md":               "# monorepo\n",
		"apps/a/deployment.yaml":  "kind: Deployment # a v1\n",
		"apps/b/deployment.yaml":  "kind: Deployment # b v1\n",
		"apps/b/service.yaml":     "kind: Service # b\n",
		"apps/c/configmap.yaml":   "kind: ConfigMap # c v1\n",
		"apps/c/nested/extra.yml": "extra: true\n",
	}
	repo, c1 := newRepo(t, src, files)
	createSource(t, src, env.Git.RepoURL(src), branch)
	waitArtifact(t, src, revision(c1))
	g := perAppGenerator(gen, src, "agen", "a", "b", "c")
	createObject(t, g)

	first := map[string]*sourcev1.ExternalArtifact{}
	for _, app := range []string{"a", "b", "c"} {
		name := "agen-" + app
		ea := waitExternalArtifact(t, name, nil)
		first[app] = ea
		a := ea.Status.Artifact
		if !strings.HasPrefix(a.Revision, "latest@sha256:") || a.Metadata[swv1beta1.ArtifactOriginRevisionAnnotation] != revision(c1) {
			t.Errorf("%s: revision %q, metadata %v", name, a.Revision, a.Metadata)
		}
		if ref := ea.Spec.SourceRef; ref == nil || ref.Kind != swv1beta1.ArtifactGeneratorKind || ref.Name != gen {
			t.Errorf("%s: sourceRef = %+v", name, ref)
		}
		if len(ea.OwnerReferences) != 1 || ea.OwnerReferences[0].Name != gen {
			t.Errorf("%s: ownerReferences = %+v", name, ea.OwnerReferences)
		}
		want := map[string]string{}
		for p, content := range files {
			if rel, ok := strings.CutPrefix(p, "apps/"+app+"/"); ok {
				want[rel] = content
			}
		}
		if d := diffTrees(eaFiles(t, ea), want); d != "" {
			t.Errorf("%s: %s", name, d)
		}
	}
	g = waitGenerator(t, gen, metav1.ConditionTrue, meta.SucceededReason)
	if len(g.Status.Inventory) != 3 || g.Status.ObservedSourcesDigest == "" {
		t.Errorf("status = %+v", g.Status)
	}
	waitKindEvent(t, swv1beta1.ArtifactGeneratorKind, gen, corev1.EventTypeNormal, "NewArtifact", nil)

	// A commit touching app b only.
	files["apps/b/deployment.yaml"] = "kind: Deployment # b v2\n"
	c2 := commit(t, repo, files, "Change b")
	requestReconcile(t, src)
	waitArtifact(t, src, revision(c2))
	b := waitExternalArtifact(t, "agen-b", func(a *meta.Artifact) bool { return a.Revision != first["b"].Status.Artifact.Revision })
	if got := eaFiles(t, b)["deployment.yaml"]; got != files["apps/b/deployment.yaml"] {
		t.Errorf("agen-b deployment.yaml = %q", got)
	}
	g = waitGeneratorDigestChange(t, gen, g.Status.ObservedSourcesDigest)
	for _, app := range []string{"a", "c"} {
		ea := waitExternalArtifact(t, "agen-"+app, nil)
		if ea.Status.Artifact.Revision != first[app].Status.Artifact.Revision || ea.Status.Artifact.Digest != first[app].Status.Artifact.Digest {
			t.Errorf("agen-%s changed with a commit that did not touch it: %s -> %s", app, first[app].Status.Artifact.Revision, ea.Status.Artifact.Revision)
		}
	}

	// App c leaves the spec: its ExternalArtifact and its files go.
	patchObject(t, g, func(g *swv1beta1.ArtifactGenerator) { g.Spec.OutputArtifacts = g.Spec.OutputArtifacts[:2] })
	eventually(t, "agen-c deleted", func() error {
		err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: "agen-c"}, &sourcev1.ExternalArtifact{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return client.IgnoreNotFound(err)
	})
	eventually(t, "agen-c's artifact no longer served", func() error {
		if code, _ := httpGet(t, first["c"].Status.Artifact.URL); code != http.StatusNotFound {
			return fmt.Errorf("GET %s: %d", first["c"].Status.Artifact.URL, code)
		}
		return nil
	})
	g = waitGenerator(t, gen, metav1.ConditionTrue, meta.SucceededReason)
	if len(g.Status.Inventory) != 2 {
		t.Errorf("inventory = %+v", g.Status.Inventory)
	}
}

// waitGeneratorDigestChange waits until the generator has applied an
// outcome for other sources than digest.
func waitGeneratorDigestChange(t *testing.T, name, digest string) *swv1beta1.ArtifactGenerator {
	t.Helper()
	g := &swv1beta1.ArtifactGenerator{}
	eventually(t, "ArtifactGenerator "+name+" applies the new sources", func() error {
		if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, g); err != nil {
			return err
		}
		c := apimeta.FindStatusCondition(g.Status.Conditions, meta.ReadyCondition)
		if g.Status.ObservedSourcesDigest == digest || c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("digest %s, Ready %+v", g.Status.ObservedSourcesDigest, c)
		}
		return nil
	})
	return g
}

// TestArtifactGeneratorBadInput: a generator with a glob escaping its
// source, two outputs of one name, a missing source, or a dependency
// cycle (directly, or through another generator) is Ready False with a
// reason and a Warning Event, stores nothing and crashes nothing; a
// generator turned into a cycle keeps its last good artifact served.
func TestArtifactGeneratorBadInput(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const src = "agen-bad-src"
	_, c1 := newRepo(t, src, map[string]string{"apps/x/a.yaml": "a: 1\n"})
	createSource(t, src, env.Git.RepoURL(src), branch)
	waitArtifact(t, src, revision(c1))

	cases := []struct {
		name   string
		mutate func(*swv1beta1.ArtifactGenerator)
		reason string
		match  string
	}{
		{"agen-bad-escape", func(g *swv1beta1.ArtifactGenerator) { g.Spec.OutputArtifacts[0].Copy[0].From = "@repo/../../etc/**" },
			swv1beta1.ValidationFailedReason, "escapes"},
		{"agen-bad-dup", func(g *swv1beta1.ArtifactGenerator) {
			g.Spec.OutputArtifacts = append(g.Spec.OutputArtifacts, g.Spec.OutputArtifacts[0])
		}, swv1beta1.ValidationFailedReason, "two artifacts"},
		{"agen-bad-missing", func(g *swv1beta1.ArtifactGenerator) { g.Spec.Sources[0].Name = "agen-no-such-source" },
			swv1beta1.SourceFetchFailedReason, "not found"},
		{"agen-bad-self", func(g *swv1beta1.ArtifactGenerator) {
			g.Spec.Sources = append(g.Spec.Sources, swv1beta1.SourceReference{Alias: "self", Kind: sourcev1.ExternalArtifactKind, Name: "agen-bad-self-x"})
		}, swv1beta1.ValidationFailedReason, "circular dependency"},
	}
	for _, tc := range cases {
		g := perAppGenerator(tc.name, src, tc.name, "x")
		tc.mutate(g)
		createObject(t, g)
	}
	for _, tc := range cases {
		g := waitGenerator(t, tc.name, metav1.ConditionFalse, tc.reason)
		if c := apimeta.FindStatusCondition(g.Status.Conditions, meta.ReadyCondition); !strings.Contains(c.Message, tc.match) {
			t.Errorf("%s: Ready message %q does not say %q", tc.name, c.Message, tc.match)
		}
		waitKindEvent(t, swv1beta1.ArtifactGeneratorKind, tc.name, corev1.EventTypeWarning, tc.reason, nil)
		if len(g.Status.Inventory) != 0 {
			t.Errorf("%s: inventory %+v", tc.name, g.Status.Inventory)
		}
	}

	// A cycle through another generator: X feeds Y, then X takes Y's
	// output as a source.
	x := perAppGenerator("agen-cyc-x", src, "agen-cyc-x", "x")
	createObject(t, x)
	xOut := waitExternalArtifact(t, "agen-cyc-x-x", nil)
	y := perAppGenerator("agen-cyc-y", src, "agen-cyc-y", "x")
	y.Spec.Sources = []swv1beta1.SourceReference{{Alias: "up", Kind: sourcev1.ExternalArtifactKind, Name: "agen-cyc-x-x"}}
	y.Spec.OutputArtifacts[0].Copy[0].From = "@up/**"
	y.Spec.OutputArtifacts[0].OriginRevision = "@up"
	createObject(t, y)
	waitExternalArtifact(t, "agen-cyc-y-x", nil)
	x = &swv1beta1.ArtifactGenerator{}
	getObject(t, "agen-cyc-x", x)
	patchObject(t, x, func(g *swv1beta1.ArtifactGenerator) {
		g.Spec.Sources = append(g.Spec.Sources, swv1beta1.SourceReference{Alias: "down", Kind: sourcev1.ExternalArtifactKind, Name: "agen-cyc-y-x"})
	})
	g := waitGenerator(t, "agen-cyc-x", metav1.ConditionFalse, swv1beta1.ValidationFailedReason)
	if c := apimeta.FindStatusCondition(g.Status.Conditions, meta.ReadyCondition); !strings.Contains(c.Message, "circular dependency") {
		t.Errorf("Ready message %q", c.Message)
	}
	// The last good artifact is kept and served.
	kept := waitExternalArtifact(t, "agen-cyc-x-x", nil)
	if kept.Status.Artifact.Digest != xOut.Status.Artifact.Digest {
		t.Errorf("artifact changed: %s -> %s", xOut.Status.Artifact.Digest, kept.Status.Artifact.Digest)
	}
	if code, _ := httpGet(t, kept.Status.Artifact.URL); code != http.StatusOK {
		t.Errorf("GET %s: %d", kept.Status.Artifact.URL, code)
	}
	requireServicesRunning(t)
}
