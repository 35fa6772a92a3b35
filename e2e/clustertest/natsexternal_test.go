package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bus "github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/natskeys"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// TestExternalNATS installs Headwater on a NATS JetStream it does not
// run, as deploy/components/nats-external (the chart's nats.external)
// says: a NATS server outside the cluster, on the machine's end of the
// node's link, that admits Headwater's identities with the permissions of
// deploy/base/nats/auth.conf (pkg/events); the identities' Secrets made
// by the operator, as the component's comment says, and the Secret
// headwater-nats-external with its URL. Every pod is Ready, no NATS runs
// in the cluster, the services' streams are on that server, and a
// GitRepository becomes Ready with a downloadable artifact.
func TestExternalNATS(t *testing.T) {
	requireFull(t)
	ctx := context.Background()
	ids, err := natsserver.NewIdentities(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := natsserver.Start(natsserver.Options{Host: env.C.HostIP, Port: -1, StoreDir: t.TempDir(), Users: ids.Users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	url := "nats://" + srv.Addr().String()

	// The operator's Secrets: each identity's seed, the public keys, and
	// the server's URL.
	env.EnsureNamespace(t, ns)
	users := map[string]string{}
	secrets := []*corev1.Secret{{
		ObjectMeta: metav1.ObjectMeta{Name: "headwater-nats-external", Namespace: ns},
		StringData: map[string]string{"url": url},
	}}
	for _, id := range bus.Identities() {
		seed, err := os.ReadFile(ids.SeedFiles[id])
		if err != nil {
			t.Fatal(err)
		}
		pub, err := natskeys.PublicKey(strings.TrimSpace(string(seed)))
		if err != nil {
			t.Fatal(err)
		}
		users[natskeys.EnvVar(id)] = pub
		secrets = append(secrets, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: natskeys.SeedSecret(id), Namespace: ns},
			StringData: map[string]string{natskeys.SeedKey: strings.TrimSpace(string(seed))},
		})
	}
	secrets = append(secrets, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: natskeys.UsersSecret, Namespace: ns}, StringData: users})
	for _, s := range secrets {
		if _, err := env.C.Client.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	deploy, err := filepath.Rel(dir, env.Deploy)
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%q]\ncomponents: [%q]\n",
		deploy, filepath.Join(deploy, "components", "nats-external"))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	install(t, dir)
	if list := pods(t, "nats"); len(list) > 0 {
		t.Errorf("pod %s runs with components/nats-external: the bundled NATS is not left out", list[0].Name)
	}

	cl := env.Client(t)
	_, head := newRepo(t, "external-nats", map[string]string{"app.yaml": "on an existing NATS\n"})
	gitRepository(t, cl, "default", "external-nats", "external-nats", time.Hour)
	gr := readyAt(t, cl, "default", "external-nats", head, 3*time.Minute)
	download(t, gr.Status.Artifact.URL, gr.Status.Artifact.Digest)

	jsz, err := srv.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		t.Fatal(err)
	}
	streams := map[string]bool{}
	for _, acc := range jsz.AccountDetails {
		for _, s := range acc.Streams {
			streams[s.Name] = true
		}
	}
	// The default install's services; the receiver's and the
	// dispatcher's streams come with their components.
	for _, id := range []string{bus.WatcherIdentity, bus.FetcherIdentity, bus.PackagerIdentity, bus.ArtifactServerIdentity} {
		for _, name := range bus.StreamsOf(id) {
			if !streams[name] {
				t.Errorf("stream %s of the %s is not on the external NATS (it has %v)", name, id, streams)
			}
		}
	}
	t.Logf("external NATS %s: %d clients, streams %v; GitRepository Ready at %s", url, srv.NumClients(), streams, gr.Status.Artifact.Revision)
}
