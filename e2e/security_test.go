package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// TestForgedJobCannotExfiltrateASecret plays the attack the bus's design
// must stop: with the watcher's own key (the only identity that may publish
// fetch jobs), a job names a real source but another Secret and a URL the
// attacker serves. The fetcher checks the job against the live object and
// refuses it: the attacker's server is never contacted, and the source's
// own jobs go on.
func TestForgedJobCannotExfiltrateASecret(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "exfiltration-target"
	_, commit := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	victim := waitArtifact(t, name, revision(commit))

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "someone-elses-credentials"},
		StringData: map[string]string{"username": "admin", "password": "exfiltrate-me"}}
	if err := env.Client.Create(t.Context(), secret); err != nil {
		t.Fatal(err)
	}
	var contacted atomic.Int32
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		contacted.Add(1)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	t.Cleanup(attacker.Close)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := bus.Connect(ctx, bus.Options{URL: env.NATSURL, NKeyFile: env.NATSIdentities.SeedFiles[harness.Watcher]},
		events.WatcherIdentity, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	spec := victim.Spec.DeepCopy()
	spec.URL = attacker.URL + "/x.git"
	spec.SecretRef = &meta.LocalObjectReference{Name: secret.Name}
	job := events.Job{ID: "forged-" + name, RequestedAt: time.Now().UTC(), Object: events.ObjectRef{Kind: kind, Namespace: namespace,
		Name: name, UID: string(victim.UID), Generation: victim.Generation}}
	if err := conn.NewPublisher(events.WatcherIdentity).Publish(ctx, events.FetchSubject(kind), events.TypeFetchRequested, job,
		&events.FetchRequested{Job: job, GitRepository: spec}); err != nil {
		t.Fatal(err)
	}

	fetcher := env.Service(harness.Fetcher)
	eventually(t, "the fetcher refuses the forged job", func() error {
		if !strings.Contains(logs(t, fetcher), "forged-"+name) || !strings.Contains(logs(t, fetcher), "job does not match the live object") {
			return errors.New("not refused yet")
		}
		return nil
	})
	if n := contacted.Load(); n != 0 {
		t.Errorf("the attacker's server was contacted %d times", n)
	}
	if a := get(t, name).Status.Artifact; a == nil || a.Digest != victim.Status.Artifact.Digest {
		t.Errorf("the source's artifact changed: %+v", a)
	}
	requireServicesRunning(t)
}

// TestForgedOutcomeCannotRedirectAnArtifact plays the other attack: with
// the artifact-server's key (an identity that may publish the public events
// the watcher applies), an outcome announces an artifact the attacker
// serves for a live source, with the source's UID and generation. The
// watcher did not issue its job, so it refuses the outcome, logs and counts
// it: status.artifact, which Flux's kustomize-controller would download and
// apply, still points at the source's own artifact.
func TestForgedOutcomeCannotRedirectAnArtifact(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "forged-status-target"
	_, commit := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch)
	victim := waitArtifact(t, name, revision(commit))

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := bus.Connect(ctx, bus.Options{URL: env.NATSURL, NKeyFile: env.NATSIdentities.SeedFiles[harness.ArtifactServer]},
		events.ArtifactServerIdentity, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	watcher := env.Service(harness.Watcher)
	forgedBefore, err := metricSum(watcher.TelemetryAddr, "headwater_forged_outcomes_total")
	if err != nil {
		t.Fatal(err)
	}
	rev := "evil@sha1:" + strings.Repeat("e", 40)
	size := int64(1)
	job := events.Job{ID: "forged-" + name, RequestedAt: time.Now().UTC(), Object: events.ObjectRef{Kind: kind, Namespace: namespace,
		Name: name, UID: string(victim.UID), Generation: victim.Generation}}
	out := &events.Outcome{Job: job, Revision: rev, EventMessage: "stored artifact for commit 'evil'",
		Artifact: &meta.Artifact{Path: "gitrepository/" + namespace + "/" + name + "/evil.tar.gz", URL: "http://attacker.example/evil.tar.gz",
			Revision: rev, Digest: "sha256:" + strings.Repeat("e", 64), Size: &size, LastUpdateTime: metav1.Now()}}
	if err := conn.NewPublisher(events.ArtifactServerIdentity).Publish(ctx, events.EventSubject(kind, namespace, name),
		events.TypeArtifactStored, job, out); err != nil {
		t.Fatal(err)
	}

	eventually(t, "the watcher refuses the forged outcome", func() error {
		l := logs(t, watcher)
		if !strings.Contains(l, "forged-"+name) || !strings.Contains(l, "job not issued by this watcher") {
			return errors.New("not refused yet")
		}
		n, err := metricSum(watcher.TelemetryAddr, "headwater_forged_outcomes_total")
		if err != nil {
			return err
		}
		if n <= forgedBefore {
			return fmt.Errorf("headwater_forged_outcomes_total %v, want more than %v", n, forgedBefore)
		}
		return nil
	})
	got := get(t, name)
	if a := got.Status.Artifact; a == nil || a.URL != victim.Status.Artifact.URL || a.Digest != victim.Status.Artifact.Digest {
		t.Errorf("the forged outcome changed the artifact: %+v", a)
	}
	if got.Status.Artifact != nil && got.Status.Artifact.Revision == rev {
		t.Errorf("the forged revision reached status")
	}
	requireServicesRunning(t)
}
