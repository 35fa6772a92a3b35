package status

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	eventv1 "github.com/fluxcd/pkg/apis/event/v1beta1"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/watcher/internal/sourcekind"
)

const (
	rev1 = "master@sha1:1111111111111111111111111111111111111111"
	rev2 = "master@sha1:2222222222222222222222222222222222222222"
)

func artifact(rev, digest string, at time.Time) *meta.Artifact {
	size := int64(42)
	return &meta.Artifact{Path: "gitrepository/default/podinfo/x.tar.gz", Revision: rev, Digest: digest,
		LastUpdateTime: metav1.NewTime(at), Size: &size, URL: "http://a/gitrepository/default/podinfo/x.tar.gz"}
}

func job(gen int64, token string) events.Job {
	return events.Job{ID: "j", ReconcileToken: token,
		Object: events.ObjectRef{Kind: "GitRepository", Namespace: "default", Name: "podinfo", UID: "u", Generation: gen}}
}

func TestApply(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	failure := &events.Failure{Condition: sourcev1.FetchFailedCondition, Reason: sourcev1.GitOperationFailedReason,
		Message: "failed to checkout and determine revision: unable to clone 'http://x/repo.git': connection refused"}

	tests := []struct {
		name      string
		setup     func(*sourcev1.GitRepository)
		eventType string
		outcome   *events.Outcome
		check     func(*testing.T, *sourcev1.GitRepository)
		events    []Event
	}{
		{
			name:      "first artifact",
			setup:     func(g *sourcev1.GitRepository) { MarkProgressing(g, sourcekind.GitRepository().Status(g)) },
			eventType: events.TypeArtifactStored,
			outcome:   &events.Outcome{Job: job(1, "tok"), Revision: rev1, Artifact: artifact(rev1, "sha256:a", t0), EventMessage: "stored artifact for commit 'first'"},
			check: func(t *testing.T, g *sourcev1.GitRepository) {
				wantCondition(t, g, meta.ReadyCondition, metav1.ConditionTrue, meta.SucceededReason, readyMessage(rev1))
				wantCondition(t, g, sourcev1.ArtifactInStorageCondition, metav1.ConditionTrue, meta.SucceededReason, readyMessage(rev1))
				wantNoCondition(t, g, meta.ReconcilingCondition)
				if g.Status.Artifact == nil || g.Status.Artifact.Digest != "sha256:a" {
					t.Errorf("artifact = %+v", g.Status.Artifact)
				}
				if g.Status.ObservedGeneration != 1 || g.Status.LastHandledReconcileAt != "tok" {
					t.Errorf("observedGeneration %d, lastHandledReconcileAt %q", g.Status.ObservedGeneration, g.Status.LastHandledReconcileAt)
				}
			},
			events: []Event{{Type: corev1.EventTypeNormal, Reason: NewArtifactReason, Message: "stored artifact for commit 'first'", Revision: rev1, Digest: "sha256:a"}},
		},
		{
			name: "unchanged keeps the artifact and says so, as Flux does for a GitRepository",
			setup: func(g *sourcev1.GitRepository) {
				g.Status.Artifact = artifact(rev1, "sha256:a", t0)
				g.Status.ObservedGeneration = 1
				conditions.MarkTrue(g, meta.ReadyCondition, meta.SucceededReason, "%s", readyMessage(rev1))
			},
			eventType: events.TypeArtifactUnchanged,
			outcome:   &events.Outcome{Job: job(1, "tok2"), Revision: rev1, Artifact: artifact(rev1, "sha256:a", t0)},
			check: func(t *testing.T, g *sourcev1.GitRepository) {
				wantCondition(t, g, meta.ReadyCondition, metav1.ConditionTrue, meta.SucceededReason, readyMessage(rev1))
				if g.Status.LastHandledReconcileAt != "tok2" {
					t.Errorf("lastHandledReconcileAt = %q", g.Status.LastHandledReconcileAt)
				}
			},
			events: []Event{{Type: eventv1.EventTypeTrace, Reason: sourcev1.GitOperationSucceedReason, Message: "no changes since last reconciliation: observed revision '" + rev1 + "'"}},
		},
		{
			name: "failure keeps the previous artifact and warns",
			setup: func(g *sourcev1.GitRepository) {
				g.Status.Artifact = artifact(rev1, "sha256:a", t0)
				g.Status.ObservedGeneration = 1
				conditions.MarkTrue(g, meta.ReadyCondition, meta.SucceededReason, "%s", readyMessage(rev1))
				conditions.MarkTrue(g, sourcev1.ArtifactInStorageCondition, meta.SucceededReason, "%s", readyMessage(rev1))
			},
			eventType: events.TypeArtifactFailed,
			outcome:   &events.Outcome{Job: job(1, ""), Failure: failure},
			check: func(t *testing.T, g *sourcev1.GitRepository) {
				wantCondition(t, g, meta.ReadyCondition, metav1.ConditionFalse, failure.Reason, failure.Message)
				wantCondition(t, g, sourcev1.FetchFailedCondition, metav1.ConditionTrue, failure.Reason, failure.Message)
				wantCondition(t, g, sourcev1.ArtifactInStorageCondition, metav1.ConditionTrue, meta.SucceededReason, readyMessage(rev1))
				wantNoCondition(t, g, meta.StalledCondition)
				if g.Status.Artifact == nil || g.Status.Artifact.Revision != rev1 {
					t.Errorf("previous artifact lost: %+v", g.Status.Artifact)
				}
			},
			events: []Event{{Type: corev1.EventTypeWarning, Reason: failure.Reason, Message: failure.Message}},
		},
		{
			name: "a failure that found the stored artifact corrupt takes it out of storage",
			setup: func(g *sourcev1.GitRepository) {
				g.Status.Artifact = artifact(rev1, "sha256:a", t0)
				conditions.MarkTrue(g, sourcev1.ArtifactInStorageCondition, meta.SucceededReason, "%s", readyMessage(rev1))
			},
			eventType: events.TypeArtifactFailed,
			outcome: &events.Outcome{Job: job(1, ""), Failure: failure, Notices: []events.Notice{{Warning: true,
				Reason: ArtifactVerificationFailedReason, Message: "failed to verify integrity of artifact: computed digest doesn't match 'sha256:a'"}}},
			check: func(t *testing.T, g *sourcev1.GitRepository) {
				wantCondition(t, g, sourcev1.ArtifactInStorageCondition, metav1.ConditionFalse, ArtifactVerificationFailedReason,
					"failed to verify integrity of artifact: computed digest doesn't match 'sha256:a'")
				wantCondition(t, g, meta.ReadyCondition, metav1.ConditionFalse, failure.Reason, failure.Message)
			},
			events: []Event{
				{Type: corev1.EventTypeWarning, Reason: ArtifactVerificationFailedReason, Message: "failed to verify integrity of artifact: computed digest doesn't match 'sha256:a'"},
				{Type: corev1.EventTypeWarning, Reason: failure.Reason, Message: failure.Message},
			},
		},
		{
			name: "a failure after a new revision was seen marks the artifact outdated",
			setup: func(g *sourcev1.GitRepository) {
				g.Status.Artifact = artifact(rev1, "sha256:a", t0)
			},
			eventType: events.TypeArtifactFailed,
			outcome:   &events.Outcome{Job: job(1, ""), Revision: rev2, Failure: failure},
			check: func(t *testing.T, g *sourcev1.GitRepository) {
				wantCondition(t, g, sourcev1.ArtifactOutdatedCondition, metav1.ConditionTrue, "NewRevision", "new upstream revision '"+rev2+"'")
				if g.Status.Artifact.Revision != rev1 {
					t.Errorf("artifact = %+v, want the previous one kept", g.Status.Artifact)
				}
			},
			events: []Event{{Type: corev1.EventTypeWarning, Reason: failure.Reason, Message: failure.Message}},
		},
		{
			name: "a failure at the stored revision does not mark it outdated",
			setup: func(g *sourcev1.GitRepository) {
				g.Status.Artifact = artifact(rev1, "sha256:a", t0)
			},
			eventType: events.TypeArtifactFailed,
			outcome:   &events.Outcome{Job: job(1, ""), Revision: rev1, Failure: failure},
			check: func(t *testing.T, g *sourcev1.GitRepository) {
				wantNoCondition(t, g, sourcev1.ArtifactOutdatedCondition)
			},
			events: []Event{{Type: corev1.EventTypeWarning, Reason: failure.Reason, Message: failure.Message}},
		},
		{
			name: "success clears ArtifactOutdated",
			setup: func(g *sourcev1.GitRepository) {
				g.Status.Artifact = artifact(rev1, "sha256:a", t0)
				conditions.MarkTrue(g, sourcev1.ArtifactOutdatedCondition, "NewRevision", "new upstream revision '%s'", rev2)
			},
			eventType: events.TypeArtifactStored,
			outcome:   &events.Outcome{Job: job(1, ""), Revision: rev2, Artifact: artifact(rev2, "sha256:b", t0.Add(time.Minute)), EventMessage: "m"},
			check: func(t *testing.T, g *sourcev1.GitRepository) {
				wantNoCondition(t, g, sourcev1.ArtifactOutdatedCondition)
			},
			events: []Event{{Type: corev1.EventTypeNormal, Reason: NewArtifactReason, Message: "m", Revision: rev2, Digest: "sha256:b"}},
		},
		{
			name: "the same failure again records no second event",
			setup: func(g *sourcev1.GitRepository) {
				conditions.MarkFalse(g, meta.ReadyCondition, failure.Reason, "%s", failure.Message)
			},
			eventType: events.TypeArtifactFailed,
			outcome:   &events.Outcome{Job: job(1, ""), Failure: failure},
			check: func(t *testing.T, g *sourcev1.GitRepository) {
				wantCondition(t, g, meta.ReadyCondition, metav1.ConditionFalse, failure.Reason, failure.Message)
			},
		},
		{
			name:      "stalled failure",
			eventType: events.TypeArtifactFailed,
			outcome: &events.Outcome{Job: job(1, ""), Failure: &events.Failure{Condition: sourcev1.FetchFailedCondition,
				Reason: sourcev1.URLInvalidReason, Message: "invalid url", Stalled: true}},
			check: func(t *testing.T, g *sourcev1.GitRepository) {
				wantCondition(t, g, meta.StalledCondition, metav1.ConditionTrue, sourcev1.URLInvalidReason, "invalid url")
				wantCondition(t, g, meta.ReadyCondition, metav1.ConditionFalse, sourcev1.URLInvalidReason, "invalid url")
			},
			events: []Event{{Type: corev1.EventTypeWarning, Reason: sourcev1.URLInvalidReason, Message: "invalid url"}},
		},
		{
			name: "recovery clears failures and says so",
			setup: func(g *sourcev1.GitRepository) {
				g.Status.Artifact = artifact(rev1, "sha256:a", t0)
				conditions.MarkFalse(g, meta.ReadyCondition, failure.Reason, "%s", failure.Message)
				conditions.MarkTrue(g, sourcev1.FetchFailedCondition, failure.Reason, "%s", failure.Message)
			},
			eventType: events.TypeArtifactUnchanged,
			outcome:   &events.Outcome{Job: job(1, ""), Revision: rev1, Artifact: artifact(rev1, "sha256:a", t0)},
			check: func(t *testing.T, g *sourcev1.GitRepository) {
				wantCondition(t, g, meta.ReadyCondition, metav1.ConditionTrue, meta.SucceededReason, readyMessage(rev1))
				wantNoCondition(t, g, sourcev1.FetchFailedCondition)
			},
			events: []Event{{Type: corev1.EventTypeNormal, Reason: meta.SucceededReason, Message: "stored artifact for commit '" + rev1 + "'", Revision: rev1, Digest: "sha256:a"}},
		},
		{
			name: "a stale outcome from an older generation changes nothing",
			setup: func(g *sourcev1.GitRepository) {
				g.Status.ObservedGeneration = 2
				g.Status.Artifact = artifact(rev2, "sha256:b", t0.Add(time.Minute))
			},
			eventType: events.TypeArtifactStored,
			outcome:   &events.Outcome{Job: job(1, ""), Revision: rev1, Artifact: artifact(rev1, "sha256:a", t0)},
			check: func(t *testing.T, g *sourcev1.GitRepository) {
				if g.Status.Artifact.Revision != rev2 || g.Status.ObservedGeneration != 2 {
					t.Errorf("stale outcome applied: %+v gen %d", g.Status.Artifact, g.Status.ObservedGeneration)
				}
				wantNoCondition(t, g, meta.ReadyCondition)
			},
		},
		{
			name: "outcome for an older generation keeps Reconciling for the newer one",
			setup: func(g *sourcev1.GitRepository) {
				g.Generation = 2
				MarkProgressing(g, sourcekind.GitRepository().Status(g))
			},
			eventType: events.TypeArtifactStored,
			outcome:   &events.Outcome{Job: job(1, ""), Revision: rev1, Artifact: artifact(rev1, "sha256:a", t0), EventMessage: "m"},
			check: func(t *testing.T, g *sourcev1.GitRepository) {
				if !conditions.IsReconciling(g) {
					t.Error("Reconciling was cleared although generation 2 is still being processed")
				}
				if g.Status.ObservedGeneration != 1 {
					t.Errorf("observedGeneration = %d, want 1", g.Status.ObservedGeneration)
				}
			},
			events: []Event{{Type: corev1.EventTypeNormal, Reason: NewArtifactReason, Message: "m", Revision: rev1, Digest: "sha256:a"}},
		},
		{
			name:      "notices become events",
			eventType: events.TypeArtifactStored,
			outcome: &events.Outcome{Job: job(1, ""), Revision: rev1, Artifact: artifact(rev1, "sha256:a", t0), EventMessage: "m",
				Notices: []events.Notice{{Warning: true, Reason: "ArtifactVerificationFailed", Message: "failed to verify integrity of artifact: computed digest doesn't match 'sha256:z'"}}},
			check: func(t *testing.T, g *sourcev1.GitRepository) {
				wantCondition(t, g, meta.ReadyCondition, metav1.ConditionTrue, meta.SucceededReason, readyMessage(rev1))
			},
			events: []Event{
				{Type: corev1.EventTypeWarning, Reason: "ArtifactVerificationFailed", Message: "failed to verify integrity of artifact: computed digest doesn't match 'sha256:z'"},
				{Type: corev1.EventTypeNormal, Reason: NewArtifactReason, Message: "m", Revision: rev1, Digest: "sha256:a"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default", UID: "u", Generation: 1}}
			g.Status.ObservedGeneration = -1
			if tt.setup != nil {
				tt.setup(g)
			}
			got := Apply(sourcekind.GitRepository(), g, tt.eventType, tt.outcome)
			Summarize(sourcekind.GitRepository(), g) // as Patch does
			tt.check(t, g)
			if len(got) != len(tt.events) {
				t.Fatalf("events = %+v, want %+v", got, tt.events)
			}
			for i := range got {
				if got[i] != tt.events[i] {
					t.Errorf("event %d = %+v, want %+v", i, got[i], tt.events[i])
				}
			}
		})
	}
}

func wantCondition(t *testing.T, g conditions.Getter, typ string, status metav1.ConditionStatus, reason, message string) {
	t.Helper()
	c := conditions.Get(g, typ)
	if c == nil {
		t.Errorf("condition %s missing", typ)
		return
	}
	if c.Status != status || c.Reason != reason || c.Message != message {
		t.Errorf("condition %s = %s/%s/%q, want %s/%s/%q", typ, c.Status, c.Reason, c.Message, status, reason, message)
	}
}

func wantNoCondition(t *testing.T, g conditions.Getter, typ string) {
	t.Helper()
	if c := conditions.Get(g, typ); c != nil {
		t.Errorf("condition %s present: %+v", typ, c)
	}
}

func readyMessage(rev string) string { return sourcekind.GitRepository().ReadyMessage(rev) }

// TestApplyUpToDate checks Flux's trace for a no-change reconcile of the
// kinds other than GitRepository: ArtifactUpToDate with the stored
// artifact's revision, recorded but not posted.
func TestApplyUpToDate(t *testing.T) {
	b := &sourcev1.Bucket{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "default", UID: "u", Generation: 1}}
	rev := "sha256:" + strings.Repeat("ab", 32)
	b.Status.ObservedGeneration = 1
	b.Status.Artifact = artifact(rev, "sha256:d", time.Now())
	o := &events.Outcome{Job: job(1, ""), Revision: rev, Artifact: b.Status.Artifact.DeepCopy()}
	o.Job.Object.Kind = sourcev1.BucketKind

	got := Apply(sourcekind.Bucket(), b, events.TypeArtifactUnchanged, o)
	want := Event{Type: eventv1.EventTypeTrace, Reason: sourcev1.ArtifactUpToDateReason,
		Message: "artifact up-to-date with remote revision: '" + rev + "'"}
	if len(got) != 1 || got[0] != want {
		t.Errorf("events = %+v, want %+v", got, want)
	}
}

func TestApplyBucket(t *testing.T) {
	b := &sourcev1.Bucket{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "default", UID: "u", Generation: 1}}
	b.Status.ObservedGeneration = -1
	ignore := "*.txt"
	b.Spec.Ignore = &ignore
	rev := "sha256:" + strings.Repeat("ab", 32)
	a := artifact(rev, "sha256:d", time.Now())
	a.Path = "bucket/default/b/" + strings.Repeat("ab", 32) + ".tar.gz"
	a.URL = "http://srv/" + a.Path
	o := &events.Outcome{Job: job(1, ""), Revision: rev, Artifact: a,
		EventMessage: "stored artifact with 1 fetched files from 'testbucket' bucket"}
	o.Job.Object.Kind = sourcev1.BucketKind

	got := Apply(sourcekind.Bucket(), b, events.TypeArtifactStored, o)
	Summarize(sourcekind.Bucket(), b)

	c := conditions.Get(b, meta.ReadyCondition)
	if c == nil || c.Message != "stored artifact: revision '"+rev+"'" {
		t.Errorf("Ready = %+v, want Flux's Bucket message", c)
	}
	if b.Status.URL != "http://srv/bucket/default/b/latest.tar.gz" {
		t.Errorf("status.url = %q", b.Status.URL)
	}
	if b.Status.ObservedIgnore == nil || *b.Status.ObservedIgnore != ignore {
		t.Errorf("observedIgnore = %v", b.Status.ObservedIgnore)
	}
	want := []Event{{Type: corev1.EventTypeNormal, Reason: NewArtifactReason, Message: "stored artifact with 1 fetched files from 'testbucket' bucket", Revision: rev, Digest: "sha256:d"}}
	if len(got) != 1 || got[0] != want[0] {
		t.Errorf("events = %+v, want %+v", got, want)
	}
}

func TestApplyVerification(t *testing.T) {
	kind := sourcekind.GitRepository()
	newRepo := func() *sourcev1.GitRepository {
		g := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default", UID: "u", Generation: 1}}
		g.Status.ObservedGeneration = -1
		g.Spec.Verification = &sourcev1.GitRepositoryVerification{Mode: sourcev1.ModeGitHEAD}
		return g
	}
	t.Run("verified", func(t *testing.T) {
		g := newRepo()
		got := Apply(kind, g, events.TypeArtifactStored, &events.Outcome{Job: job(1, ""), Revision: rev1,
			Artifact: artifact(rev1, "sha256:a", time.Now()), EventMessage: "m",
			Verification: &events.Verification{Mode: "HEAD", Verified: true, Reason: meta.SucceededReason, Message: "verified signature of commit"}})
		wantCondition(t, g, sourcev1.SourceVerifiedCondition, metav1.ConditionTrue, meta.SucceededReason, "verified signature of commit")
		// Flux's trace for the check, before the new artifact's Event.
		want := []Event{
			{Type: eventv1.EventTypeTrace, Reason: meta.SucceededReason, Message: "verified signature of commit"},
			{Type: corev1.EventTypeNormal, Reason: NewArtifactReason, Message: "m", Revision: rev1, Digest: "sha256:a"},
		}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("events = %+v, want %+v", got, want)
		}
		if g.Status.SourceVerificationMode == nil || *g.Status.SourceVerificationMode != sourcev1.ModeGitHEAD {
			t.Errorf("sourceVerificationMode = %v", g.Status.SourceVerificationMode)
		}
	})
	t.Run("refused clears a stale FetchFailed", func(t *testing.T) {
		g := newRepo()
		conditions.MarkTrue(g, sourcev1.FetchFailedCondition, sourcev1.GitOperationFailedReason, "old")
		Apply(kind, g, events.TypeArtifactFailed, &events.Outcome{Job: job(1, ""),
			Failure:      &events.Failure{Reason: "InvalidCommitSignature", Message: "bad signature"},
			Verification: &events.Verification{Mode: "HEAD", Reason: "InvalidCommitSignature", Message: "bad signature"}})
		Summarize(kind, g)
		wantCondition(t, g, sourcev1.SourceVerifiedCondition, metav1.ConditionFalse, "InvalidCommitSignature", "bad signature")
		wantCondition(t, g, meta.ReadyCondition, metav1.ConditionFalse, "InvalidCommitSignature", "bad signature")
		wantNoCondition(t, g, sourcev1.FetchFailedCondition)
	})
	t.Run("verify removed from the spec", func(t *testing.T) {
		g := newRepo()
		conditions.MarkTrue(g, sourcev1.SourceVerifiedCondition, meta.SucceededReason, "old")
		g.Spec.Verification = nil
		Apply(kind, g, events.TypeArtifactUnchanged, &events.Outcome{Job: job(1, ""), Revision: rev1, Artifact: artifact(rev1, "sha256:a", time.Now())})
		wantNoCondition(t, g, sourcev1.SourceVerifiedCondition)
	})
}

// TestSummarize checks that Ready is derived from the other conditions in
// Flux's order, whoever wrote them.
func TestSummarize(t *testing.T) {
	type cond struct {
		typ    string
		status metav1.ConditionStatus
		reason string
	}
	tests := []struct {
		name  string
		conds []cond
		want  *cond // nil: no Ready
	}{
		{"nothing to summarize", nil, nil},
		{"artifact stored", []cond{{sourcev1.ArtifactInStorageCondition, "True", meta.SucceededReason}},
			&cond{meta.ReadyCondition, "True", meta.SucceededReason}},
		{"a new generation in progress of a source not Ready hides the stored artifact",
			[]cond{{meta.ReconcilingCondition, "True", meta.ProgressingReason}, {sourcev1.ArtifactInStorageCondition, "True", meta.SucceededReason}},
			&cond{meta.ReadyCondition, "Unknown", meta.ProgressingReason}},
		{"a new generation in progress keeps a Ready source Ready",
			[]cond{{meta.ReadyCondition, "True", meta.SucceededReason}, {meta.ReconcilingCondition, "True", meta.ProgressingReason},
				{sourcev1.ArtifactInStorageCondition, "True", meta.SucceededReason}},
			&cond{meta.ReadyCondition, "True", meta.SucceededReason}},
		{"a new generation in progress of a source never Ready",
			[]cond{{meta.ReadyCondition, "Unknown", meta.ProgressingReason}, {meta.ReconcilingCondition, "True", meta.ProgressingReason},
				{sourcev1.ArtifactInStorageCondition, "True", meta.SucceededReason}},
			&cond{meta.ReadyCondition, "Unknown", meta.ProgressingReason}},
		{"a failure shows while a new generation is in progress",
			[]cond{{meta.ReconcilingCondition, "True", meta.ProgressingReason}, {sourcev1.FetchFailedCondition, "True", "GitOperationFailed"}},
			&cond{meta.ReadyCondition, "False", "GitOperationFailed"}},
		{"stalled wins over failures",
			[]cond{{sourcev1.FetchFailedCondition, "True", "GitOperationFailed"}, {meta.StalledCondition, "True", "URLInvalid"}},
			&cond{meta.ReadyCondition, "False", "URLInvalid"}},
		{"the kind's order: storage before fetch",
			[]cond{{sourcev1.FetchFailedCondition, "True", "GitOperationFailed"},
				{sourcev1.StorageOperationFailedCondition, "True", "ArchiveOperationFailed"},
				{sourcev1.ArtifactInStorageCondition, "True", meta.SucceededReason}},
			&cond{meta.ReadyCondition, "False", "ArchiveOperationFailed"}},
		{"a failure wins over the outdated artifact",
			[]cond{{sourcev1.ArtifactOutdatedCondition, "True", "NewRevision"}, {sourcev1.IncludeUnavailableCondition, "True", "NoArtifact"}},
			&cond{meta.ReadyCondition, "False", "NoArtifact"}},
		{"a failed verification before the outdated artifact it causes",
			[]cond{{sourcev1.ArtifactOutdatedCondition, "True", "NewRevision"}, {sourcev1.SourceVerifiedCondition, "False", "InvalidCommitSignature"}},
			&cond{meta.ReadyCondition, "False", "InvalidCommitSignature"}},
		{"a failed verification",
			[]cond{{sourcev1.SourceVerifiedCondition, "False", "InvalidCommitSignature"}, {sourcev1.ArtifactInStorageCondition, "True", meta.SucceededReason}},
			&cond{meta.ReadyCondition, "False", "InvalidCommitSignature"}},
		{"a false negative condition is no failure",
			[]cond{{sourcev1.FetchFailedCondition, "False", meta.SucceededReason}, {sourcev1.ArtifactInStorageCondition, "True", meta.SucceededReason}},
			&cond{meta.ReadyCondition, "True", meta.SucceededReason}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default", Generation: 3}}
			conditions.MarkFalse(g, meta.ReadyCondition, "Stale", "from before")
			for _, c := range tt.conds {
				conditions.Set(g, &metav1.Condition{Type: c.typ, Status: c.status, Reason: c.reason, Message: c.reason + " message"})
			}
			Summarize(sourcekind.GitRepository(), g)
			got := conditions.Get(g, meta.ReadyCondition)
			switch {
			case tt.want == nil && got != nil:
				t.Errorf("Ready = %+v, want none", got)
			case tt.want == nil:
			case got == nil:
				t.Errorf("no Ready, want %+v", *tt.want)
			case got.Status != tt.want.status || got.Reason != tt.want.reason || got.ObservedGeneration != 3:
				t.Errorf("Ready = %s/%s (generation %d), want %s/%s (generation 3)", got.Status, got.Reason, got.ObservedGeneration,
					tt.want.status, tt.want.reason)
			case got.Status != "Unknown" && got.Message != tt.want.reason+" message":
				t.Errorf("Ready message = %q, want the deciding condition's", got.Message)
			}
		})
	}
}

// TestMarkFailure checks the conditions a failure owns: its own, Stalled,
// and the earlier attempts' failures it replaces.
func TestMarkFailure(t *testing.T) {
	kind := sourcekind.GitRepository()
	g := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default", Generation: 1}}
	conditions.MarkTrue(g, sourcev1.FetchFailedCondition, sourcev1.GitOperationFailedReason, "old fetch failure")
	conditions.MarkTrue(g, sourcev1.ArtifactOutdatedCondition, "NewRevision", "new upstream revision 'x'")

	MarkFailure(kind, g, failure.New(failure.Stalling, sourcev1.IncludeUnavailableCondition, "IncludeCycle",
		"include cycle detected: a -> b -> a"))
	Summarize(kind, g)
	wantCondition(t, g, sourcev1.IncludeUnavailableCondition, metav1.ConditionTrue, "IncludeCycle", "include cycle detected: a -> b -> a")
	wantCondition(t, g, meta.StalledCondition, metav1.ConditionTrue, "IncludeCycle", "include cycle detected: a -> b -> a")
	wantCondition(t, g, meta.ReadyCondition, metav1.ConditionFalse, "IncludeCycle", "include cycle detected: a -> b -> a")
	wantCondition(t, g, sourcev1.ArtifactOutdatedCondition, metav1.ConditionTrue, "NewRevision", "new upstream revision 'x'")
	wantNoCondition(t, g, sourcev1.FetchFailedCondition)

	MarkFailure(kind, g, &failure.Error{Handling: failure.Waiting, Condition: sourcev1.IncludeUnavailableCondition, Reason: "NoArtifact",
		Err: errors.New("no artifact available for include 'b'")})
	Summarize(kind, g)
	wantNoCondition(t, g, meta.StalledCondition)
	wantCondition(t, g, meta.ReadyCondition, metav1.ConditionFalse, "NoArtifact", "no artifact available for include 'b'")
}

// TestApplyHelmChart checks Flux's ArtifactInStorage for a chart: the
// build's reason and summary, kept by an unchanged outcome.
func TestApplyHelmChart(t *testing.T) {
	kind := sourcekind.HelmChart()
	c := &sourcev1.HelmChart{ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default", UID: "u", Generation: 1}}
	c.Spec.Chart = "podinfo"
	c.Status.ObservedGeneration = -1
	a := artifact("6.1.0", "sha256:c", time.Now())
	a.URL = "http://srv/helmchart/default/podinfo/podinfo-6.1.0.tgz"
	o := &events.Outcome{Job: job(1, ""), Revision: "6.1.0", Artifact: a, EventMessage: "pulled 'podinfo' chart with version '6.1.0'"}
	o.Job.Object.Kind = sourcev1.HelmChartKind
	got := Apply(kind, c, events.TypeArtifactStored, o)
	Summarize(kind, c)
	wantCondition(t, c, meta.ReadyCondition, metav1.ConditionTrue, sourcev1.ChartPullSucceededReason, "pulled 'podinfo' chart with version '6.1.0'")
	if len(got) != 1 || got[0].Reason != sourcev1.ChartPullSucceededReason {
		t.Errorf("events = %+v", got)
	}
	if c.Status.URL != a.URL {
		t.Errorf("status.url = %q", c.Status.URL)
	}
	Apply(kind, c, events.TypeArtifactUnchanged, &events.Outcome{Job: o.Job, Revision: "6.1.0", Artifact: a})
	Summarize(kind, c)
	wantCondition(t, c, meta.ReadyCondition, metav1.ConditionTrue, sourcev1.ChartPullSucceededReason, "pulled 'podinfo' chart with version '6.1.0'")
}

func TestApplyOCIRepository(t *testing.T) {
	kind := sourcekind.OCIRepository()
	r := &sourcev1.OCIRepository{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "default", UID: "u", Generation: 1}}
	r.Status.ObservedGeneration = -1
	ignore := "*.md"
	r.Spec.Ignore = &ignore
	r.Spec.LayerSelector = &sourcev1.OCILayerSelector{MediaType: "application/vnd.cncf.flux.content.v1.tar+gzip", Operation: sourcev1.OCILayerExtract}
	digest := "sha256:" + strings.Repeat("cd", 32)
	rev := "v1@" + digest
	a := artifact(rev, "sha256:d", time.Now())
	a.Path = "ocirepository/default/app/" + digest + ".tar.gz"
	a.URL = "http://srv/" + a.Path
	msg := "stored artifact with revision '" + rev + "' from 'oci://registry/app'"
	o := &events.Outcome{Job: job(1, ""), Revision: rev, Artifact: a, EventMessage: msg}
	o.Job.Object.Kind = sourcev1.OCIRepositoryKind

	got := Apply(kind, r, events.TypeArtifactStored, o)
	Summarize(kind, r)

	if c := conditions.Get(r, meta.ReadyCondition); c == nil || c.Status != metav1.ConditionTrue || c.Message != "stored artifact for digest '"+rev+"'" {
		t.Errorf("Ready = %+v, want Flux's OCIRepository message", c)
	}
	if r.Status.URL != "http://srv/ocirepository/default/app/latest.tar.gz" {
		t.Errorf("status.url = %q", r.Status.URL)
	}
	if r.Status.ObservedIgnore == nil || *r.Status.ObservedIgnore != ignore ||
		r.Status.ObservedLayerSelector == nil || *r.Status.ObservedLayerSelector != *r.Spec.LayerSelector {
		t.Errorf("observedIgnore %v, observedLayerSelector %v", r.Status.ObservedIgnore, r.Status.ObservedLayerSelector)
	}
	if want := (Event{Type: corev1.EventTypeNormal, Reason: NewArtifactReason, Message: msg, Revision: rev, Digest: "sha256:d"}); len(got) != 1 || got[0] != want {
		t.Errorf("events = %+v, want %+v", got, want)
	}

	// A changed layer selector or ignore rule forces a rebuild of the same digest.
	req := &events.FetchRequested{}
	force, err := kind.Request(context.Background(), nil, r, req)
	if err != nil || force || req.OCIRepository == nil || req.OCIRepository.URL != r.Spec.URL {
		t.Fatalf("Request = %v, %v, spec %v; want the spec and no rebuild", force, err, req.OCIRepository)
	}
	r.Spec.LayerSelector = &sourcev1.OCILayerSelector{MediaType: "application/x-other"}
	if force, _ := kind.Request(context.Background(), nil, r, req); !force {
		t.Error("a changed layer selector does not force a rebuild")
	}
	r.Spec.LayerSelector = r.Status.ObservedLayerSelector.DeepCopy()
	r.Spec.Ignore = nil
	if force, _ := kind.Request(context.Background(), nil, r, req); !force {
		t.Error("a changed ignore rule does not force a rebuild")
	}
}

func TestApplyOCIVerification(t *testing.T) {
	kind := sourcekind.OCIRepository()
	r := &sourcev1.OCIRepository{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "default", UID: "u", Generation: 1}}
	r.Status.ObservedGeneration = -1
	r.Spec.Verify = &sourcev1.OCIRepositoryVerification{Provider: "cosign", SecretRef: &meta.LocalObjectReference{Name: "cosign"}}
	rev := "v1@sha256:" + strings.Repeat("ab", 32)
	o := &events.Outcome{Job: job(1, ""), Revision: rev, Artifact: artifact(rev, "sha256:d", time.Now()),
		Verification: &events.Verification{Mode: "cosign", Verified: true, Reason: meta.SucceededReason, Message: "verified signature of revision " + rev}}
	o.Job.Object.Kind = sourcev1.OCIRepositoryKind
	Apply(kind, r, events.TypeArtifactStored, o)
	Summarize(kind, r)
	if c := conditions.Get(r, sourcev1.SourceVerifiedCondition); c == nil || c.Status != metav1.ConditionTrue || c.Message != "verified signature of revision "+rev {
		t.Errorf("SourceVerified = %+v", c)
	}
	if force, _ := kind.Request(context.Background(), nil, r, &events.FetchRequested{}); force {
		t.Error("a verified artifact is rebuilt")
	}

	failed := &events.Outcome{Job: job(2, ""), Revision: "v2@sha256:" + strings.Repeat("cd", 32),
		Failure:      &events.Failure{Reason: sourcev1.VerificationError, Message: "no matching signatures were found"},
		Verification: &events.Verification{Mode: "cosign", Reason: sourcev1.VerificationError, Message: "no matching signatures were found"}}
	failed.Job.Object.Kind = sourcev1.OCIRepositoryKind
	Apply(kind, r, events.TypeArtifactFailed, failed)
	Summarize(kind, r)
	if c := conditions.Get(r, sourcev1.SourceVerifiedCondition); c == nil || c.Status != metav1.ConditionFalse || c.Reason != sourcev1.VerificationError {
		t.Errorf("SourceVerified = %+v, want False VerificationError", c)
	}
	if c := conditions.Get(r, meta.ReadyCondition); c == nil || c.Status != metav1.ConditionFalse || c.Reason != sourcev1.VerificationError {
		t.Errorf("Ready = %+v, want False VerificationError", c)
	}
	if force, _ := kind.Request(context.Background(), nil, r, &events.FetchRequested{}); !force {
		t.Error("an artifact whose verification failed is not fetched again")
	}
	r.Spec.Verify = nil
	Apply(kind, r, events.TypeArtifactUnchanged, &events.Outcome{Job: job(2, ""), Revision: rev, Artifact: r.Status.Artifact})
	if c := conditions.Get(r, sourcev1.SourceVerifiedCondition); c != nil {
		t.Errorf("SourceVerified %+v stays after spec.verify is removed", c)
	}
}

// TestApplyOutdated checks ArtifactOutdated after a failed job, per kind:
// Flux's NewRevision for most kinds, a HelmChart's NewChart with its
// build summary, set only once it has an artifact.
func TestApplyOutdated(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fail := &events.Failure{Condition: sourcev1.FetchFailedCondition, Reason: "ChartPullError", Message: "chart pull error: refused"}
	git := func(a *meta.Artifact) sourcekind.Object {
		g := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default", UID: "u", Generation: 1}}
		g.Status.Artifact = a
		return g
	}
	chart := func(name, observed string, a *meta.Artifact) sourcekind.Object {
		c := &sourcev1.HelmChart{ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default", UID: "u", Generation: 1}}
		c.Spec.Chart, c.Status.ObservedChartName, c.Status.Artifact = name, observed, a
		return c
	}
	for _, tc := range []struct {
		name     string
		kind     sourcekind.Kind
		obj      sourcekind.Object
		revision string
		reason   string // empty: no ArtifactOutdated
		message  string
	}{
		{name: "git new revision", kind: sourcekind.GitRepository(), obj: git(artifact(rev1, "sha256:a", t0)), revision: rev2,
			reason: NewRevisionReason, message: "new upstream revision '" + rev2 + "'"},
		{name: "git first revision", kind: sourcekind.GitRepository(), obj: git(nil), revision: rev1,
			reason: NewRevisionReason, message: "new upstream revision '" + rev1 + "'"},
		{name: "git same revision", kind: sourcekind.GitRepository(), obj: git(artifact(rev1, "sha256:a", t0)), revision: rev1},
		{name: "git nothing resolved", kind: sourcekind.GitRepository(), obj: git(artifact(rev1, "sha256:a", t0))},
		{name: "chart new version", kind: sourcekind.HelmChart(), obj: chart("podinfo", "podinfo", artifact("6.1.0", "sha256:a", t0)), revision: "6.2.0",
			reason: sourcekind.NewChartReason, message: "new 'podinfo' chart with version '6.2.0'"},
		{name: "chart from a path", kind: sourcekind.HelmChart(), obj: chart("./charts/podinfo", "./charts/podinfo", artifact("6.1.0", "sha256:a", t0)),
			revision: "6.2.0+3", reason: sourcekind.NewChartReason, message: "new 'podinfo' chart with version '6.2.0+3'"},
		{name: "chart renamed", kind: sourcekind.HelmChart(), obj: chart("podinfo-lite", "podinfo", artifact("6.1.0", "sha256:a", t0)), revision: "6.1.0",
			reason: sourcekind.NewChartReason, message: "new 'podinfo-lite' chart with version '6.1.0'"},
		{name: "chart without artifact", kind: sourcekind.HelmChart(), obj: chart("podinfo", "", nil), revision: "6.2.0"},
		{name: "chart same version", kind: sourcekind.HelmChart(), obj: chart("podinfo", "podinfo", artifact("6.1.0", "sha256:a", t0)), revision: "6.1.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &events.Outcome{Job: job(1, ""), Revision: tc.revision, Failure: fail}
			o.Job.Object.Kind = tc.kind.Name
			Apply(tc.kind, tc.obj, events.TypeArtifactFailed, o)
			if tc.reason == "" {
				wantNoCondition(t, tc.obj, sourcev1.ArtifactOutdatedCondition)
				return
			}
			wantCondition(t, tc.obj, sourcev1.ArtifactOutdatedCondition, metav1.ConditionTrue, tc.reason, tc.message)
		})
	}
}

// TestApplyHelmChartVerification checks SourceVerified of a HelmChart
// whose spec.verify checks an OCI chart's signature, and that a chart
// not verified is pulled again.
func TestApplyHelmChartVerification(t *testing.T) {
	kind := sourcekind.HelmChart()
	c := &sourcev1.HelmChart{ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default", UID: "u", Generation: 1}}
	c.Spec.Chart = "podinfo"
	c.Spec.Verify = &sourcev1.HelmChartVerification{Provider: "cosign", SecretRef: &meta.LocalObjectReference{Name: "cosign"}}
	c.Status.ObservedGeneration = -1
	o := &events.Outcome{Job: job(1, ""), Revision: "1.0.0", Artifact: artifact("1.0.0", "sha256:c", time.Now()),
		EventMessage: "pulled 'podinfo' chart with version '1.0.0'",
		Verification: &events.Verification{Mode: "cosign", Verified: true, Reason: meta.SucceededReason, Message: "verified signature of version 1.0.0"}}
	o.Job.Object.Kind = sourcev1.HelmChartKind
	Apply(kind, c, events.TypeArtifactStored, o)
	Summarize(kind, c)
	wantCondition(t, c, sourcev1.SourceVerifiedCondition, metav1.ConditionTrue, meta.SucceededReason, "verified signature of version 1.0.0")
	wantCondition(t, c, meta.ReadyCondition, metav1.ConditionTrue, sourcev1.ChartPullSucceededReason, "pulled 'podinfo' chart with version '1.0.0'")

	msg := "chart verification error: no matching signatures were found for 'registry/charts/podinfo:2.0.0'"
	failed := &events.Outcome{Job: job(1, ""), Revision: "2.0.0",
		Failure:      &events.Failure{Condition: sourcev1.BuildFailedCondition, Reason: "ChartVerificationError", Message: msg},
		Verification: &events.Verification{Mode: "cosign", Reason: sourcev1.VerificationError, Message: msg}}
	failed.Job.Object.Kind = sourcev1.HelmChartKind
	got := Apply(kind, c, events.TypeArtifactFailed, failed)
	Summarize(kind, c)
	wantCondition(t, c, sourcev1.SourceVerifiedCondition, metav1.ConditionFalse, sourcev1.VerificationError, msg)
	wantCondition(t, c, sourcev1.BuildFailedCondition, metav1.ConditionTrue, "ChartVerificationError", msg)
	wantCondition(t, c, meta.ReadyCondition, metav1.ConditionFalse, "ChartVerificationError", msg)
	wantCondition(t, c, sourcev1.ArtifactOutdatedCondition, metav1.ConditionTrue, "NewChart", "new 'podinfo' chart with version '2.0.0'")
	if want := (Event{Type: corev1.EventTypeWarning, Reason: "ChartVerificationError", Message: msg}); len(got) != 1 || got[0] != want {
		t.Errorf("events = %+v, want %+v", got, want)
	}
	if c.Status.Artifact == nil || c.Status.Artifact.Revision != "1.0.0" {
		t.Errorf("artifact = %+v, want the last verified one kept", c.Status.Artifact)
	}

	c.Spec.Verify = nil
	Apply(kind, c, events.TypeArtifactUnchanged, &events.Outcome{Job: job(1, ""), Revision: "1.0.0", Artifact: c.Status.Artifact})
	wantNoCondition(t, c, sourcev1.SourceVerifiedCondition)
}

// TestReannounce checks the Event recorded again for a redelivered stored
// outcome: only when the status holds exactly the outcome's artifact,
// which an earlier attempt applied.
func TestReannounce(t *testing.T) {
	at := time.Now().Truncate(time.Second)
	stored := &events.Outcome{Job: job(1, ""), Revision: rev2, Artifact: artifact(rev2, "sha256:b", at), EventMessage: "stored artifact for commit 'Change'"}
	tests := []struct {
		name      string
		status    *meta.Artifact
		eventType string
		outcome   *events.Outcome
		want      []Event
	}{
		{name: "applied by an earlier attempt", status: artifact(rev2, "sha256:b", at), eventType: events.TypeArtifactStored, outcome: stored,
			want: []Event{{Type: corev1.EventTypeNormal, Reason: NewArtifactReason, Message: "stored artifact for commit 'Change'", Revision: rev2, Digest: "sha256:b"}}},
		{name: "not applied yet", status: artifact(rev1, "sha256:a", at.Add(-time.Hour)), eventType: events.TypeArtifactStored, outcome: stored},
		{name: "no artifact yet", eventType: events.TypeArtifactStored, outcome: stored},
		{name: "same digest stored again later", status: artifact(rev2, "sha256:b", at.Add(time.Minute)), eventType: events.TypeArtifactStored, outcome: stored},
		{name: "unchanged", status: artifact(rev2, "sha256:b", at), eventType: events.TypeArtifactUnchanged, outcome: stored},
		{name: "failed", status: artifact(rev2, "sha256:b", at), eventType: events.TypeArtifactFailed,
			outcome: &events.Outcome{Job: job(1, ""), Failure: &events.Failure{Condition: sourcev1.FetchFailedCondition, Reason: "x", Message: "y"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default", UID: "u", Generation: 1}}
			g.Status.Artifact = tt.status
			got := Reannounce(sourcekind.GitRepository(), g, tt.eventType, tt.outcome)
			if len(got) != len(tt.want) {
				t.Fatalf("events = %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("event %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// TestApplyRateLimited checks a source its host holds: the stored
// artifact stays, FetchFailed and Ready=False say RateLimited with when
// the next attempt is, Reconciling is True (ProgressingWithRetry), and one
// Warning is recorded when the throttling starts, none for the attempts
// that follow while it lasts; a success ends it.
func TestApplyRateLimited(t *testing.T) {
	kind := sourcekind.GitRepository()
	g := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default", UID: "u", Generation: 1}}
	g.Status.ObservedGeneration = -1
	stored := artifact(rev1, "sha256:a", time.Now())
	Apply(kind, g, events.TypeArtifactStored, &events.Outcome{Job: job(1, ""), Revision: rev1, Artifact: stored, EventMessage: "m"})
	Summarize(kind, g)
	limited := func(msg string) []Event {
		evs := Apply(kind, g, events.TypeArtifactFailed, &events.Outcome{Job: job(1, ""),
			Failure: &events.Failure{Condition: sourcev1.FetchFailedCondition, Reason: "RateLimited", Message: msg, RetryAfterMilliseconds: 40_000}})
		Summarize(kind, g)
		return evs
	}
	first := limited("rate limited by github.com, next attempt in 40s")
	if len(first) != 1 || first[0].Type != corev1.EventTypeWarning || first[0].Reason != "RateLimited" {
		t.Errorf("events when the throttling starts = %+v, want one RateLimited Warning", first)
	}
	wantCondition(t, g, meta.ReadyCondition, metav1.ConditionFalse, "RateLimited", "rate limited by github.com, next attempt in 40s")
	wantCondition(t, g, meta.ReconcilingCondition, metav1.ConditionTrue, meta.ProgressingWithRetryReason, "rate limited by github.com, next attempt in 40s")
	if g.Status.Artifact == nil || g.Status.Artifact.Digest != "sha256:a" {
		t.Errorf("the stored artifact left status: %+v", g.Status.Artifact)
	}
	if again := limited("rate limited by github.com, next attempt in 12s"); len(again) != 0 {
		t.Errorf("events while throttled = %+v, want none", again)
	}
	wantCondition(t, g, sourcev1.FetchFailedCondition, metav1.ConditionTrue, "RateLimited", "rate limited by github.com, next attempt in 12s")
	Apply(kind, g, events.TypeArtifactUnchanged, &events.Outcome{Job: job(1, ""), Revision: rev1, Artifact: stored})
	Summarize(kind, g)
	wantNoCondition(t, g, meta.ReconcilingCondition)
	wantCondition(t, g, meta.ReadyCondition, metav1.ConditionTrue, meta.SucceededReason, kind.ReadyMessage(rev1))
}
