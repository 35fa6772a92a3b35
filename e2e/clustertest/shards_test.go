package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
)

// shardKey is the label of Flux's sharding docs.
const shardKey = "sharding.fluxcd.io/key"

// TestWatcherShardsOnNode installs deploy/ with components/shards on the
// node, as an operator does: the main watcher and watcher-shard1 and
// watcher-shard2, each leading a Lease of its own; a source of each goes
// Ready through its own shard only (the shards' "stored artifact" log
// lines); a source whose label moves from shard1 to shard2 keeps its
// artifact and finalizer, stays Ready, and its next revision is written by
// shard2 alone.
func TestWatcherShardsOnNode(t *testing.T) {
	requireFull(t)
	cl := env.Client(t)
	install(t, shardsInstall(t))

	kubetest.Eventually(t, 2*time.Minute, "three watcher leases, each held", func(ctx context.Context) error {
		out, err := env.C.Kubectl(ctx, "-n", ns, "get", "leases", "-o",
			`jsonpath={range .items[*]}{.metadata.name}={.spec.holderIdentity}{"\n"}{end}`).Run()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		held := 0
		for _, l := range strings.Fields(out) {
			name, holder, _ := strings.Cut(l, "=")
			if strings.HasPrefix(name, "headwater-watcher") && holder != "" {
				held++
			}
		}
		if held != 3 {
			return fmt.Errorf("watcher leases held: %d, want 3 (%s)", held, strings.Join(strings.Fields(out), " "))
		}
		return nil
	})

	files := func(name, v string) map[string]string {
		return map[string]string{"deploy/app.yaml": "kind: App\nname: " + name + "\nversion: " + v + "\n"}
	}
	sources := []struct{ name, shard, deployment string }{
		{"shard-main", "", "watcher"},
		{"shard-one", "shard1", "watcher-shard1"},
		{"shard-two", "shard2", "watcher-shard2"},
	}
	heads := map[string]string{}
	for _, s := range sources {
		_, heads[s.name] = newRepo(t, s.name, files(s.name, "1"))
		labelledGitRepository(t, cl, s.name, s.shard)
	}
	got := map[string]*sourcev1.GitRepository{}
	for _, s := range sources {
		got[s.name] = readyAt(t, cl, "default", s.name, heads[s.name], 3*time.Minute)
	}
	// Each went Ready through its own shard, and no other shard wrote it.
	for _, s := range sources {
		for _, d := range []string{"watcher", "watcher-shard1", "watcher-shard2"} {
			want := 0
			if d == s.deployment {
				want = 1
			}
			if n := storedByDeployment(t, d, s.name); n != want {
				t.Errorf("%s stored %d artifacts of %s, want %d", d, n, s.name, want)
			}
		}
	}

	// shard-one moves from shard1 to shard2.
	before := got["shard-one"]
	moved := &sourcev1.GitRepository{}
	if err := cl.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: "shard-one"}, moved); err != nil {
		t.Fatal(err)
	}
	moved.Labels[shardKey] = "shard2"
	if err := cl.Update(context.Background(), moved); err != nil {
		t.Fatalf("move shard-one to shard2: %v", err)
	}
	// The artifact and finalizer never go, and Ready stays True (the move
	// is a typed update, a new generation: the new shard keeps the stored
	// artifact's Ready while it fetches; docs/sharding.md). Sampled here;
	// TestShardTakeover (the watcher's) and TestWatcherShards (e2e) watch
	// every version.
	var notReady []string
	errWatching := fmt.Errorf("watching the move")
	err := kubetest.PollEvery(context.Background(), 10*time.Second, 200*time.Millisecond, func(ctx context.Context) error {
		obj := &sourcev1.GitRepository{}
		if err := cl.Get(ctx, types.NamespacedName{Namespace: "default", Name: "shard-one"}, obj); err != nil {
			return err
		}
		if obj.Status.Artifact == nil || obj.Status.Artifact.Digest != before.Status.Artifact.Digest {
			return fmt.Errorf("artifact %v after the move, want %s", obj.Status.Artifact, before.Status.Artifact.Digest)
		}
		if !slices.Contains(obj.Finalizers, sourcev1.SourceFinalizer) {
			return fmt.Errorf("finalizers %v after the move", obj.Finalizers)
		}
		if r := apimeta.FindStatusCondition(obj.Status.Conditions, "Ready"); r == nil || r.Status != metav1.ConditionTrue {
			notReady = append(notReady, fmt.Sprintf("%s: %+v", time.Now().Format("15:04:05.000"), r))
		}
		return errWatching // until the window ends
	})
	if !errors.Is(err, errWatching) {
		t.Fatalf("shard-one: %v", err)
	}
	if len(notReady) > 0 {
		t.Errorf("shard-one's Ready was not True during the move at: %s", strings.Join(notReady, "; "))
	}
	readyAt(t, cl, "default", "shard-one", heads["shard-one"], time.Minute)

	repo, _ := gitRepoFor(t, "shard-one")
	if err := repo.Write(files("shard-one", "2")); err != nil {
		t.Fatal(err)
	}
	head2, err := repo.Commit("second")
	if err != nil {
		t.Fatal(err)
	}
	requestReconcile(t, cl, &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "shard-one"}})
	readyAt(t, cl, "default", "shard-one", head2, 3*time.Minute)
	if n := storedByDeployment(t, "watcher-shard2", "shard-one"); n != 1 {
		t.Errorf("watcher-shard2 stored %d artifacts of shard-one after the move, want 1", n)
	}
	if n := storedByDeployment(t, "watcher-shard1", "shard-one"); n != 1 {
		t.Errorf("watcher-shard1 stored %d artifacts of shard-one, want the 1 before the move", n)
	}
	if n := storedByDeployment(t, "watcher", "shard-one"); n != 0 {
		t.Errorf("the main watcher stored %d artifacts of shard-one, want 0", n)
	}
}

// shardsInstall writes a kustomization of the test's own: deploy/ with
// components/shards.
func shardsInstall(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	deploy, err := filepath.Rel(dir, env.Deploy)
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%q]\ncomponents: [%q]\n",
		deploy, filepath.Join(deploy, "components", "shards"))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// labelledGitRepository creates a GitRepository in default of the repository
// name, labelled for shard (none when "").
func labelledGitRepository(t *testing.T, cl ctrlclient.Client, name, shard string) {
	t.Helper()
	gr := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: sourcev1.GitRepositorySpec{
			URL:       env.Git.RepoURL(name),
			Interval:  metav1.Duration{Duration: time.Hour},
			Reference: &sourcev1.GitRepositoryRef{Branch: "main"},
		},
	}
	if shard != "" {
		gr.Labels = map[string]string{shardKey: shard}
	}
	if err := cl.Create(context.Background(), gr); err != nil {
		t.Fatalf("create GitRepository %s: %v", name, err)
	}
}

// storedByDeployment counts the "stored artifact" log lines naming source
// name in the logs of every pod of a watcher Deployment (JSON, the
// default -log-format: msg and Flux's key name).
func storedByDeployment(t *testing.T, deployment, name string) int {
	t.Helper()
	n := 0
	for _, p := range pods(t, deployment) {
		logs := env.Kubectl(t, "-n", ns, "logs", p.Name, "-c", "watcher")
		for _, line := range strings.Split(logs, "\n") {
			var l struct {
				Msg  string `json:"msg"`
				Name string `json:"name"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "stored artifact" && l.Name == name {
				n++
			}
		}
	}
	return n
}
