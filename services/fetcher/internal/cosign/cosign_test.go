package cosign

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func publicPEM(t *testing.T, key crypto.PublicKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// TestNewVerifier reads the *.pub entries of a Secret: ECDSA, RSA and
// Ed25519 keys; other entries are skipped; a bad key is named.
func TestNewVerifier(t *testing.T) {
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ed, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data map[string][]byte
		keys int
		err  string
	}{
		{name: "every key type", data: map[string][]byte{"ec.pub": publicPEM(t, &ec.PublicKey), "rsa.pub": publicPEM(t, &rs.PublicKey),
			"ed.pub": publicPEM(t, ed), "README": []byte("not a key")}, keys: 3},
		{name: "no keys", data: map[string][]byte{"cosign.key": []byte("private")}, err: ErrNoKeys.Error()},
		{name: "not PEM", data: map[string][]byte{"cosign.pub": []byte("AAAA")}, err: "key 'cosign.pub': not a PEM public key"},
		{name: "not a key", data: map[string][]byte{"cosign.pub": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte{1, 2}})},
			err: "key 'cosign.pub'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := NewVerifier(tc.data)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || len(v.keys) != tc.keys {
				t.Fatalf("verifier %+v, %v; want %d keys", v, err, tc.keys)
			}
		})
	}
	if _, err := NewVerifier(nil); !errors.Is(err, ErrNoKeys) {
		t.Errorf("no Secret data: %v, want ErrNoKeys", err)
	}
}

// TestVerifies checks a payload's signature with each key type, and that
// a payload must name the digest it is taken as a signature of.
func TestVerifies(t *testing.T) {
	digest := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	payload := []byte(`{"critical":{"image":{"docker-manifest-digest":"` + digest.String() + `"},"type":"cosign container image signature"}}`)
	sum := sha256.Sum256(payload)
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecSig, err := ecdsa.SignASN1(rand.Reader, ec, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsSig, err := rsa.SignPKCS1v15(rand.Reader, rs, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	edPub, edPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	edSig := ed25519.Sign(edPriv, payload)
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		key  crypto.PublicKey
		sig  []byte
		want bool
	}{
		{"ecdsa", &ec.PublicKey, ecSig, true},
		{"rsa", &rs.PublicKey, rsSig, true},
		{"ed25519", edPub, edSig, true},
		{"another key", &other.PublicKey, ecSig, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &Verifier{keys: map[string]crypto.PublicKey{"k.pub": tc.key}}
			if got := v.verifies(payload, base64.StdEncoding.EncodeToString(tc.sig)); got != tc.want {
				t.Errorf("verifies = %v, want %v", got, tc.want)
			}
		})
	}
	if !signs(payload, digest) || signs(payload, v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("cd", 32)}) {
		t.Error("signs does not check the payload's digest")
	}
}
