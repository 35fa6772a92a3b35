package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// TestBadInput checks what a user sees for a source that cannot be fetched:
// Ready=False with a clear message and Flux's reason, FetchFailed=True, a
// Warning Event, a failed CloudEvent, and every service still up.
func TestBadInput(t *testing.T) {
	requireEnv(t)
	t.Parallel()

	tests := []struct {
		name string
		// url and branch of the source; setup may make the repository.
		setup func(t *testing.T, name string) (url, ref string)
		// timeout is spec.timeout, when set.
		timeout time.Duration
		inMsg   string // the message must name what is wrong; default the URL
	}{
		{
			name: "unreachable-host",
			setup: func(t *testing.T, name string) (string, string) {
				return fmt.Sprintf("http://127.0.0.1:%d/%s.git", closedPort(t), name), branch
			},
		},
		{
			// A server that accepts connections and never answers: the
			// fetch must give up after spec.timeout.
			name: "silent-host",
			setup: func(t *testing.T, name string) (string, string) {
				return fmt.Sprintf("http://%s/%s.git", silentListener(t), name), branch
			},
			timeout: 3 * time.Second,
		},
		{
			name: "missing-branch",
			setup: func(t *testing.T, name string) (string, string) {
				newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
				return env.Git.RepoURL(name), "does-not-exist"
			},
			inMsg: "does-not-exist",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			url, ref := tt.setup(t, tt.name)
			createSource(t, tt.name, url, ref, func(o *sourcev1.GitRepository) {
				if tt.timeout > 0 {
					o.Spec.Timeout = &metav1.Duration{Duration: tt.timeout}
				}
			})
			obj := waitCondition(t, tt.name, sourcev1.FetchFailedCondition, metav1.ConditionTrue, sourcev1.GitOperationFailedReason)
			inMsg := tt.inMsg
			if inMsg == "" {
				inMsg = strings.TrimPrefix(url, "http://")
			}
			checkFetchFailed(t, obj, inMsg)
			if obj.Status.Artifact != nil {
				t.Errorf("a source that never fetched has artifact %+v", obj.Status.Artifact)
			}
		})
	}

	// A source that was Ready, then pointed at a branch that does not
	// exist, keeps its artifact, in status and in storage.
	t.Run("ready-then-missing-branch", func(t *testing.T) {
		t.Parallel()
		const name = "ready-then-missing-branch"
		_, commit := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
		createSource(t, name, env.Git.RepoURL(name), branch)
		ready := waitArtifact(t, name, revision(commit))

		patch(t, name, func(o *sourcev1.GitRepository) { o.Spec.Reference.Branch = "gone" })
		obj := waitCondition(t, name, sourcev1.FetchFailedCondition, metav1.ConditionTrue, sourcev1.GitOperationFailedReason)
		checkFetchFailed(t, obj, "gone")
		a, prev := obj.Status.Artifact, ready.Status.Artifact
		if a == nil || a.Digest != prev.Digest || a.Revision != prev.Revision || a.URL != prev.URL {
			t.Fatalf("artifact after the failure %+v, want the previous one %+v", a, prev)
		}
		if got := sha256Digest(download(t, a.URL)); got != a.Digest {
			t.Errorf("previous artifact downloads with digest %s, want %s", got, a.Digest)
		}
	})

	// Credentials in the URL never reach the bus: the source stalls and
	// says where they belong, without repeating them; the bus tap checks
	// that none of urlCredentials was ever on the bus.
	for _, tc := range []struct {
		name string
		// create makes the source with a URL carrying token.
		create func(t *testing.T, name, token string)
		// wait waits for the source to stall with URLInvalid.
		wait func(t *testing.T, name string) fluxSource
	}{
		{
			name: "credentials-in-url",
			create: func(t *testing.T, name, token string) {
				newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
				createSource(t, name, strings.Replace(env.Git.RepoURL(name), "://", "://user:"+token+"@", 1), branch)
			},
			wait: func(t *testing.T, name string) fluxSource {
				return waitCondition(t, name, meta.StalledCondition, metav1.ConditionTrue, sourcev1.URLInvalidReason)
			},
		},
		{
			// A password with a character a URL must escape: the URL
			// does not parse, and still carries the token.
			name: "credentials-in-invalid-url",
			create: func(t *testing.T, name, token string) {
				newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
				createSource(t, name, strings.Replace(env.Git.RepoURL(name), "://", "://user:"+token+"%@", 1), branch)
			},
			wait: func(t *testing.T, name string) fluxSource {
				return waitCondition(t, name, meta.StalledCondition, metav1.ConditionTrue, sourcev1.URLInvalidReason)
			},
		},
		{
			name: "credentials-in-oci-url",
			create: func(t *testing.T, name, token string) {
				createOCIRepository(t, name, "oci://user:"+token+"@registry.example/"+name)
			},
			wait: func(t *testing.T, name string) fluxSource {
				return waitOCICondition(t, name, meta.StalledCondition, metav1.ConditionTrue, sourcev1.URLInvalidReason)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			token := urlCredential(tc.name)
			tc.create(t, tc.name, token)
			obj := tc.wait(t, tc.name)
			for _, typ := range []string{meta.StalledCondition, meta.ReadyCondition, sourcev1.FetchFailedCondition} {
				c := conditionOf(t, obj, typ)
				if !strings.Contains(c.Message, "spec.secretRef") || strings.Contains(c.Message, token) {
					t.Errorf("%s message %q: want it to name spec.secretRef and not the credentials", typ, c.Message)
				}
			}
			if obj.GetGeneration() != observedGeneration(obj) || obj.GetArtifact() != nil {
				t.Errorf("observedGeneration %d (generation %d), artifact %+v: want the generation observed, no artifact",
					observedGeneration(obj), obj.GetGeneration(), obj.GetArtifact())
			}
			if _, ok := obj.(*sourcev1.GitRepository); ok {
				waitKubeEvent(t, tc.name, "Warning", sourcev1.URLInvalidReason, func(msg string) bool {
					return strings.Contains(msg, "spec.secretRef")
				})
			}
		})
	}

	t.Cleanup(func() { requireServicesRunning(t) })
}

// checkFetchFailed checks the conditions, the Warning Event and the
// CloudEvent of a failed fetch whose message must contain inMsg.
func checkFetchFailed(t *testing.T, obj *sourcev1.GitRepository, inMsg string) {
	t.Helper()
	failed := condition(t, obj, sourcev1.FetchFailedCondition)
	t.Logf("FetchFailed: %s", failed.Message)
	if !strings.Contains(failed.Message, inMsg) {
		t.Errorf("FetchFailed message %q does not name %q", failed.Message, inMsg)
	}
	// Flux's words for a failed clone.
	if !strings.HasPrefix(failed.Message, "failed to checkout and determine revision") {
		t.Errorf("FetchFailed message %q, want Flux's %q", failed.Message, "failed to checkout and determine revision: ...")
	}
	ready := waitCondition(t, obj.Name, meta.ReadyCondition, metav1.ConditionFalse, sourcev1.GitOperationFailedReason)
	if c := condition(t, ready, meta.ReadyCondition); c.Message != failed.Message {
		t.Errorf("Ready message %q, want the FetchFailed message %q", c.Message, failed.Message)
	}
	waitKubeEvent(t, obj.Name, "Warning", sourcev1.GitOperationFailedReason, func(msg string) bool {
		return strings.Contains(msg, inMsg)
	})
	e := recorder.wait(t, obj.Name, events.TypeArtifactFailed, nil)
	if f := e.outcome().Failure; f == nil || f.Reason != sourcev1.GitOperationFailedReason {
		t.Errorf("failed CloudEvent carries failure %+v, want reason %s", f, sourcev1.GitOperationFailedReason)
	}
}

// silentListener accepts TCP connections on 127.0.0.1 and never answers,
// until the test ends; it returns its address.
func silentListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				for _, c := range conns {
					_ = c.Close()
				}
				return
			}
			conns = append(conns, c) // held open, never read or written
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
	})
	return l.Addr().String()
}

// observedGeneration is the status.observedGeneration of a GitRepository or
// an OCIRepository.
func observedGeneration(obj fluxSource) int64 {
	switch o := obj.(type) {
	case *sourcev1.GitRepository:
		return o.Status.ObservedGeneration
	case *sourcev1.OCIRepository:
		return o.Status.ObservedGeneration
	}
	panic(fmt.Sprintf("observedGeneration: %T", obj))
}
