package natsserver

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/natskeys"
)

// User is a NATS user that authenticates with an NKey and may publish and
// subscribe to the given subjects only.
type User struct {
	// NKey is the user's public key.
	NKey string
	// Publish and Subscribe are the subjects it may use.
	Publish, Subscribe []string
}

// Admin is the identity of an operator (and of tests that poke the bus
// directly): it may publish and subscribe to everything.
const Admin = "admin"

// Identities is a throwaway set of bus identities: for every identity of
// events.Identities, an NKey seed file and the user NATS knows it as, with
// the permissions events.Permissions gives it; and an Admin.
type Identities struct {
	// SeedFiles maps an identity to the file holding its NKey seed (the
	// services' -nats-nkey).
	SeedFiles map[string]string
	// Users are the server's side of the same identities.
	Users []User
}

// NewIdentities makes a fresh NKey for every bus identity, and for each of
// extra (plug-in fetchers' identities, events.PluginIdentity), and writes
// its seed into dir (mode 0600): what `make run`, the e2e harness and
// tests of the permissions use, so the secure path is the one tested.
func NewIdentities(dir string, extra ...string) (*Identities, error) {
	ids := &Identities{SeedFiles: map[string]string{}}
	for _, id := range slices.Concat(events.Identities(), extra, []string{Admin}) {
		pub, seed, err := NewUserKey()
		if err != nil {
			return nil, fmt.Errorf("nkey for %s: %w", id, err)
		}
		file := filepath.Join(dir, id+".nk")
		if err := os.WriteFile(file, []byte(seed), 0o600); err != nil {
			return nil, fmt.Errorf("write seed of %s: %w", id, err)
		}
		ids.SeedFiles[id] = file
		ids.Users = append(ids.Users, user(id, pub))
	}
	return ids, nil
}

// LoadIdentities reads the seeds NewIdentities wrote into dir (with the
// same extra identities) and returns the same identities: what a NATS
// server started in another process (`headwater-nats serve -keys DIR`)
// admits.
func LoadIdentities(dir string, extra ...string) (*Identities, error) {
	ids := &Identities{SeedFiles: map[string]string{}}
	for _, id := range slices.Concat(events.Identities(), extra, []string{Admin}) {
		file := filepath.Join(dir, id+".nk")
		seed, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("seed of %s: %w", id, err)
		}
		kp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
		if err != nil {
			return nil, fmt.Errorf("seed of %s: %w", id, err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("seed of %s: %w", id, err)
		}
		ids.SeedFiles[id] = file
		ids.Users = append(ids.Users, user(id, pub))
	}
	return ids, nil
}

// user is the server's side of identity, whose public key is pub.
func user(identity, pub string) User {
	perm, _ := events.Permissions(identity)
	if identity == Admin {
		perm = events.Permission{Publish: []string{">"}, Subscribe: []string{">"}}
	}
	return User{NKey: pub, Publish: perm.Publish, Subscribe: perm.Subscribe}
}

// NewUserKey makes a fresh NKey for a NATS user: its public key (what the
// server knows) and its seed (what the client signs with).
func NewUserKey() (public, seed string, err error) { return natskeys.NewUser() }

// nkeyUsers converts users to the server's form. A user with no subject
// to publish on may publish nothing at all.
func nkeyUsers(users []User) []*server.NkeyUser {
	out := make([]*server.NkeyUser, 0, len(users))
	for _, u := range users {
		p := &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: u.Publish},
			Subscribe: &server.SubjectPermission{Allow: u.Subscribe},
		}
		if len(u.Publish) == 0 {
			p.Publish = &server.SubjectPermission{Deny: []string{">"}}
		}
		out = append(out, &server.NkeyUser{Nkey: u.NKey, Permissions: p})
	}
	return out
}
