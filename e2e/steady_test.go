package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// steadyInterval is the interval of the steady sources: short, so the
// window sees several reconciles of each.
const steadyInterval = 2 * time.Second

// busCount counts the messages on the bus about some sources, by subject
// prefix (jobs.fetch, jobs.package, jobs.publish, events), as an
// administrator's subscription sees them.
type busCount struct {
	mu     sync.Mutex
	counts map[string]int
}

// watchBus counts, until the test ends, every job, result and public event
// about the GitRepositories whose name starts with prefix.
func watchBus(t *testing.T, prefix string) *busCount {
	t.Helper()
	auth, err := env.NATSOption(natsserver.Admin)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(env.NATSURL, auth, nats.Name("headwater-e2e-steady"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	b := &busCount{counts: map[string]int{}}
	record := func(m *nats.Msg) {
		msg, err := events.Decode(m.Data)
		if err != nil {
			return
		}
		var obj events.ObjectRef
		switch d := msg.Data.(type) {
		case *events.FetchRequested:
			obj = d.Job.Object
		case *events.Fetched:
			obj = d.Job.Object
		case *events.Outcome:
			obj = d.Job.Object
		default:
			return
		}
		if obj.Kind != kind || !strings.HasPrefix(obj.Name, prefix) {
			return
		}
		subject := m.Subject
		if i := strings.Index(subject, "."+strings.ToLower(kind)); i > 0 {
			subject = subject[:i]
		}
		b.mu.Lock()
		b.counts[subject]++
		b.mu.Unlock()
	}
	for _, s := range []string{"headwater.jobs.>", "headwater.events.>"} {
		if _, err := nc.Subscribe(s, record); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return b
}

// take returns the counts so far and starts counting again.
func (b *busCount) take() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.counts
	b.counts = map[string]int{}
	return c
}

// Steady sources (Ready, nothing new upstream) cost one bus message per
// reconcile, the fetch job, and the sources of one remote share its
// listing; anything that changes is reported at once.
func TestSteadySources(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const prefix = "steady-"
	repo, c1 := newRepo(t, "steady", map[string]string{"deploy/app.yaml": "replicas: 1\n"})
	url := env.Git.RepoURL("steady")
	bus := watchBus(t, prefix)
	names := []string{prefix + "a", prefix + "b", prefix + "c"}
	for _, name := range names {
		createSource(t, name, url, branch, func(o *sourcev1.GitRepository) { o.Spec.Interval = metav1.Duration{Duration: steadyInterval} })
	}
	for _, name := range names {
		waitArtifact(t, name, revision(c1))
	}
	// The outcome of a source's first steady reconcile may still be on
	// its way: count from a clean slate one interval later.
	time.Sleep(steadyInterval)
	bus.take()
	listings := env.Git.ListingsOf("steady")
	window := 6 * steadyInterval
	time.Sleep(window)
	counts := bus.take()
	listed := env.Git.ListingsOf("steady") - listings

	jobs := counts["headwater.jobs.fetch"]
	if min := len(names) * 3; jobs < min {
		t.Errorf("%d fetch jobs for %d sources in %s at a %s interval, want at least %d", jobs, len(names), window, steadyInterval, min)
	}
	for subject, n := range counts {
		if subject != "headwater.jobs.fetch" {
			t.Errorf("steady sources: %d messages on %s, want none (only fetch jobs)", n, subject)
		}
	}
	// One listing answers the three sources of the remote, checked at the
	// same moments.
	if listed == 0 || int(listed)*2 > jobs {
		t.Errorf("%d listings of the remote for %d fetch jobs, want at most half as many (shared)", listed, jobs)
	}
	for _, name := range names {
		if o := get(t, name); !o.Status.Artifact.HasRevision(revision(c1)) || condition(t, o, meta.ReadyCondition).Status != metav1.ConditionTrue {
			t.Errorf("%s: after the steady window: artifact %+v, conditions %+v", name, o.Status.Artifact, o.Status.Conditions)
		}
	}

	t.Run("a reconcile request is answered and announced", func(t *testing.T) {
		token := requestReconcile(t, names[0])
		eventually(t, "lastHandledReconcileAt "+token, func() error {
			if got := get(t, names[0]).Status.LastHandledReconcileAt; got != token {
				return fmt.Errorf("lastHandledReconcileAt %q", got)
			}
			return nil
		})
		recorder.wait(t, names[0], events.TypeArtifactUnchanged, func(o *events.Outcome) bool { return o.Job.ReconcileToken == token })
		waitKubeEvent(t, names[0], corev1.EventTypeNormal, sourcev1.GitOperationSucceedReason, func(msg string) bool {
			return strings.HasPrefix(msg, "no changes since last reconciliation")
		})
	})

	t.Run("a new commit reaches every steady source", func(t *testing.T) {
		c2 := commit(t, repo, map[string]string{"deploy/app.yaml": "replicas: 2\n"}, "Scale up")
		for _, name := range names {
			waitArtifact(t, name, revision(c2))
		}
	})

	t.Run("a spec change is observed at once", func(t *testing.T) {
		patch(t, names[1], func(o *sourcev1.GitRepository) {
			o.Spec.SecretRef = &meta.LocalObjectReference{Name: prefix + "absent"}
		})
		o := waitCondition(t, names[1], sourcev1.FetchFailedCondition, metav1.ConditionTrue, sourcev1.AuthenticationFailedReason)
		if o.Status.ObservedGeneration != o.Generation || condition(t, o, meta.ReadyCondition).Status != metav1.ConditionFalse {
			t.Errorf("after a bad secretRef: observedGeneration %d of %d, conditions %+v", o.Status.ObservedGeneration, o.Generation, o.Status.Conditions)
		}
		waitKubeEvent(t, names[1], corev1.EventTypeWarning, sourcev1.AuthenticationFailedReason, nil)
		// The other sources of the remote are not affected.
		if o := get(t, names[2]); condition(t, o, meta.ReadyCondition).Status != metav1.ConditionTrue {
			t.Errorf("%s went un-Ready with its neighbour's bad secretRef: %+v", names[2], o.Status.Conditions)
		}
	})

	t.Run("an unreachable remote is reported at once", func(t *testing.T) {
		patch(t, names[2], func(o *sourcev1.GitRepository) { o.Spec.URL = env.Git.RepoURL("steady-absent") })
		o := waitCondition(t, names[2], sourcev1.FetchFailedCondition, metav1.ConditionTrue, sourcev1.GitOperationFailedReason)
		if o.Status.Artifact == nil {
			t.Error("the stored artifact was dropped from status on a fetch failure")
		}
	})
}

// A new advertised address reaches every steady source at its next
// reconcile: the artifact-server announces it when it starts.
func TestSteadySourceAddressChange(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	e := startPrivateEnv(t, "address", func(*harness.Config) {})
	const name = "steady-address"
	_, c := e.newRepo(t, name, map[string]string{"deploy/app.yaml": "replicas: 1\n"})
	obj := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: sourcev1.GitRepositorySpec{URL: e.Git.RepoURL(name), Interval: metav1.Duration{Duration: steadyInterval},
			Reference: &sourcev1.GitRepositoryRef{Branch: branch}},
	}
	if err := e.Client.Create(t.Context(), obj); err != nil {
		t.Fatal(err)
	}
	before := e.waitArtifact(t, name, revision(c)).Status.Artifact
	if want := "http://" + e.ArtifactAddr + "/"; !strings.HasPrefix(before.URL, want) {
		t.Fatalf("artifact URL %s, want it under %s", before.URL, want)
	}
	// Steady: its reconciles are quiet from now on.
	time.Sleep(2 * steadyInterval)

	// The same server, advertised under another name.
	_, port, _ := strings.Cut(e.ArtifactAddr, ":")
	renamed := "localhost:" + port
	srv := e.Service(harness.ArtifactServer)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	for i, a := range srv.Args {
		if a == "-storage-adv-addr" {
			srv.Args[i+1] = renamed
		}
	}
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := "http://" + renamed + "/" + before.Path
	eventually(t, "artifact URL "+want, func() error {
		if got := e.get(t, name).Status.Artifact; got.URL != want || got.Digest != before.Digest {
			return fmt.Errorf("artifact %s %s", got.URL, got.Digest)
		}
		return nil
	})
	if got := sha256Digest(download(t, want)); got != before.Digest {
		t.Errorf("the artifact at its new URL has digest %s, want %s", got, before.Digest)
	}
}
