package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// Reasons of the Warning Events about a stored artifact that is not usable.
const (
	artifactVerificationFailedReason = "ArtifactVerificationFailed"
	artifactMissingReason            = "ArtifactMissing"
)

// TestIntegrity damages a Ready source's stored artifact behind the
// services' back and asks for a reconcile, as `flux reconcile source git`
// does, with nothing new upstream. Bit rot (bytes overwritten in place, the
// size unchanged) gives a Warning Event ArtifactVerificationFailed in Flux's
// words; a deleted file gives a Warning Event ArtifactMissing. Each time the
// artifact is rebuilt: the file at status.artifact.path has the digest in
// status again, it and latest.tar.gz download as the tree of the commit,
// and the source is Ready. The file may be a hard link shared with the
// packager's content cache, which must not hand the damaged bytes back.
func TestIntegrity(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "integrity"
	repo, c := newRepo(t, name, sampleFiles(t))
	createSource(t, name, env.Git.RepoURL(name), branch)
	obj := waitArtifact(t, name, revision(c))
	checkStored(t, obj, c)
	want := obj.Status.Artifact
	file := filepath.Join(env.StoragePath, filepath.FromSlash(want.Path))
	tree := treeAt(t, repo, c)

	damage := []struct {
		name   string
		reason string
		// damage harms the stored artifact file.
		damage func(t *testing.T)
		// message is the Warning Event's message.
		message string
	}{
		{
			name:    "bit rot",
			reason:  artifactVerificationFailedReason,
			damage:  func(t *testing.T) { rot(t, file, 0) },
			message: fmt.Sprintf("failed to verify integrity of artifact: computed digest doesn't match '%s'", want.Digest),
		},
		{
			// The rebuilt artifact rots in turn, elsewhere.
			name:    "bit rot again",
			reason:  artifactVerificationFailedReason,
			damage:  func(t *testing.T) { rot(t, file, 1) },
			message: fmt.Sprintf("failed to verify integrity of artifact: computed digest doesn't match '%s'", want.Digest),
		},
		{
			name:   "deleted",
			reason: artifactMissingReason,
			damage: func(t *testing.T) {
				if err := os.Remove(file); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for _, d := range damage {
		if !t.Run(d.name, func(t *testing.T) {
			warnings := kubeEventCount(t, name, d.reason)
			d.damage(t)
			token := requestReconcile(t, name)

			e := waitKubeEvent(t, name, "Warning", d.reason, func(msg string) bool {
				return d.message == "" || msg == d.message
			})
			eventually(t, "another "+d.reason+" Event", func() error {
				if n := kubeEventCount(t, name, d.reason); n <= warnings {
					return fmt.Errorf("%d %s Events, as before the damage", n, d.reason)
				}
				return nil
			})
			t.Logf("Event %s %s: %s", e.Type, e.Reason, e.Message)
			if d.reason == artifactMissingReason && !strings.Contains(e.Message, want.Path) {
				t.Errorf("%s message %q does not name the artifact %s", d.reason, e.Message, want.Path)
			}
			var now *sourcev1.GitRepository
			eventually(t, "artifact rebuilt for reconcile request "+token, func() error {
				now = get(t, name)
				if now.Status.LastHandledReconcileAt != token {
					return fmt.Errorf("lastHandledReconcileAt %q", now.Status.LastHandledReconcileAt)
				}
				if !apimeta.IsStatusConditionTrue(now.Status.Conditions, meta.ReadyCondition) {
					return fmt.Errorf("not Ready: %+v", apimeta.FindStatusCondition(now.Status.Conditions, meta.ReadyCondition))
				}
				b, err := os.ReadFile(file)
				if err != nil {
					return err
				}
				if got := sha256Digest(b); got != now.Status.Artifact.Digest {
					return fmt.Errorf("%s has digest %s, status says %s", want.Path, got, now.Status.Artifact.Digest)
				}
				return nil
			})
			checkStored(t, now, c)
			// The CloudEvent of the rebuild carries the same notice.
			recorder.wait(t, name, events.TypeArtifactStored, func(o *events.Outcome) bool {
				return o.Job.ReconcileToken == token && slices.ContainsFunc(o.Notices, func(n events.Notice) bool {
					return n.Warning && n.Reason == d.reason
				})
			})
			if a := now.Status.Artifact; a.Digest != want.Digest || a.Path != want.Path || a.URL != want.URL {
				t.Errorf("rebuilt artifact %s %s %s, want the same as before %s %s %s", a.Path, a.Digest, a.URL, want.Path, want.Digest, want.URL)
			}
			for _, url := range []string{now.Status.Artifact.URL, env.ArtifactURL(path.Join(path.Dir(want.Path), "latest.tar.gz"))} {
				body := download(t, url)
				if got := sha256Digest(body); got != want.Digest {
					t.Errorf("%s downloads with digest %s, want %s", url, got, want.Digest)
					continue
				}
				if diff := diffTrees(untarArtifact(t, body), tree); diff != "" {
					t.Errorf("%s is not the tree at %s: %s", url, c, diff)
				}
			}
		}) {
			break // each step damages what the one before rebuilt
		}
	}
	t.Cleanup(func() { requireServicesRunning(t) })
}

// rot overwrites bytes of the file in place, as bit rot would: its size
// and its inode (shared by every hard link to it) stay the same. Each
// variant changes different bytes.
func rot(t *testing.T, file string, variant int) {
	t.Helper()
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) < 64 {
		t.Fatalf("%s has %d bytes, too few to damage", file, len(before))
	}
	at := int64(len(before) / (3 - variant%2)) // a third in, or the middle
	bad := make([]byte, 8)
	for i := range bad {
		bad[i] = before[int(at)+i] ^ 0xff
	}
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bad, at); err != nil {
		_ = f.Close()
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	after, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) || bytes.Equal(after, before) {
		t.Fatalf("damaging %s: %d bytes before, %d after, changed %v", file, len(before), len(after), !bytes.Equal(after, before))
	}
}
