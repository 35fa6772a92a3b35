// Package walkthrough is what `make run` shows once Headwater is up: the
// Flux GitRepository walkthrough on a sample repository served locally,
// with the CloudEvents it produces printed as they arrive, and the commands
// a user needs to look further.
package walkthrough

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// The sample GitRepository, as in the issue and Flux's documentation.
const (
	Name      = "podinfo"
	Namespace = "default"
	Branch    = "master"
)

// manifest is the GitRepository `make run` applies; %s is the clone URL.
const manifest = `apiVersion: source.toolkit.fluxcd.io/v1
kind: GitRepository
metadata:
  name: podinfo
  namespace: default
spec:
  interval: 5m0s
  url: %s
  ref:
    branch: master
`

// Printer writes the runner's output; it is safe for concurrent use, since
// CloudEvents arrive while the walkthrough prints its own progress.
type Printer struct {
	mu sync.Mutex
	w  io.Writer
}

// NewPrinter returns a Printer writing to w.
func NewPrinter(w io.Writer) *Printer { return &Printer{w: w} }

// Step prints a progress line.
func (p *Printer) Step(msg string) { p.print("==> " + msg) }

// Detail prints an indented line.
func (p *Printer) Detail(msg string) { p.print("    " + msg) }

func (p *Printer) print(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintln(p.w, line)
}

// Run creates the sample repository, subscribes to the public CloudEvents,
// applies the sample GitRepository, waits for it to become Ready and prints
// where to look next. It returns once the walkthrough is shown; the caller
// keeps the Env running.
func Run(ctx context.Context, env *harness.Env, p *Printer) (stopEvents func(), err error) {
	files, err := harness.SampleFiles()
	if err != nil {
		return nil, err
	}
	repo, err := env.NewRepo(Name, Branch)
	if err != nil {
		return nil, fmt.Errorf("sample repository: %w", err)
	}
	if err := repo.Write(files); err != nil {
		return nil, fmt.Errorf("sample repository: %w", err)
	}
	commit, err := repo.Commit("Add podinfo sample")
	if err != nil {
		return nil, fmt.Errorf("sample repository: %w", err)
	}
	url := env.Git.RepoURL(Name)
	p.Step(fmt.Sprintf("sample repository %s at commit %s (work tree %s)", url, commit, repo.Dir))

	subscriberAuth, err := env.NATSOption(events.SubscriberIdentity)
	if err != nil {
		return nil, err
	}
	stopEvents, err = harness.SubscribeEvents(env.NATSURL, subscriberAuth, func(subject string, m *events.Message, err error) {
		p.Detail(describeEvent(subject, m, err))
	})
	if err != nil {
		return nil, err
	}
	p.Step("subscribed to CloudEvents on " + harness.PublicEvents)

	path := filepath.Join(env.Config.Dir, "podinfo.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, manifest, url), 0o644); err != nil {
		stopEvents()
		return nil, fmt.Errorf("write manifest: %w", err)
	}
	out, err := env.Kubectl(ctx, "apply", "-f", path)
	if err != nil {
		stopEvents()
		return nil, err
	}
	p.Step("kubectl apply -f " + path + ": " + strings.TrimSpace(out))

	obj, err := waitReady(ctx, env.Client, p)
	if err != nil {
		stopEvents()
		return nil, err
	}
	out, err = env.Kubectl(ctx, "get", "gitrepository", "-n", Namespace)
	if err != nil {
		stopEvents()
		return nil, err
	}
	p.Step("kubectl get gitrepository")
	for line := range strings.SplitSeq(strings.TrimRight(out, "\n"), "\n") {
		p.Detail(line)
	}
	p.Step("artifact " + obj.Status.Artifact.URL)
	printNextSteps(env, p, obj, repo.Dir)
	return stopEvents, nil
}

// waitReady polls the sample GitRepository until it is Ready with an
// artifact for its current generation, printing each new Ready message.
func waitReady(ctx context.Context, c client.Client, p *Printer) (*sourcev1.GitRepository, error) {
	p.Step("waiting for gitrepository/podinfo to become Ready")
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		var obj sourcev1.GitRepository
		err := c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: Name}, &obj)
		if err == nil {
			ready := apimeta.FindStatusCondition(obj.Status.Conditions, meta.ReadyCondition)
			if ready != nil {
				line := fmt.Sprintf("Ready=%s %s: %s", ready.Status, ready.Reason, ready.Message)
				if line != last {
					p.Detail(line)
					last = line
				}
			}
			if apimeta.IsStatusConditionTrue(obj.Status.Conditions, meta.ReadyCondition) &&
				obj.Status.ObservedGeneration == obj.Generation && obj.Status.Artifact != nil {
				return &obj, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for gitrepository/podinfo: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// describeEvent is the line printed for one CloudEvent.
func describeEvent(subject string, m *events.Message, err error) string {
	if err != nil {
		return fmt.Sprintf("event on %s that does not decode: %v", subject, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "event %s %s", m.Event.Type(), m.Event.Subject())
	if o, ok := m.Data.(*events.Outcome); ok {
		if o.Revision != "" {
			fmt.Fprintf(&b, " revision=%s", o.Revision)
		}
		if o.Artifact != nil && o.Artifact.URL != "" {
			fmt.Fprintf(&b, " url=%s", o.Artifact.URL)
		}
		if o.Failure != nil {
			fmt.Fprintf(&b, " reason=%s message=%q", o.Failure.Reason, o.Failure.Message)
		}
	}
	return b.String()
}

// printNextSteps tells the user how to look at what runs.
func printNextSteps(env *harness.Env, p *Printer, obj *sourcev1.GitRepository, workTree string) {
	kubectl := filepath.Join(env.Config.AssetsDir, "kubectl")
	lines := []string{
		"",
		"Headwater is running. Point kubectl at it:",
		"",
		"  export KUBECONFIG=" + env.Kubeconfig,
		"  " + kubectl + " get gitrepository podinfo -o yaml",
		"  " + kubectl + " get events -n default",
		"",
		"Download the artifact:",
		"",
		"  curl -sS " + obj.Status.Artifact.URL + " | tar -tzvf -",
		"",
		"Subscribe to the CloudEvents (subject " + harness.PublicEvents + ") at " + env.NATSURL +
			" with the subscriber's key " + env.NATSIdentities.SeedFiles[events.SubscriberIdentity] + " (the bus admits only known identities).",
		"",
		"Push a commit and ask for a reconcile:",
		"",
		"  echo change >> " + filepath.Join(workTree, "README.md"),
		"  git -C " + workTree + " -c user.name=you -c user.email=you@example.com commit -qam 'Change the README'",
		"  git -C " + workTree + " push -q origin " + Branch,
		"  " + kubectl + " annotate --overwrite gitrepository/podinfo " + meta.ReconcileRequestAnnotation + "=\"$(date +%s)\"",
		"",
	}
	if env.ReceiverAddr != "" {
		lines = append(lines,
			"Or let a webhook ask: Flux's Receivers are served at http://"+env.ReceiverAddr+"/hook/<digest>:",
			"",
			"  "+kubectl+" create secret generic webhook-token --from-literal=token=change-me",
			"  printf '%s\\n' 'apiVersion: notification.toolkit.fluxcd.io/v1' 'kind: Receiver' 'metadata: {name: podinfo}' \\",
			"    'spec: {type: generic, secretRef: {name: webhook-token}, resources: [{kind: GitRepository, name: podinfo}]}' | "+kubectl+" apply -f -",
			"  curl -X POST http://"+env.ReceiverAddr+"$("+kubectl+" get receiver podinfo -o jsonpath='{.status.webhookPath}')",
			"")
	}
	lines = append(lines,
		"Service logs: "+filepath.Join(env.Config.Dir, "logs"),
		"Press Ctrl-C to stop everything.",
	)
	for _, l := range lines {
		p.print(l)
	}
}
