package natskeys

import (
	"testing"

	"github.com/headwater-gitops/headwater/pkg/events"
)

func TestGenerate(t *testing.T) {
	k, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, id := range events.Identities() {
		pub, err := PublicKey(k.Seed[id])
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if pub != k.Public[id] {
			t.Errorf("%s: the seed's public key %s, want %s", id, pub, k.Public[id])
		}
		if seen[pub] {
			t.Errorf("%s: key %s used twice", id, pub)
		}
		seen[pub] = true
	}
}

func TestPublicKeyRefusesOtherSeeds(t *testing.T) {
	for _, seed := range []string{"", "not a seed", "SAAGNJOZTRPYYPE2TQBZCHPNYOGXLNZ5TNM2M3YPZXTNNEHLHEKKQVBJBE"} {
		if _, err := PublicKey(seed); err == nil {
			t.Errorf("PublicKey(%q) accepted it", seed)
		}
	}
}

func TestNames(t *testing.T) {
	if got := EnvVar(events.ArtifactServerIdentity); got != "ARTIFACT_SERVER_NKEY" {
		t.Errorf("EnvVar = %s", got)
	}
	if got := SeedSecret(events.FetcherIdentity); got != "headwater-nats-fetcher" {
		t.Errorf("SeedSecret = %s", got)
	}
}
