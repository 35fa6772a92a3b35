package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// TestConfigAndKeysMakeTheDeployedServer parses the generated authorization
// block as the NATS server does, with the public keys of generated keys in
// its environment, and checks that it admits exactly Headwater's identities
// with the permissions pkg/events gives them.
func TestConfigAndKeysMakeTheDeployedServer(t *testing.T) {
	dir := t.TempDir()
	var conf bytes.Buffer
	if err := run([]string{"config"}, &conf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "auth.conf"), conf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	main := "listen: 127.0.0.1:-1\ninclude ./auth.conf\n"
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(dir, "keys")
	if err := run([]string{"keys", "-dir", keys}, nil); err != nil {
		t.Fatal(err)
	}
	env, err := os.ReadFile(filepath.Join(keys, "users.env"))
	if err != nil {
		t.Fatal(err)
	}
	public := map[string]string{}
	for _, line := range strings.Fields(string(env)) {
		name, value, _ := strings.Cut(line, "=")
		t.Setenv(name, value)
		public[name] = value
	}

	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatalf("the NATS server rejects the configuration: %v", err)
	}
	if len(opts.Nkeys) != len(events.Identities()) {
		t.Fatalf("%d users, want one per identity (%d)", len(opts.Nkeys), len(events.Identities()))
	}
	for _, id := range events.Identities() {
		seed, err := os.ReadFile(filepath.Join(keys, id+".nk"))
		if err != nil {
			t.Fatal(err)
		}
		kp, err := nkeys.FromSeed(seed)
		if err != nil {
			t.Fatalf("%s: seed: %v", id, err)
		}
		pub, _ := kp.PublicKey()
		if pub != public[EnvVar(id)] {
			t.Errorf("%s: seed and public key differ", id)
		}
		i := slices.IndexFunc(opts.Nkeys, func(u *server.NkeyUser) bool { return u.Nkey == pub })
		if i < 0 {
			t.Errorf("%s: no user with its key", id)
			continue
		}
		want, _ := events.Permissions(id)
		got := opts.Nkeys[i].Permissions
		if len(want.Publish) == 0 {
			if got.Publish == nil || !slices.Equal(got.Publish.Deny, []string{">"}) {
				t.Errorf("%s may publish: %+v", id, got.Publish)
			}
		} else if !slices.Equal(got.Publish.Allow, want.Publish) {
			t.Errorf("%s publishes %q, want %q", id, got.Publish.Allow, want.Publish)
		}
		if !slices.Equal(got.Subscribe.Allow, want.Subscribe) {
			t.Errorf("%s subscribes %q, want %q", id, got.Subscribe.Allow, want.Subscribe)
		}
	}
}

func TestSecretsHoldEveryKey(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"keys", "-namespace", "ops"}, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, id := range events.Identities() {
		if !strings.Contains(s, "name: headwater-nats-"+id+"\n  namespace: ops\n") || !strings.Contains(s, "  "+EnvVar(id)+": U") {
			t.Errorf("no Secret or public key for %s in:\n%s", id, s)
		}
	}
	if strings.Count(s, "  nkey: SU") != len(events.Identities()) {
		t.Errorf("want one user seed per identity in:\n%s", s)
	}
}
