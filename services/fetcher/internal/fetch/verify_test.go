package fetch

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing/object"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/gitfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// published is one message a capturePublisher was given.
type published struct {
	subject, eventType string
	data               any
}

// capturePublisher keeps what the handler publishes, encoded and decoded
// as on the bus.
type capturePublisher struct {
	mu  sync.Mutex
	out []published
}

func (p *capturePublisher) Publish(_ context.Context, subject, eventType string, job events.Job, data any) error {
	body, err := events.Encode("fetcher", eventType, job.ID, subject, data)
	if err != nil {
		return err
	}
	m, err := events.Decode(body)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out = append(p.out, published{subject: subject, eventType: eventType, data: m.Data})
	return nil
}

// TestVerificationResults checks that a verification's result reaches the
// bus: with the Fetched job when it passes, and as a FetchFailed outcome
// with no condition, a failed Verification and no staged content when it
// does not.
func TestVerificationResults(t *testing.T) {
	e, err := openpgp.NewEntity("trusted", "", "trusted@example.com", &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA})
	must(t, err)
	var pub bytes.Buffer
	w, err := armor.Encode(&pub, openpgp.PublicKeyType, nil)
	must(t, err)
	must(t, e.Serialize(w))
	must(t, w.Close())

	root := t.TempDir()
	repo, err := gitserver.NewRepo(root, "signed", t.TempDir(), "master")
	must(t, err)
	g, err := git.PlainOpen(repo.Dir)
	must(t, err)
	commit := func(content string, key *openpgp.Entity) string {
		must(t, repo.Write(map[string]string{"README.md": content}))
		wt, err := g.Worktree()
		must(t, err)
		must(t, wt.AddWithOptions(&git.AddOptions{All: true}))
		h, err := wt.Commit(content, &git.CommitOptions{SignKey: key,
			Author: &object.Signature{Name: "Headwater", Email: "headwater@example.com", When: time.Now()}})
		must(t, err)
		must(t, repo.Git("push", "--quiet", "--all", "origin"))
		return h.String()
	}
	signed := commit("signed", e)
	must(t, repo.Git("branch", "signed"))
	unsigned := commit("unsigned", nil)
	must(t, repo.Git("push", "--quiet", "--all", "origin"))
	srv := &gitserver.Server{Root: root}
	must(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = srv.Stop() })

	scheme := runtime.NewScheme()
	must(t, corev1.AddToScheme(scheme))
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "keys"},
		Data:       map[string][]byte{"author.asc": pub.Bytes()},
	}).Build()
	store, err := storage.NewDir(t.TempDir())
	must(t, err)
	t.Cleanup(func() { _ = store.Close() })
	p := &capturePublisher{}
	h := &Handler{
		Sources:   map[string]source.Source{gitfetch.Kind: &gitfetch.Source{Secrets: secrets.NewKube(kube)}},
		Storage:   store,
		Publisher: p,
		TempDir:   t.TempDir(),
	}
	handle := func(jobID, branch string) error {
		req := &events.FetchRequested{
			Job: events.Job{ID: jobID, RequestedAt: time.Now().UTC(),
				Object: events.ObjectRef{Kind: sourcev1.GitRepositoryKind, Namespace: "default", Name: "signed", UID: "uid-1", Generation: 1}},
			GitRepository: &sourcev1.GitRepositorySpec{URL: srv.RepoURL("signed"), Reference: &sourcev1.GitRepositoryRef{Branch: branch},
				Verification: &sourcev1.GitRepositoryVerification{Mode: sourcev1.ModeGitHEAD, SecretRef: meta.LocalObjectReference{Name: "keys"}}},
		}
		body, err := events.Encode("watcher", events.TypeFetchRequested, jobID, "GitRepository/default/signed", req)
		must(t, err)
		msg, err := events.Decode(body)
		must(t, err)
		// Handle, and report a failure as the worker does.
		err = h.Handle(context.Background(), msg, bus.Delivery{Attempt: 1})
		if f := failure.As(err); f != nil {
			must(t, h.Report(context.Background(), msg, f))
		}
		return err
	}

	// Signed by the trusted key: staged, with the verification.
	must(t, handle("job-signed", "signed"))
	if len(p.out) != 1 || p.out[0].eventType != events.TypeFetched {
		t.Fatalf("published %+v, want one Fetched", p.out)
	}
	f := p.out[0].data.(*events.Fetched)
	want := events.Verification{Mode: "HEAD", Verified: true, Reason: meta.SucceededReason,
		Message: "verified signature of\n\t- commit '" + signed + "' with key '" + e.PrimaryKey.KeyIdString() + "'"}
	if f.Verification == nil || *f.Verification != want {
		t.Errorf("Fetched verification = %+v\nwant %+v", f.Verification, want)
	}

	// Not signed: a final failure, not retried, nothing staged.
	err = handle("job-unsigned", "master")
	if f := failure.As(err); f == nil || f.Handling != failure.Final {
		t.Fatalf("handler returned %v, want a final failure", err)
	}
	if len(p.out) != 2 || p.out[1].eventType != events.TypeFetchFailed {
		t.Fatalf("published %+v, want a FetchFailed after the Fetched", p.out)
	}
	out := p.out[1].data.(*events.Outcome)
	msg := "signature verification of commit '" + unsigned + "' failed: unable to verify Git commit: unable to verify payload: signature is empty"
	wantFailure := events.Failure{Reason: gitfetch.InvalidCommitSignatureReason, Message: msg}
	if out.Failure == nil || *out.Failure != wantFailure {
		t.Errorf("failure = %+v\nwant %+v", out.Failure, wantFailure)
	}
	wantVerification := events.Verification{Mode: "HEAD", Reason: gitfetch.InvalidCommitSignatureReason, Message: msg}
	if out.Verification == nil || *out.Verification != wantVerification {
		t.Errorf("failed verification = %+v\nwant %+v", out.Verification, wantVerification)
	}
	if _, err := store.Stat(context.Background(), storage.StagingKey("job-unsigned")); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("content of an unverified commit is staged (stat: %v)", err)
	}
}
