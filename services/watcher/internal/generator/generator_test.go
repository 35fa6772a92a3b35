package generator

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/services/watcher/internal/externalartifact"
	"github.com/headwater-gitops/headwater/services/watcher/internal/seal"
)

// jobs records the jobs published.
type jobs struct {
	mu   sync.Mutex
	sent []*events.GenerateRequested
}

func (j *jobs) Publish(_ context.Context, subject, eventType string, _ events.Job, data any) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if r, ok := data.(*events.GenerateRequested); ok && eventType == events.TypeGenerateRequested &&
		subject == events.PackageSubject(events.ArtifactGeneratorKind) {
		j.sent = append(j.sent, r)
	}
	return nil
}

func (j *jobs) count() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.sent)
}

func (j *jobs) last() *events.GenerateRequested {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.sent[len(j.sent)-1]
}

// setup starts a control plane with Headwater's CRDs and returns a
// Reconciler on it.
func setup(t *testing.T) (*Reconciler, *jobs) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, which builds kube-apiserver and etcd")
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "..", "..", "deploy", "crds")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, sourcev1.AddToScheme, swv1beta1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	key, err := seal.NewKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	j := &jobs{}
	return &Reconciler{Client: c, Live: c, Jobs: j, Seal: key, Writer: &externalartifact.Writer{Client: c}}, j
}

func gitSource(t *testing.T, r *Reconciler, name, rev string) {
	t.Helper()
	ctx := context.Background()
	g := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: sourcev1.GitRepositorySpec{URL: "http://git/" + name, Interval: metav1.Duration{Duration: time.Minute}}}
	if err := r.Client.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	size := int64(1)
	g.Status.Artifact = &meta.Artifact{Path: "gitrepository/default/" + name + "/x.tar.gz", URL: "http://a/x", Revision: rev,
		Digest: "sha256:" + strings.Repeat("a", 64), Size: &size, LastUpdateTime: metav1.Now()}
	if err := r.Client.Status().Update(ctx, g); err != nil {
		t.Fatal(err)
	}
}

func generatorOf(name string, sources []swv1beta1.SourceReference, outputs ...string) *swv1beta1.ArtifactGenerator {
	g := &swv1beta1.ArtifactGenerator{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: swv1beta1.ArtifactGeneratorSpec{Sources: sources}}
	for _, o := range outputs {
		g.Spec.OutputArtifacts = append(g.Spec.OutputArtifacts, swv1beta1.OutputArtifact{Name: o,
			Copy: []swv1beta1.CopyOperation{{From: "@" + sources[0].Alias + "/**", To: "@artifact/"}}})
	}
	return g
}

func reconcileGen(t *testing.T, r *Reconciler, name string) *swv1beta1.ArtifactGenerator {
	t.Helper()
	key := types.NamespacedName{Namespace: "default", Name: name}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: key}); err != nil {
		t.Fatalf("reconcile %s: %v", name, err)
	}
	g := &swv1beta1.ArtifactGenerator{}
	if err := r.Client.Get(context.Background(), key, g); err != nil {
		t.Fatal(err)
	}
	return g
}

func ready(g *swv1beta1.ArtifactGenerator) metav1.Condition {
	if c := apimeta.FindStatusCondition(g.Status.Conditions, meta.ReadyCondition); c != nil {
		return *c
	}
	return metav1.Condition{}
}

func TestReconcileAndOutcome(t *testing.T) {
	r, sent := setup(t)
	ctx := context.Background()
	gitSource(t, r, "mono", "main@sha1:1")
	if err := r.Client.Create(ctx, generatorOf("split", []swv1beta1.SourceReference{{Alias: "repo", Kind: "GitRepository", Name: "mono"}}, "split-a")); err != nil {
		t.Fatal(err)
	}
	g := reconcileGen(t, r, "split")
	if sent.count() != 1 {
		t.Fatalf("jobs = %d, want 1", sent.count())
	}
	job := sent.last()
	if err := r.Seal.Verify(job.Job); err != nil || job.Revision == "" || len(job.Sources) != 1 || job.Sources[0].Artifact.Revision != "main@sha1:1" {
		t.Fatalf("job = %+v (seal: %v)", job, err)
	}
	if !apimeta.IsStatusConditionTrue(g.Status.Conditions, meta.ReconcilingCondition) {
		t.Errorf("Reconciling not True: %+v", g.Status.Conditions)
	}

	// A stale outcome (other sources) is ignored.
	size := int64(3)
	art := meta.Artifact{Path: "externalartifact/default/split-a/h.tar.gz", URL: "http://a/externalartifact/default/split-a/h.tar.gz",
		Revision: "latest@sha256:h", Digest: "sha256:d", Size: &size, LastUpdateTime: metav1.Now()}
	out := &events.Outcome{Job: job.Job, Revision: "sha256:other", Outputs: []events.GeneratedOutput{{Name: "split-a", Artifact: art, Changed: true}}}
	if err := r.HandleOutcome(ctx, events.TypeArtifactStored, out); err != nil {
		t.Fatal(err)
	}
	if g := reconcileGen(t, r, "split"); len(g.Status.Inventory) != 0 {
		t.Errorf("stale outcome applied: %+v", g.Status)
	}

	out.Revision = job.Revision
	if err := r.HandleOutcome(ctx, events.TypeArtifactStored, out); err != nil {
		t.Fatal(err)
	}
	ea := &sourcev1.ExternalArtifact{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "split-a"}, ea); err != nil {
		t.Fatal(err)
	}
	if ea.Status.Artifact == nil || ea.Status.Artifact.Revision != art.Revision || ea.Labels[swv1beta1.ArtifactGeneratorLabel] == "" {
		t.Errorf("ExternalArtifact = %+v", ea)
	}
	before := sent.count()
	g = reconcileGen(t, r, "split")
	if c := ready(g); c.Status != metav1.ConditionTrue || len(g.Status.Inventory) != 1 || g.Status.Inventory[0].Filename != "h.tar.gz" ||
		g.Status.ObservedSourcesDigest != job.Revision {
		t.Errorf("status = %+v", g.Status)
	}
	if sent.count() != before {
		t.Errorf("an up-to-date generator published a job")
	}

	// A failure of a later job keeps the ExternalArtifact.
	gitSource(t, r, "other", "main@sha1:2")
	patched := g.DeepCopy()
	patched.Spec.Sources = append(patched.Spec.Sources, swv1beta1.SourceReference{Alias: "o", Kind: "GitRepository", Name: "other"})
	if err := r.Client.Patch(ctx, patched, client.MergeFrom(g)); err != nil {
		t.Fatal(err)
	}
	reconcileGen(t, r, "split")
	job2 := sent.last()
	fail := &events.Outcome{Job: job2.Job, Revision: job2.Revision,
		Failure: &events.Failure{Reason: meta.BuildFailedReason, Message: "artifact \"split-a\": \"x\" not found"}}
	if err := r.HandleOutcome(ctx, events.TypeArtifactFailed, fail); err != nil {
		t.Fatal(err)
	}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "split"}, g); err != nil {
		t.Fatal(err)
	}
	if c := ready(g); c.Status != metav1.ConditionFalse || c.Reason != meta.BuildFailedReason {
		t.Errorf("Ready = %+v", c)
	}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "split-a"}, ea); err != nil || ea.Status.Artifact.Revision != art.Revision {
		t.Errorf("last good artifact not kept: %+v, %v", ea.Status.Artifact, err)
	}
}

func TestProblems(t *testing.T) {
	r, sent := setup(t)
	ctx := context.Background()
	gitSource(t, r, "src", "main@sha1:1")
	// Someone else's ExternalArtifact.
	foreign := &sourcev1.ExternalArtifact{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "taken"},
		Spec: sourcev1.ExternalArtifactSpec{SourceRef: &meta.NamespacedObjectKindReference{APIVersion: "example.com/v1", Kind: "Thing", Name: "t"}}}
	if err := r.Client.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	repo := []swv1beta1.SourceReference{{Alias: "repo", Kind: "GitRepository", Name: "src"}}
	tests := []struct {
		gen     *swv1beta1.ArtifactGenerator
		reason  string
		message string
	}{
		{generatorOf("self", []swv1beta1.SourceReference{{Alias: "me", Kind: sourcev1.ExternalArtifactKind, Name: "self-out"}}, "self-out"),
			swv1beta1.ValidationFailedReason, "circular dependency"},
		{generatorOf("missing", []swv1beta1.SourceReference{{Alias: "repo", Kind: "GitRepository", Name: "nope"}}, "missing-out"),
			swv1beta1.SourceFetchFailedReason, "not found"},
		{generatorOf("foreign", repo, "taken"), swv1beta1.ValidationFailedReason, "another producer"},
		{generatorOf("dup", repo, "dup-a", "dup-a"), swv1beta1.ValidationFailedReason, "two artifacts"},
	}
	for _, tc := range tests {
		if err := r.Client.Create(ctx, tc.gen); err != nil {
			t.Fatal(err)
		}
		g := reconcileGen(t, r, tc.gen.Name)
		if c := ready(g); c.Status != metav1.ConditionFalse || c.Reason != tc.reason || !strings.Contains(c.Message, tc.message) {
			t.Errorf("%s: Ready = %+v", tc.gen.Name, c)
		}
	}
	if sent.count() != 0 {
		t.Errorf("%d jobs published for generators that cannot be built", sent.count())
	}

	// A cycle through another generator: b reads a's output, a reads b's.
	for _, g := range []*swv1beta1.ArtifactGenerator{
		generatorOf("a", []swv1beta1.SourceReference{{Alias: "up", Kind: sourcev1.ExternalArtifactKind, Name: "b-out"}}, "a-out"),
		generatorOf("b", []swv1beta1.SourceReference{{Alias: "up", Kind: sourcev1.ExternalArtifactKind, Name: "a-out"}}, "b-out"),
	} {
		if err := r.Client.Create(ctx, g); err != nil {
			t.Fatal(err)
		}
		owner := &swv1beta1.ArtifactGenerator{}
		if err := r.Client.Get(ctx, client.ObjectKeyFromObject(g), owner); err != nil {
			t.Fatal(err)
		}
		a := meta.Artifact{Path: "externalartifact/default/x/y.tar.gz", Revision: "latest@sha256:y", Digest: "sha256:y", LastUpdateTime: metav1.Now()}
		if _, _, err := r.Writer.Write(ctx, owner, externalartifact.Output{Name: g.Name + "-out", Artifact: &a, Ready: externalartifact.Stored(&a)}); err != nil {
			t.Fatal(err)
		}
	}
	g := reconcileGen(t, r, "a")
	if c := ready(g); c.Reason != swv1beta1.ValidationFailedReason || !strings.Contains(c.Message, "ArtifactGenerator default/b") {
		t.Errorf("a: Ready = %+v", c)
	}
}

// TestPathPattern: a generator with spec.pathPattern sends its templates
// and pattern in the job, with the names of the namespace's
// ExternalArtifacts another producer owns; the outputs the outcome names
// are published with their captures as labels and make the inventory;
// with them all published the generator is up to date, and one deleted
// makes a new job.
func TestPathPattern(t *testing.T) {
	r, sent := setup(t)
	ctx := context.Background()
	gitSource(t, r, "mono", "main@sha1:1")
	taken := &sourcev1.ExternalArtifact{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "taken"},
		Spec: sourcev1.ExternalArtifactSpec{SourceRef: &meta.NamespacedObjectKindReference{APIVersion: swv1beta1.GroupVersion.String(),
			Kind: swv1beta1.ArtifactGeneratorKind, Name: "another", Namespace: "default"}}}
	if err := r.Client.Create(ctx, taken); err != nil {
		t.Fatal(err)
	}
	g := generatorOf("apps", []swv1beta1.SourceReference{{Alias: "repo", Kind: "GitRepository", Name: "mono"}}, "{app}")
	g.Spec.PathPattern = "@repo/apps/{app}"
	g.Spec.OutputArtifacts[0].Copy[0].From = "@repo/apps/{app}/**"
	if err := r.Client.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	reconcileGen(t, r, "apps")
	if sent.count() != 1 {
		t.Fatalf("jobs = %d, want 1", sent.count())
	}
	job := sent.last()
	if job.PathPattern != "@repo/apps/{app}" || len(job.Artifacts) != 1 || job.Artifacts[0].Name != "{app}" ||
		len(job.Foreign) != 1 || job.Foreign[0] != "taken" {
		t.Fatalf("job pattern %q, artifacts %+v, foreign %v", job.PathPattern, job.Artifacts, job.Foreign)
	}

	size := int64(3)
	output := func(name string) events.GeneratedOutput {
		return events.GeneratedOutput{Name: name, Changed: true, Labels: map[string]string{"app": name},
			Artifact: meta.Artifact{Path: "externalartifact/default/" + name + "/h.tar.gz", URL: "http://a/externalartifact/default/" + name + "/h.tar.gz",
				Revision: "latest@sha256:h", Digest: "sha256:d", Size: &size, LastUpdateTime: metav1.Now()}}
	}
	out := &events.Outcome{Job: job.Job, Revision: job.Revision, Outputs: []events.GeneratedOutput{output("a"), output("b")}}
	if err := r.HandleOutcome(ctx, events.TypeArtifactStored, out); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		ea := &sourcev1.ExternalArtifact{}
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: name}, ea); err != nil {
			t.Fatal(err)
		}
		if ea.Labels["app"] != name || ea.Labels[swv1beta1.ArtifactGeneratorLabel] == "" || ea.Status.Artifact == nil {
			t.Errorf("ExternalArtifact %s: labels %v, artifact %+v", name, ea.Labels, ea.Status.Artifact)
		}
	}
	g = reconcileGen(t, r, "apps")
	if c := ready(g); c.Status != metav1.ConditionTrue || len(g.Status.Inventory) != 2 || sent.count() != 1 {
		t.Fatalf("Ready %+v, inventory %+v, jobs %d: want up to date without a new job", c, g.Status.Inventory, sent.count())
	}

	// One of the outputs' ExternalArtifacts is deleted: a new job.
	if err := r.Client.Delete(ctx, &sourcev1.ExternalArtifact{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "b"}}); err != nil {
		t.Fatal(err)
	}
	reconcileGen(t, r, "apps")
	if sent.count() != 2 {
		t.Fatalf("jobs = %d after an output's ExternalArtifact was deleted, want 2", sent.count())
	}
}
