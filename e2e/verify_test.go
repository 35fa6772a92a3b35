package e2e

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// TestVerify checks spec.verify as a user sees it: a GitRepository whose
// commits (and tag) are signed with a key from its Secret is Ready with
// SourceVerified=True and status.sourceVerificationMode; an unsigned commit
// is refused (Ready=False, SourceVerified=False, a Warning Event, a failed
// CloudEvent) while the last verified artifact stays served; a new signed
// commit recovers.
func TestVerify(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	key := newSigningKey(t)

	t.Run("verify-head", func(t *testing.T) {
		t.Parallel()
		const name = "verify-head"
		repo, err := env.NewRepo(name, branch)
		if err != nil {
			t.Fatal(err)
		}
		c1 := signedCommit(t, repo, map[string]string{"README.md": "# signed\n"}, "Signed commit", key)
		createKeySecret(t, name+"-keys", key)
		createSource(t, name, env.Git.RepoURL(name), branch, func(o *sourcev1.GitRepository) {
			o.Spec.Verification = &sourcev1.GitRepositoryVerification{
				Mode: sourcev1.ModeGitHEAD, SecretRef: meta.LocalObjectReference{Name: name + "-keys"}}
		})
		ready := waitArtifact(t, name, revision(c1))
		checkVerified(t, ready, sourcev1.ModeGitHEAD,
			"verified signature of\n\t- commit '"+c1+"' with key '"+key.PrimaryKey.KeyIdString()+"'")

		// An unsigned commit is refused; the verified artifact stays.
		c2 := commit(t, repo, map[string]string{"README.md": "# not signed\n"}, "Unsigned commit")
		token := requestReconcile(t, name)
		msg := "signature verification of commit '" + c2 + "' failed: unable to verify Git commit: unable to verify payload: signature is empty"
		var obj *sourcev1.GitRepository
		eventually(t, "the unsigned commit refused", func() error {
			obj = get(t, name)
			ready := apimeta.FindStatusCondition(obj.Status.Conditions, meta.ReadyCondition)
			switch {
			case obj.Status.LastHandledReconcileAt != token:
				return fmt.Errorf("lastHandledReconcileAt %q, want %q", obj.Status.LastHandledReconcileAt, token)
			case ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != "InvalidCommitSignature":
				return fmt.Errorf("Ready %+v", ready)
			}
			return nil
		})
		if c := condition(t, obj, meta.ReadyCondition); c.Message != msg {
			t.Errorf("Ready message %q, want %q", c.Message, msg)
		}
		sv := condition(t, obj, sourcev1.SourceVerifiedCondition)
		if sv.Status != metav1.ConditionFalse || sv.Reason != "InvalidCommitSignature" || sv.Message != msg {
			t.Errorf("SourceVerified = %s %s %q, want False InvalidCommitSignature %q", sv.Status, sv.Reason, sv.Message, msg)
		}
		if c := apimeta.FindStatusCondition(obj.Status.Conditions, meta.StalledCondition); c != nil && c.Status == metav1.ConditionTrue {
			t.Errorf("a refused signature stalls the source: %+v", c)
		}
		// The stored artifact is behind the upstream revision, as Flux says.
		if c := condition(t, obj, sourcev1.ArtifactOutdatedCondition); c.Status != metav1.ConditionTrue ||
			c.Reason != "NewRevision" || c.Message != "new upstream revision '"+revision(c2)+"'" {
			t.Errorf("ArtifactOutdated = %s %s %q, want True NewRevision for %s", c.Status, c.Reason, c.Message, revision(c2))
		}
		waitKubeEvent(t, name, corev1.EventTypeWarning, "InvalidCommitSignature", func(m string) bool { return m == msg })
		recorder.wait(t, name, events.TypeArtifactFailed, func(o *events.Outcome) bool {
			v := o.Verification
			return v != nil && !v.Verified && v.Reason == "InvalidCommitSignature" && v.Message == msg
		})
		a, prev := obj.Status.Artifact, ready.Status.Artifact
		if a == nil || a.Revision != prev.Revision || a.Digest != prev.Digest {
			t.Fatalf("artifact after the refusal %+v, want the verified one %+v", a, prev)
		}
		if got := sha256Digest(download(t, a.URL)); got != a.Digest {
			t.Errorf("verified artifact downloads with digest %s, want %s", got, a.Digest)
		}
		if files := storedFiles(t, name); len(files) == 0 {
			t.Errorf("no artifact stored")
		} else if _, ok := files[c2+".tar.gz"]; ok {
			t.Errorf("an artifact of the unsigned commit is stored: %v", files)
		}

		// A new signed commit recovers.
		c3 := signedCommit(t, repo, map[string]string{"README.md": "# signed again\n"}, "Signed again", key)
		requestReconcile(t, name)
		obj = waitArtifact(t, name, revision(c3))
		checkVerified(t, obj, sourcev1.ModeGitHEAD,
			"verified signature of\n\t- commit '"+c3+"' with key '"+key.PrimaryKey.KeyIdString()+"'")
		if c := apimeta.FindStatusCondition(obj.Status.Conditions, sourcev1.ArtifactOutdatedCondition); c != nil {
			t.Errorf("ArtifactOutdated still set after recovery: %+v", c)
		}
	})

	t.Run("verify-tag-and-head", func(t *testing.T) {
		t.Parallel()
		const name = "verify-tag-and-head"
		repo, err := env.NewRepo(name, branch)
		if err != nil {
			t.Fatal(err)
		}
		c := signedCommit(t, repo, map[string]string{"README.md": "# release\n"}, "Release", key)
		tag := signedTag(t, repo, "v1.0.0", c, key)
		createKeySecret(t, name+"-keys", key)
		createSource(t, name, env.Git.RepoURL(name), "", func(o *sourcev1.GitRepository) {
			o.Spec.Reference = &sourcev1.GitRepositoryRef{Tag: "v1.0.0"}
			o.Spec.Verification = &sourcev1.GitRepositoryVerification{
				Mode: sourcev1.ModeGitTagAndHEAD, SecretRef: meta.LocalObjectReference{Name: name + "-keys"}}
		})
		obj := waitArtifact(t, name, "v1.0.0@sha1:"+c)
		id := key.PrimaryKey.KeyIdString()
		checkVerified(t, obj, sourcev1.ModeGitTagAndHEAD,
			"verified signature of\n\t- tag 'v1.0.0@"+tag+"' with key '"+id+"'\n\t- commit '"+c+"' with key '"+id+"'")
	})

	t.Cleanup(func() { requireServicesRunning(t) })
}

// checkVerified checks SourceVerified=True with Flux's message and the
// recorded verification mode.
func checkVerified(t *testing.T, obj *sourcev1.GitRepository, mode sourcev1.GitVerificationMode, msg string) {
	t.Helper()
	sv := condition(t, obj, sourcev1.SourceVerifiedCondition)
	if sv.Status != metav1.ConditionTrue || sv.Reason != meta.SucceededReason || sv.Message != msg {
		t.Errorf("SourceVerified = %s %s %q, want True Succeeded %q", sv.Status, sv.Reason, sv.Message, msg)
	}
	if m := obj.Status.SourceVerificationMode; m == nil || *m != mode {
		t.Errorf("status.sourceVerificationMode = %v, want %s", m, mode)
	}
}

// newSigningKey makes an OpenPGP key for signing commits and tags.
func newSigningKey(t *testing.T) *openpgp.Entity {
	t.Helper()
	e, err := openpgp.NewEntity("Headwater", "e2e", "headwater@example.com", &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// createKeySecret creates the Secret name holding key's armored public key
// ring, as `kubectl create secret generic --from-file=author.asc` would.
func createKeySecret(t *testing.T, name string, key *openpgp.Entity) {
	t.Helper()
	var b bytes.Buffer
	w, err := armor.Encode(&b, openpgp.PublicKeyType, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := key.Serialize(w); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Data:       map[string][]byte{"author.asc": b.Bytes()},
	}
	if err := env.Client.Create(t.Context(), s); err != nil {
		t.Fatalf("create secret %s: %v", name, err)
	}
}

// signedCommit writes files and commits them signed with key (go-git signs
// without gpg), pushes and returns the commit.
func signedCommit(t *testing.T, repo *gitserver.Repo, files map[string]string, message string, key *openpgp.Entity) string {
	t.Helper()
	if err := repo.Write(files); err != nil {
		t.Fatal(err)
	}
	g, err := git.PlainOpen(repo.Dir)
	if err != nil {
		t.Fatal(err)
	}
	wt, err := g.Worktree()
	if err != nil {
		t.Fatal(err)
	}
	if err := wt.AddWithOptions(&git.AddOptions{All: true}); err != nil {
		t.Fatal(err)
	}
	h, err := wt.Commit(message, &git.CommitOptions{SignKey: key,
		Author: &object.Signature{Name: "Headwater", Email: "headwater@example.com", When: time.Now()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Git("push", "--quiet", "--all", "origin"); err != nil {
		t.Fatal(err)
	}
	return h.String()
}

// signedTag makes an annotated tag of commit signed with key, pushes it and
// returns the tag object's hash.
func signedTag(t *testing.T, repo *gitserver.Repo, name, commit string, key *openpgp.Entity) string {
	t.Helper()
	g, err := git.PlainOpen(repo.Dir)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := g.CreateTag(name, plumbing.NewHash(commit), &git.CreateTagOptions{
		Message: "release " + name, SignKey: key,
		Tagger: &object.Signature{Name: "Headwater", Email: "headwater@example.com", When: time.Now()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Git("push", "--quiet", "origin", "refs/tags/"+name); err != nil {
		t.Fatal(err)
	}
	return ref.Hash().String()
}
