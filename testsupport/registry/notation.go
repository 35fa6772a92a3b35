package registry

import (
	"crypto"
	"crypto/x509"
	"net/http"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/notaryproject/notation-core-go/signature/jws"
	notation "github.com/notaryproject/notation-go"
	notationregistry "github.com/notaryproject/notation-go/registry"
	"github.com/notaryproject/notation-go/signer"
	orasremote "oras.land/oras-go/v2/registry/remote"
	orasauth "oras.land/oras-go/v2/registry/remote/auth"
)

// SignNotation signs digest, an artifact of repo, as `notation sign`
// does, with notation-go's signer: a JWS envelope over the artifact's
// descriptor, signed by key, carrying chain (the signing certificate
// first, the root last), pushed with ORAS as a manifest whose subject is
// the artifact. The distribution registry has no Referrers API, so ORAS
// also adds the signature to the referrers index tagged "sha256-<hex>",
// where a verifier finds it.
func (s *Server) SignNotation(tb testing.TB, repo string, digest v1.Hash, key crypto.PrivateKey, chain []*x509.Certificate) {
	tb.Helper()
	sig, err := signer.NewGenericSigner(key, chain)
	if err != nil {
		tb.Fatalf("registry: notation signer: %v", err)
	}
	target, err := orasremote.NewRepository(s.Host + "/" + repo)
	if err != nil {
		tb.Fatalf("registry: %v", err)
	}
	target.PlainHTTP = !s.Options.TLS
	client := &orasauth.Client{Client: &http.Client{Transport: s.transport()}}
	if s.Options.Username != "" {
		client.Credential = orasauth.StaticCredential(s.Host, orasauth.Credential{Username: s.Options.Username, Password: s.Options.Password})
	}
	target.Client = client
	_, err = notation.Sign(tb.Context(), sig, notationregistry.NewRepository(target), notation.SignOptions{
		ArtifactReference: digest.String(),
		SignerSignOptions: notation.SignerSignOptions{SignatureMediaType: jws.MediaTypeEnvelope},
	})
	if err != nil {
		tb.Fatalf("registry: notation sign %s@%s: %v", repo, digest, err)
	}
}
