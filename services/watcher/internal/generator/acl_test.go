package generator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNoCrossNamespaceRefs: with the lockdown on, a generator naming a
// source of another namespace is Ready False AccessDenied and Stalled,
// and no job is made; a generator naming its own namespace's source is
// built; with the lockdown off, the other namespace's source is used.
func TestNoCrossNamespaceRefs(t *testing.T) {
	r, sent := setup(t)
	ctx := context.Background()
	if err := r.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-b"}}); err != nil {
		t.Fatal(err)
	}
	victim := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-b", Name: "secret-repo"},
		Spec: sourcev1.GitRepositorySpec{URL: "http://git/b", Interval: metav1.Duration{Duration: time.Minute}}}
	if err := r.Client.Create(ctx, victim); err != nil {
		t.Fatal(err)
	}
	victim.Status.Artifact = &meta.Artifact{Path: "gitrepository/tenant-b/secret-repo/x.tar.gz", URL: "http://a/x", Revision: "main@sha1:b",
		Digest: "sha256:" + strings.Repeat("b", 64), LastUpdateTime: metav1.Now()}
	if err := r.Client.Status().Update(ctx, victim); err != nil {
		t.Fatal(err)
	}
	gitSource(t, r, "own", "main@sha1:1")

	r.NoCrossNamespaceRefs = true
	thief := generatorOf("thief", []swv1beta1.SourceReference{{Alias: "b", Kind: "GitRepository", Namespace: "tenant-b", Name: "secret-repo"}}, "loot")
	if err := r.Client.Create(ctx, thief); err != nil {
		t.Fatal(err)
	}
	g := reconcileGen(t, r, "thief")
	c := ready(g)
	want := "cross-namespace reference to source GitRepository/tenant-b/secret-repo is not allowed"
	if c.Status != metav1.ConditionFalse || c.Reason != swv1beta1.AccessDeniedReason || c.Message != want {
		t.Errorf("Ready = %+v, want False AccessDenied %q", c, want)
	}
	if !apimeta.IsStatusConditionTrue(g.Status.Conditions, meta.StalledCondition) {
		t.Errorf("not Stalled: %+v", g.Status.Conditions)
	}
	if sent.count() != 0 {
		t.Fatalf("%d jobs published for a refused generator", sent.count())
	}

	// The same namespace, named explicitly, is allowed.
	own := generatorOf("own-gen", []swv1beta1.SourceReference{{Alias: "repo", Kind: "GitRepository", Namespace: "default", Name: "own"}}, "own-out")
	if err := r.Client.Create(ctx, own); err != nil {
		t.Fatal(err)
	}
	reconcileGen(t, r, "own-gen")
	if sent.count() != 1 || sent.last().Sources[0].Namespace != "default" {
		t.Fatalf("jobs %d, want one for own-gen", sent.count())
	}

	// Lockdown off (Flux's default): the reference resolves.
	r.NoCrossNamespaceRefs = false
	reconcileGen(t, r, "thief")
	if sent.count() != 2 || sent.last().Sources[0].Namespace != "tenant-b" {
		t.Errorf("jobs %d, want the thief's with the lockdown off", sent.count())
	}
}
