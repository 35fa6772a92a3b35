// Package sigstoretest is a virtual Sigstore for tests: sigstore-go's test
// certificate authority (a Fulcio root and intermediate issuing leaf
// certificates to an OIDC identity) and transparency log (signing entries'
// inclusion promises and proofs), with its trusted_root.json, and keyless
// cosign signatures of artifacts in the test registry, as cosign writes
// them: v2's ".sig" images and v3's Sigstore bundles attached as OCI
// referrers. Nothing is reached over the network.
package sigstoretest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	protobundle "github.com/sigstore/protobuf-specs/gen/pb-go/bundle/v1"
	protocommon "github.com/sigstore/protobuf-specs/gen/pb-go/common/v1"
	protodsse "github.com/sigstore/protobuf-specs/gen/pb-go/dsse"
	protorekor "github.com/sigstore/protobuf-specs/gen/pb-go/rekor/v1"
	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/testing/ca"
	"github.com/sigstore/sigstore-go/pkg/tlog"
	"github.com/sigstore/sigstore/pkg/cryptoutils"

	"github.com/headwater-gitops/headwater/testsupport/registry"
)

// Cosign's formats.
const (
	// BundleMediaType is a Sigstore bundle v0.3's media type: the
	// artifactType of the referrer manifest and its layer's media type.
	BundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json"
	// SignPredicateType is the in-toto predicate of `cosign sign`'s bundles.
	SignPredicateType = "https://sigstore.dev/cosign/sign/v1"
	// The annotations of a keyless ".sig" layer.
	certificateAnnotation = "dev.sigstore.cosign/certificate"
	chainAnnotation       = "dev.sigstore.cosign/chain"
	rekorBundleAnnotation = "dev.sigstore.cosign/bundle"
)

// Sigstore is a virtual Sigstore.
type Sigstore struct {
	vs *ca.VirtualSigstore
}

// New starts a virtual Sigstore: new keys, valid from now for an hour.
func New(tb testing.TB) *Sigstore {
	tb.Helper()
	vs, err := ca.NewVirtualSigstore()
	if err != nil {
		tb.Fatalf("sigstoretest: %v", err)
	}
	return &Sigstore{vs: vs}
}

// TrustedRootJSON is the virtual Sigstore's trusted_root.json: its
// certificate authority, transparency log and timestamp authority, and no
// certificate transparency log (its certificates carry no SCT).
func (s *Sigstore) TrustedRootJSON(tb testing.TB) []byte {
	tb.Helper()
	logs := map[string]*root.TransparencyLog{}
	for id, l := range s.vs.RekorLogs() {
		c := *l
		// The virtual log's ID is its hex key ID as text; a trusted root
		// holds the raw key ID.
		raw, err := hex.DecodeString(id)
		if err != nil {
			tb.Fatalf("sigstoretest: log ID: %v", err)
		}
		c.ID = raw
		logs[id] = &c
	}
	tr, err := root.NewTrustedRoot(root.TrustedRootMediaType01, s.vs.FulcioCertificateAuthorities(), nil,
		s.vs.TimestampingAuthorities(), logs)
	if err != nil {
		tb.Fatalf("sigstoretest: trusted root: %v", err)
	}
	b, err := tr.MarshalJSON()
	if err != nil {
		tb.Fatalf("sigstoretest: trusted root: %v", err)
	}
	return b
}

// SimpleSigningPayload is the payload `cosign sign` signs in a ".sig"
// image: the artifact's reference and digest.
func SimpleSigningPayload(tb testing.TB, ref string, digest v1.Hash) []byte {
	tb.Helper()
	payload, err := json.Marshal(map[string]any{
		"critical": map[string]any{
			"identity": map[string]string{"docker-reference": ref},
			"image":    map[string]string{"docker-manifest-digest": digest.String()},
			"type":     "cosign container image signature",
		},
		"optional": nil,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return payload
}

// SignTag signs digest, an artifact of repo in reg, keyless as cosign v2
// does: a certificate for identity from issuer signs the simple-signing
// payload, whose hashedrekord entry the log promises to include; all
// pushed as the image tagged "sha256-<hex>.sig".
func (s *Sigstore) SignTag(tb testing.TB, reg *registry.Server, repo string, digest v1.Hash, identity, issuer string) {
	tb.Helper()
	s.SignTagPayload(tb, reg, repo, digest, SimpleSigningPayload(tb, reg.Host+"/"+repo, digest), identity, issuer)
}

// SignTagPayload is SignTag with the payload given, for payloads that
// name another digest.
func (s *Sigstore) SignTagPayload(tb testing.TB, reg *registry.Server, repo string, digest v1.Hash, payload []byte, identity, issuer string) {
	tb.Helper()
	e, err := s.vs.Sign(identity, issuer, payload)
	if err != nil {
		tb.Fatalf("sigstoretest: sign: %v", err)
	}
	vc, err := e.VerificationContent()
	if err != nil {
		tb.Fatal(err)
	}
	certPEM, err := cryptoutils.MarshalCertificateToPEM(vc.Certificate())
	if err != nil {
		tb.Fatal(err)
	}
	var chain []byte
	for _, c := range s.vs.FulcioCertificateAuthorities()[0].(*root.FulcioCertificateAuthority).Intermediates {
		p, err := cryptoutils.MarshalCertificateToPEM(c)
		if err != nil {
			tb.Fatal(err)
		}
		chain = append(chain, p...)
	}
	sc, err := e.SignatureContent()
	if err != nil {
		tb.Fatal(err)
	}
	entries, err := e.TlogEntries()
	if err != nil {
		tb.Fatal(err)
	}
	tle := entries[0].TransparencyLogEntry()
	rb := map[string]any{
		"SignedEntryTimestamp": s.promise(tb, tle),
		"Payload": map[string]any{
			"body":           base64.StdEncoding.EncodeToString(tle.CanonicalizedBody),
			"integratedTime": tle.IntegratedTime,
			"logIndex":       tle.LogIndex,
			"logID":          hex.EncodeToString(tle.LogId.KeyId),
		},
	}
	rbJSON, err := json.Marshal(rb)
	if err != nil {
		tb.Fatal(err)
	}
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1), mutate.Addendum{
		Layer:     static.NewLayer(payload, registry.SimpleSigningMediaType),
		MediaType: registry.SimpleSigningMediaType,
		Annotations: map[string]string{
			registry.SignatureAnnotation: base64.StdEncoding.EncodeToString(sc.Signature()),
			certificateAnnotation:        string(certPEM),
			chainAnnotation:              string(chain),
			rekorBundleAnnotation:        string(rbJSON),
		},
	})
	if err != nil {
		tb.Fatal(err)
	}
	reg.PushImage(tb, repo, strings.Replace(digest.String(), ":", "-", 1)+".sig", img)
}

// promise is the log's signed entry timestamp of an entry.
func (s *Sigstore) promise(tb testing.TB, tle *protorekor.TransparencyLogEntry) []byte {
	tb.Helper()
	set, err := s.vs.RekorSignPayload(tlog.RekorPayload{
		Body:           base64.StdEncoding.EncodeToString(tle.CanonicalizedBody),
		IntegratedTime: tle.IntegratedTime,
		LogIndex:       tle.LogIndex,
		LogID:          hex.EncodeToString(tle.LogId.KeyId),
	})
	if err != nil {
		tb.Fatalf("sigstoretest: signed entry timestamp: %v", err)
	}
	return set
}

// Statement is the in-toto statement `cosign sign` (v3) signs for
// digest.
func Statement(tb testing.TB, digest v1.Hash) []byte {
	tb.Helper()
	b, err := json.Marshal(map[string]any{
		"_type":         "https://in-toto.io/Statement/v1",
		"subject":       []map[string]any{{"digest": map[string]string{digest.Algorithm: digest.Hex}}},
		"predicateType": SignPredicateType,
		"predicate":     map[string]any{},
	})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// SignBundle signs digest, an artifact of repo in reg, keyless as cosign
// v3 does: a DSSE envelope of the in-toto statement naming the digest,
// signed with a certificate for identity from issuer, logged with an
// inclusion proof, in a Sigstore bundle v0.3 attached to the digest as a
// referrer (the registry's referrers tag index when it has no referrers
// API, as go-containerregistry writes it for cosign).
func (s *Sigstore) SignBundle(tb testing.TB, reg *registry.Server, repo string, digest v1.Hash, identity, issuer string) {
	tb.Helper()
	s.SignBundleStatement(tb, reg, repo, digest, Statement(tb, digest), identity, issuer)
}

// SignBundleStatement is SignBundle with the statement given, for
// statements that name another digest.
func (s *Sigstore) SignBundleStatement(tb testing.TB, reg *registry.Server, repo string, digest v1.Hash, statement []byte, identity, issuer string) {
	tb.Helper()
	e, err := s.vs.AttestAtTime(identity, issuer, statement, time.Now().Add(5*time.Minute), true)
	if err != nil {
		tb.Fatalf("sigstoretest: attest: %v", err)
	}
	vc, err := e.VerificationContent()
	if err != nil {
		tb.Fatal(err)
	}
	sc, err := e.SignatureContent()
	if err != nil {
		tb.Fatal(err)
	}
	env := sc.EnvelopeContent().RawEnvelope()
	entries, err := e.TlogEntries()
	if err != nil {
		tb.Fatal(err)
	}
	tle := entries[0].TransparencyLogEntry()
	tle.InclusionPromise = &protorekor.InclusionPromise{SignedEntryTimestamp: s.promise(tb, tle)}
	tle.KindVersion = kindVersion(tb, tle.CanonicalizedBody)
	pb := &protobundle.Bundle{
		MediaType: BundleMediaType,
		VerificationMaterial: &protobundle.VerificationMaterial{
			Content:     &protobundle.VerificationMaterial_Certificate{Certificate: &protocommon.X509Certificate{RawBytes: vc.Certificate().Raw}},
			TlogEntries: []*protorekor.TransparencyLogEntry{tle},
		},
		Content: &protobundle.Bundle_DsseEnvelope{DsseEnvelope: dsseEnvelope(tb, env.PayloadType, env.Payload, env.Signatures[0].Sig)},
	}
	AttachBundle(tb, reg, repo, digest, pb)
}

// SignBundleWithKey signs digest as `cosign sign --key` (v3) does without
// the transparency log: a DSSE envelope of the statement, signed by key,
// in a bundle whose verification material is the key's hint.
func SignBundleWithKey(tb testing.TB, reg *registry.Server, repo string, digest v1.Hash, key *ecdsa.PrivateKey) {
	tb.Helper()
	payload := Statement(tb, digest)
	const payloadType = "application/vnd.in-toto+json"
	pae := fmt.Sprintf("DSSEv1 %d %s %d %s", len(payloadType), payloadType, len(payload), payload)
	sum := sha256.Sum256([]byte(pae))
	sig, err := ecdsa.SignASN1(rand.Reader, key, sum[:])
	if err != nil {
		tb.Fatal(err)
	}
	pb := &protobundle.Bundle{
		MediaType: BundleMediaType,
		VerificationMaterial: &protobundle.VerificationMaterial{
			Content: &protobundle.VerificationMaterial_PublicKey{PublicKey: &protocommon.PublicKeyIdentifier{Hint: "cosign.pub"}},
		},
		Content: &protobundle.Bundle_DsseEnvelope{DsseEnvelope: &protodsse.Envelope{PayloadType: payloadType, Payload: payload,
			Signatures: []*protodsse.Signature{{Sig: sig}}}},
	}
	AttachBundle(tb, reg, repo, digest, pb)
}

// dsseEnvelope is an envelope of base64 payload and signature as the
// bundle's protobuf holds it.
func dsseEnvelope(tb testing.TB, payloadType, payload, sig string) *protodsse.Envelope {
	tb.Helper()
	p, err := base64.StdEncoding.DecodeString(payload)
	if err != nil {
		tb.Fatal(err)
	}
	sg, err := base64.StdEncoding.DecodeString(sig)
	if err != nil {
		tb.Fatal(err)
	}
	return &protodsse.Envelope{PayloadType: payloadType, Payload: p, Signatures: []*protodsse.Signature{{Sig: sg}}}
}

// kindVersion reads a log entry's kind and version from its body.
func kindVersion(tb testing.TB, body []byte) *protorekor.KindVersion {
	tb.Helper()
	var kv struct {
		Kind       string `json:"kind"`
		APIVersion string `json:"apiVersion"`
	}
	if err := json.Unmarshal(body, &kv); err != nil {
		tb.Fatalf("sigstoretest: log entry body: %v", err)
	}
	return &protorekor.KindVersion{Kind: kv.Kind, Version: kv.APIVersion}
}

// AttachBundle pushes a bundle as cosign v3 does: the one layer of an OCI
// manifest whose artifactType is the bundle's media type and whose
// subject is digest.
func AttachBundle(tb testing.TB, reg *registry.Server, repo string, digest v1.Hash, pb *protobundle.Bundle) {
	tb.Helper()
	raw, err := (&bundle.Bundle{Bundle: pb}).MarshalJSON()
	if err != nil {
		tb.Fatalf("sigstoretest: bundle: %v", err)
	}
	opts := reg.RemoteOptions()
	var nameOpts []name.Option
	if reg.Scheme() == "http" {
		nameOpts = append(nameOpts, name.Insecure)
	}
	r, err := name.NewRepository(reg.Host+"/"+repo, nameOpts...)
	if err != nil {
		tb.Fatal(err)
	}
	subject, err := remote.Head(r.Digest(digest.String()), opts...)
	if err != nil {
		tb.Fatalf("sigstoretest: subject %s: %v", digest, err)
	}
	layer := static.NewLayer(raw, BundleMediaType)
	config := static.NewLayer([]byte("{}"), "application/vnd.oci.empty.v1+json")
	for _, l := range []v1.Layer{layer, config} {
		if err := remote.WriteLayer(r, l, opts...); err != nil {
			tb.Fatalf("sigstoretest: push bundle: %v", err)
		}
	}
	ld, err := partialDescriptor(layer, BundleMediaType)
	if err != nil {
		tb.Fatal(err)
	}
	cd, err := partialDescriptor(config, "application/vnd.oci.empty.v1+json")
	if err != nil {
		tb.Fatal(err)
	}
	m := referrer{
		Manifest: v1.Manifest{
			SchemaVersion: 2,
			MediaType:     types.OCIManifestSchema1,
			Config:        cd,
			Layers:        []v1.Descriptor{ld},
			Subject:       &v1.Descriptor{MediaType: subject.MediaType, Digest: subject.Digest, Size: subject.Size},
			Annotations: map[string]string{
				"dev.sigstore.bundle.content":       "dsse-envelope",
				"dev.sigstore.bundle.predicateType": SignPredicateType,
			},
		},
		ArtifactType: BundleMediaType,
	}
	mb, err := json.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	h, _, err := v1.SHA256(bytes.NewReader(mb))
	if err != nil {
		tb.Fatal(err)
	}
	if err := remote.Put(r.Digest(h.String()), rawManifest(mb), opts...); err != nil {
		tb.Fatalf("sigstoretest: push bundle manifest: %v", err)
	}
}

// referrer is a manifest with OCI 1.1's artifactType.
type referrer struct {
	v1.Manifest
	ArtifactType string `json:"artifactType,omitempty"`
}

// rawManifest is a serialized OCI manifest, for remote.Put.
type rawManifest []byte

// RawManifest returns the manifest.
func (m rawManifest) RawManifest() ([]byte, error) { return m, nil }

// MediaType is the OCI manifest's.
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// partialDescriptor describes a layer with the media type given.
func partialDescriptor(l v1.Layer, mt types.MediaType) (v1.Descriptor, error) {
	d, err := l.Digest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	n, err := l.Size()
	if err != nil {
		return v1.Descriptor{}, err
	}
	return v1.Descriptor{MediaType: mt, Digest: d, Size: n}, nil
}
