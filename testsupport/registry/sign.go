package registry

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Cosign's signature format, as `cosign sign --key` writes it (the
// transparency log aside).
const (
	// SimpleSigningMediaType is the media type of a signature payload.
	SimpleSigningMediaType types.MediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	// SignatureAnnotation holds a payload's base64 signature.
	SignatureAnnotation = "dev.cosignproject.cosign/signature"
)

// Sign signs digest, an artifact of repo, with key as cosign does: a
// simple-signing payload naming the digest, its ECDSA signature over the
// payload's SHA-256, pushed as the image tagged "sha256-<hex>.sig".
func (s *Server) Sign(tb testing.TB, repo string, digest v1.Hash, key *ecdsa.PrivateKey) {
	tb.Helper()
	payload, err := json.Marshal(map[string]any{
		"critical": map[string]any{
			"identity": map[string]string{"docker-reference": s.Host + "/" + repo},
			"image":    map[string]string{"docker-manifest-digest": digest.String()},
			"type":     "cosign container image signature",
		},
		"optional": nil,
	})
	if err != nil {
		tb.Fatal(err)
	}
	sum := sha256.Sum256(payload)
	sig, err := ecdsa.SignASN1(rand.Reader, key, sum[:])
	if err != nil {
		tb.Fatal(err)
	}
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1), mutate.Addendum{
		Layer:       static.NewLayer(payload, SimpleSigningMediaType),
		MediaType:   SimpleSigningMediaType,
		Annotations: map[string]string{SignatureAnnotation: base64.StdEncoding.EncodeToString(sig)},
	})
	if err != nil {
		tb.Fatal(err)
	}
	s.PushImage(tb, repo, strings.Replace(digest.String(), ":", "-", 1)+".sig", img)
}

// PublicKeyPEM is key's public key in PEM, as cosign.pub.
func PublicKeyPEM(tb testing.TB, key crypto.Signer) []byte {
	tb.Helper()
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		tb.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}
