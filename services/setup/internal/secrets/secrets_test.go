package secrets

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/natskeys"
)

// apiServer is the envtest API server every test shares, each in a
// namespace of its own; nil without envtest's binaries.
var apiServer kubernetes.Interface

// TestMain starts a real API server (kube-apiserver and etcd from
// KUBEBUILDER_ASSETS, as `make test` provides them). Without the binaries
// the tests run against client-go's fake clientset, which knows
// AlreadyExists but not an API server's every behaviour.
func TestMain(m *testing.M) {
	os.Exit(func() int {
		if os.Getenv("KUBEBUILDER_ASSETS") == "" {
			fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set: testing against the fake clientset (make test builds kube-apiserver and etcd)")
			return m.Run()
		}
		env := &envtest.Environment{}
		cfg, err := env.Start()
		if err != nil {
			_ = env.Stop() // what started before the failure
			fmt.Fprintln(os.Stderr, "start control plane:", err)
			return 1
		}
		defer func() { _ = env.Stop() }()
		if apiServer, err = kubernetes.NewForConfig(cfg); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}())
}

// namespaces counts the namespaces the tests made.
var namespaces atomic.Int32

// cluster returns a client and a fresh namespace in it.
func cluster(t *testing.T) (kubernetes.Interface, string) {
	t.Helper()
	ns := fmt.Sprintf("test-%d", namespaces.Add(1))
	if apiServer == nil {
		return fake.NewClientset(), ns
	}
	_, err := apiServer.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return apiServer, ns
}

// state is what the tests read back: every Secret's data by name.
func state(t *testing.T, c kubernetes.Interface, ns string) map[string]map[string]string {
	t.Helper()
	list, err := c.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	for _, s := range list.Items {
		data := map[string]string{}
		for k, v := range s.Data {
			data[k] = string(v)
		}
		out[s.Name] = data
	}
	return out
}

// checkConsistent checks that every seed Secret holds a user seed and the
// users Secret holds each one's public key.
func checkConsistent(t *testing.T, got map[string]map[string]string) {
	t.Helper()
	users, ok := got[natskeys.UsersSecret]
	if !ok {
		t.Fatalf("no Secret %s", natskeys.UsersSecret)
	}
	for _, id := range events.Identities() {
		seed, ok := got[natskeys.SeedSecret(id)][natskeys.SeedKey]
		if !ok {
			t.Errorf("no seed for %s", id)
			continue
		}
		pub, err := natskeys.PublicKey(seed)
		if err != nil {
			t.Errorf("%s: %v", id, err)
			continue
		}
		if users[natskeys.EnvVar(id)] != pub {
			t.Errorf("%s: %s holds %q, the seed's key is %s", id, natskeys.UsersSecret, users[natskeys.EnvVar(id)], pub)
		}
	}
}

func create(t *testing.T, c kubernetes.Interface, ns, name string, data map[string]string) {
	t.Helper()
	if _, err := c.CoreV1().Secrets(ns).Create(context.Background(), secret(ns, name, data), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestEnsure starts from each state an installation can be in, runs
// Ensure twice and checks what it created, that it kept what existed and
// that the second run changed nothing.
func TestEnsure(t *testing.T) {
	keep, keepSeed, err := natskeys.NewUser()
	if err != nil {
		t.Fatal(err)
	}
	s3 := &S3{Secret: "headwater-s3", Endpoint: "http://minio.ns.svc.cluster.local:9000", Bucket: "headwater-artifacts"}
	for _, tt := range []struct {
		name string
		s3   *S3
		// before creates what exists already.
		before func(t *testing.T, c kubernetes.Interface, ns string)
		// created and updated are the Secrets the first run makes.
		created, updated []string
		// check checks what is there after.
		check func(t *testing.T, got map[string]map[string]string)
	}{{
		name:    "empty namespace",
		created: allNATS(),
	}, {
		name:    "empty namespace with S3",
		s3:      s3,
		created: append(allNATS(), "headwater-s3"),
		check: func(t *testing.T, got map[string]map[string]string) {
			s := got["headwater-s3"]
			if s["endpoint"] != s3.Endpoint || s["bucket"] != s3.Bucket || len(s["accesskey"]) != 20 || len(s["secretkey"]) != 40 {
				t.Errorf("S3 Secret %v", s)
			}
			if _, ok := s["insecure"]; ok {
				t.Errorf("S3 Secret sets insecure for an http:// endpoint")
			}
		},
	}, {
		name: "existing S3 Secret is kept",
		s3:   s3,
		before: func(t *testing.T, c kubernetes.Interface, ns string) {
			create(t, c, ns, "headwater-s3", map[string]string{"endpoint": "s3.example.com", "bucket": "mine", "accesskey": "a", "secretkey": "b"})
		},
		created: allNATS(),
		check: func(t *testing.T, got map[string]map[string]string) {
			if got["headwater-s3"]["bucket"] != "mine" || got["headwater-s3"]["accesskey"] != "a" {
				t.Errorf("S3 Secret changed: %v", got["headwater-s3"])
			}
		},
	}, {
		name: "a seed exists: kept, users Secret made from it",
		before: func(t *testing.T, c kubernetes.Interface, ns string) {
			create(t, c, ns, natskeys.SeedSecret(events.FetcherIdentity), map[string]string{natskeys.SeedKey: keepSeed})
		},
		created: without(allNATS(), natskeys.SeedSecret(events.FetcherIdentity)),
		check: func(t *testing.T, got map[string]map[string]string) {
			if got[natskeys.UsersSecret][natskeys.EnvVar(events.FetcherIdentity)] != keep {
				t.Errorf("the fetcher's existing key was not kept")
			}
		},
	}, {
		name: "users Secret lacks an identity (an upgrade adds one)",
		before: func(t *testing.T, c kubernetes.Interface, ns string) {
			k, err := natskeys.Generate()
			if err != nil {
				t.Fatal(err)
			}
			users := map[string]string{"OTHER_NKEY": "kept"}
			for _, id := range events.Identities() {
				if id == events.DispatcherIdentity {
					continue
				}
				create(t, c, ns, natskeys.SeedSecret(id), map[string]string{natskeys.SeedKey: k.Seed[id]})
				users[natskeys.EnvVar(id)] = k.Public[id]
			}
			create(t, c, ns, natskeys.UsersSecret, users)
		},
		created: []string{natskeys.SeedSecret(events.DispatcherIdentity)},
		updated: []string{natskeys.UsersSecret},
		check: func(t *testing.T, got map[string]map[string]string) {
			if got[natskeys.UsersSecret]["OTHER_NKEY"] != "kept" {
				t.Errorf("an entry of the users Secret was dropped")
			}
		},
	}, {
		name: "a seed Secret was deleted to rotate its key",
		before: func(t *testing.T, c kubernetes.Interface, ns string) {
			users := map[string]string{}
			for _, id := range events.Identities() {
				users[natskeys.EnvVar(id)] = keep
			}
			create(t, c, ns, natskeys.UsersSecret, users)
			for _, id := range events.Identities() {
				create(t, c, ns, natskeys.SeedSecret(id), map[string]string{natskeys.SeedKey: keepSeed})
			}
			if err := c.CoreV1().Secrets(ns).Delete(context.Background(), natskeys.SeedSecret(events.WatcherIdentity), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		},
		created: []string{natskeys.SeedSecret(events.WatcherIdentity)},
		updated: []string{natskeys.UsersSecret},
		check: func(t *testing.T, got map[string]map[string]string) {
			if got[natskeys.UsersSecret][natskeys.EnvVar(events.WatcherIdentity)] == keep {
				t.Errorf("the watcher's rotated key is not in the users Secret")
			}
		},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			c, ns := cluster(t)
			if tt.before != nil {
				tt.before(t, c, ns)
			}
			spec := Spec{Namespace: ns, S3: tt.s3}
			actions, err := Ensure(context.Background(), c.CoreV1(), spec)
			if err != nil {
				t.Fatal(err)
			}
			var created, updated []string
			for _, a := range actions {
				if a.Verb == "created" {
					created = append(created, a.Secret)
				} else {
					updated = append(updated, a.Secret)
				}
			}
			if fmt.Sprint(created) != fmt.Sprint(tt.created) || fmt.Sprint(updated) != fmt.Sprint(tt.updated) {
				t.Errorf("created %v and updated %v, want %v and %v", created, updated, tt.created, tt.updated)
			}
			first := state(t, c, ns)
			checkConsistent(t, first)
			if tt.check != nil {
				tt.check(t, first)
			}
			// Again: nothing to do, nothing changed.
			actions, err = Ensure(context.Background(), c.CoreV1(), spec)
			if err != nil {
				t.Fatal(err)
			}
			if len(actions) != 0 {
				t.Errorf("a second run did %v", actions)
			}
			if fmt.Sprint(state(t, c, ns)) != fmt.Sprint(first) {
				t.Errorf("a second run changed the Secrets")
			}
		})
	}
}

// TestEnsureRefusesABadSeed leaves a Secret it cannot read as an NKey seed
// alone and says how to replace it.
func TestEnsureRefusesABadSeed(t *testing.T) {
	c, ns := cluster(t)
	create(t, c, ns, natskeys.SeedSecret(events.PackagerIdentity), map[string]string{natskeys.SeedKey: "not a seed"})
	_, err := Ensure(context.Background(), c.CoreV1(), Spec{Namespace: ns})
	if err == nil || !strings.Contains(err.Error(), natskeys.SeedSecret(events.PackagerIdentity)) {
		t.Fatalf("Ensure: %v, want an error naming the Secret", err)
	}
	if got := state(t, c, ns)[natskeys.SeedSecret(events.PackagerIdentity)][natskeys.SeedKey]; got != "not a seed" {
		t.Errorf("the Secret was replaced")
	}
}

// TestEnsureConcurrently runs several Ensure at once, as two Jobs (or a Job
// and an operator) may: all succeed, and they agree on one key per
// identity.
func TestEnsureConcurrently(t *testing.T) {
	c, ns := cluster(t)
	const runs = 4
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range runs {
		wg.Go(func() {
			if _, err := Ensure(context.Background(), c.CoreV1(), Spec{Namespace: ns, S3: &S3{Secret: "headwater-s3", Endpoint: "minio:9000", Bucket: "b", Insecure: true}}); err != nil {
				t.Error(err)
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		return
	}
	got := state(t, c, ns)
	checkConsistent(t, got)
	if got["headwater-s3"]["insecure"] != "true" {
		t.Errorf("S3 Secret %v lacks insecure", got["headwater-s3"])
	}
}

func TestGenerate(t *testing.T) {
	list, err := Generate(Spec{Namespace: "ops", S3: &S3{Secret: "headwater-s3", Endpoint: "e", Bucket: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]string{}
	for _, s := range list {
		if s.Namespace != "ops" {
			t.Errorf("Secret %s in namespace %q", s.Name, s.Namespace)
		}
		data := map[string]string{}
		for k, v := range s.Data {
			data[k] = string(v)
		}
		got[s.Name] = data
	}
	checkConsistent(t, got)
	if len(got) != len(events.Identities())+2 {
		t.Errorf("%d Secrets, want a seed per identity, the users and the S3 Secret", len(got))
	}
	if _, err := Generate(Spec{}); err == nil {
		t.Error("no error without a namespace")
	}
}

// allNATS lists the NATS Secrets in the order Ensure makes them.
func allNATS() []string {
	var out []string
	for _, id := range events.Identities() {
		out = append(out, natskeys.SeedSecret(id))
	}
	return append(out, natskeys.UsersSecret)
}

func without(list []string, name string) []string {
	var out []string
	for _, s := range list {
		if s != name {
			out = append(out, s)
		}
	}
	return out
}

// TestGeneratePluginKinds: a plug-in kind's fetcher gets a seed Secret of
// its own and a user in the NATS server's list.
func TestGeneratePluginKinds(t *testing.T) {
	out, err := Generate(Spec{Namespace: "hw", PluginKinds: []string{"HTTPSource"}})
	if err != nil {
		t.Fatal(err)
	}
	var seed, user bool
	for _, s := range out {
		switch s.Name {
		case "headwater-nats-plugin-httpsource":
			seed = strings.HasPrefix(string(s.Data["nkey"]), "SU")
		case "headwater-nats-users":
			user = strings.HasPrefix(string(s.Data["PLUGIN_HTTPSOURCE_NKEY"]), "U")
		}
	}
	if !seed || !user {
		t.Errorf("plug-in identity: seed Secret %t, user %t", seed, user)
	}
}
