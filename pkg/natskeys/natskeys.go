// Package natskeys makes the NKeys of Headwater's bus identities
// (events.Identities) and names where an installation keeps them: the
// Secret that gives the NATS server every identity's public key, as the
// variable its configuration reads (EnvVar), and one Secret per identity
// holding the seed the service mounts as -nats-nkey.
//
// `headwater-nats keys` (files for docker compose, Secrets to apply) and
// the setup command (Secrets created in a cluster) both use it, so the
// names and formats are written once.
package natskeys

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/headwater-gitops/headwater/pkg/events"
)

const (
	// UsersSecret is the Secret holding every identity's public key, one
	// key per EnvVar: the NATS server's environment (envFrom).
	UsersSecret = "headwater-nats-users"
	// SeedKey is the key of an identity's seed in its SeedSecret.
	SeedKey = "nkey"
)

// SeedSecret is the name of the Secret holding identity's seed.
func SeedSecret(identity string) string { return "headwater-nats-" + identity }

// EnvVar is the variable the server's configuration reads identity's
// public key from (<IDENTITY>_NKEY, e.g. ARTIFACT_SERVER_NKEY).
func EnvVar(identity string) string {
	return strings.ToUpper(strings.ReplaceAll(identity, "-", "_")) + "_NKEY"
}

// NewUser makes a fresh user NKey: its public key and its seed.
func NewUser() (public, seed string, err error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", "", fmt.Errorf("create nkey: %w", err)
	}
	s, err := kp.Seed()
	if err != nil {
		return "", "", fmt.Errorf("nkey seed: %w", err)
	}
	public, err = kp.PublicKey()
	if err != nil {
		return "", "", fmt.Errorf("nkey public key: %w", err)
	}
	return public, string(s), nil
}

// PublicKey returns the public key of a user seed, checking that it is one.
func PublicKey(seed string) (string, error) {
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(seed)))
	if err != nil {
		return "", fmt.Errorf("nkey seed: %w", err)
	}
	public, err := kp.PublicKey()
	if err != nil {
		return "", fmt.Errorf("nkey public key: %w", err)
	}
	if !nkeys.IsValidPublicUserKey(public) {
		return "", errors.New("nkey seed is not a user's")
	}
	return public, nil
}

// Keys are a public key and a seed per identity.
type Keys struct {
	// Public and Seed map an identity to its public key and its seed.
	Public, Seed map[string]string
}

// PluginIdentities are the bus identities of the fetchers of the given
// plug-in kinds (events.PluginIdentity), from a comma-separated list of
// kinds ("HTTPSource,Other"); empty names are skipped.
func PluginIdentities(kinds string) []string {
	var ids []string
	for _, k := range strings.Split(kinds, ",") {
		if k = strings.TrimSpace(k); k != "" {
			ids = append(ids, events.PluginIdentity(k))
		}
	}
	return ids
}

// Generate makes a fresh key for every identity of events.Identities and
// for each of extra (plug-in fetchers' identities, PluginIdentities).
func Generate(extra ...string) (*Keys, error) {
	k := &Keys{Public: map[string]string{}, Seed: map[string]string{}}
	for _, id := range append(events.Identities(), extra...) {
		pub, seed, err := NewUser()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", id, err)
		}
		k.Public[id], k.Seed[id] = pub, seed
	}
	return k, nil
}
