// Package notation verifies Notary Project (notation) signatures of OCI
// artifacts with notation-go, as Flux's source-controller does for an
// OCIRepository's or an OCI HelmChart's spec.verify with provider
// notation: the Secret that spec.verify.secretRef names holds the trust
// policy (trustpolicy.json) and the trust store (its *.crt and *.pem
// certificates); the signatures are the artifact's OCI referrers of
// artifact type application/vnd.cncf.notary.signature, read with the
// Referrers API or, where a registry has none (the distribution registry),
// from the referrers tag "sha256-<hex>" (ORAS's fallback).
//
// The registry is reached through the caller's transport and credentials,
// the ones its go-containerregistry requests use: go-containerregistry's
// authenticating transport (ping, basic or bearer token) is built on them
// and handed to ORAS, so a verification goes through the same connection
// pool, TLS settings, proxy, rate limits and token exchange as the pull.
package notation

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	// The signature envelope formats notation signs with (JWS and COSE)
	// register themselves.
	_ "github.com/notaryproject/notation-core-go/signature/cose"
	_ "github.com/notaryproject/notation-core-go/signature/jws"
	notationgo "github.com/notaryproject/notation-go"
	"github.com/notaryproject/notation-go/registry"
	"github.com/notaryproject/notation-go/verifier"
	"github.com/notaryproject/notation-go/verifier/trustpolicy"
	"github.com/notaryproject/notation-go/verifier/truststore"
	orasremote "oras.land/oras-go/v2/registry/remote"

	"github.com/headwater-gitops/headwater/pkg/failure"
)

// Provider is spec.verify.provider for notation.
const Provider = "notation"

// TrustPolicyKey is the Secret's key holding the trust policy, Flux's
// DefaultTrustPolicyKey.
const TrustPolicyKey = "trustpolicy.json"

// maxSignatureAttempts bounds the signatures of one artifact evaluated,
// as Flux's.
const maxSignatureAttempts = 3

// Result is the result of a verification that did not fail.
type Result int

const (
	// Verified: a signature satisfied the trust policy; SourceVerified is
	// True.
	Verified Result = iota + 1
	// Ignored: the trust policy skips verification for the artifact, or
	// only logs a failed authenticity check (level audit); Flux neither
	// fails the artifact nor marks it verified.
	Ignored
)

// Verifier checks notation signatures against one Secret's trust policy
// and trust store.
type Verifier struct {
	verifier notationgo.Verifier
}

// NewVerifier reads a spec.verify Secret (secret is its namespace/name,
// for messages): trustpolicy.json and the certificates of its *.crt and
// *.pem entries (PEM, any number of certificates each, or DER). Its errors
// are Flux's words for a Secret that cannot verify anything: no trust
// policy, one that does not parse or is invalid, no certificates.
func NewVerifier(ctx context.Context, data map[string][]byte, secret string) (*Verifier, error) {
	raw, ok := data[TrustPolicyKey]
	if !ok {
		return nil, fmt.Errorf("'%s' not found in secret '%s'", TrustPolicyKey, secret)
	}
	var doc trustpolicy.Document
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("error occurred while parsing %s: %w", TrustPolicyKey, err)
	}
	var store trustStore
	for _, k := range slices.Sorted(maps.Keys(data)) {
		if !strings.HasSuffix(k, ".crt") && !strings.HasSuffix(k, ".pem") {
			continue
		}
		certs, err := parseCertificates(data[k])
		if err != nil {
			return nil, fmt.Errorf("failed to parse certificate '%s' in secret '%s': %w", k, secret, err)
		}
		store = append(store, certs...)
	}
	if len(store) == 0 {
		return nil, fmt.Errorf("no certificates found in secret '%s'", secret)
	}
	v, err := verifier.New(cleanTrustPolicy(ctx, &doc), store, nil)
	if err != nil {
		return nil, err
	}
	return &Verifier{verifier: v}, nil
}

// parseCertificates reads every certificate of a PEM bundle, or DER.
func parseCertificates(b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := b
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificates(block.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c...)
	}
	if len(certs) > 0 {
		return certs, nil
	}
	certs, err := x509.ParseCertificates(b)
	if err != nil {
		return nil, err
	}
	if len(certs) == 0 {
		return nil, errors.New("no certificate")
	}
	return certs, nil
}

// trustStore is the Secret's certificates, the trust store of every named
// store the policy lists, as Flux's in-memory trust store.
type trustStore []*x509.Certificate

var _ truststore.X509TrustStore = trustStore(nil)

// GetCertificates returns every certificate of the Secret.
func (s trustStore) GetCertificates(context.Context, truststore.Type, string) ([]*x509.Certificate, error) {
	return s, nil
}

// cleanTrustPolicy drops the trust stores and identities of statements
// that skip verification, which notation would refuse, as Flux's
// CleanTrustPolicy, logging that they are ignored.
func cleanTrustPolicy(ctx context.Context, doc *trustpolicy.Document) *trustpolicy.Document {
	for i, p := range doc.TrustPolicies {
		if p.SignatureVerification.VerificationLevel != trustpolicy.LevelSkip.Name {
			continue
		}
		if len(p.TrustStores) > 0 || len(p.TrustedIdentities) > 0 {
			logr.FromContextOrDiscard(ctx).Info("trust policy statement skips signature verification but lists trust stores or trusted identities: ignoring them",
				"statement", p.Name)
		}
		doc.TrustPolicies[i].TrustStores = []string{}
		doc.TrustPolicies[i].TrustedIdentities = []string{}
	}
	return doc
}

// Registry is how Verify reaches an artifact's registry: the transport and
// credentials of the fetch that verifies.
type Registry struct {
	// Transport carries every request (the fetch's connection pool, TLS
	// settings and proxy).
	Transport http.RoundTripper
	// Auth are the registry credentials; nil is anonymous.
	Auth authn.Authenticator
	// UserAgent identifies the client; empty leaves go-containerregistry's.
	UserAgent string
}

// Verify checks the notation signatures of the artifact ref names, as
// Flux's NotationVerifier: the first signature (of at most three) that
// the trust policy accepts verifies it. It returns Verified or Ignored, or
// notation's error in its own words: no signature, none trusted, no trust
// policy statement for the artifact. A verification that the registry cut
// short (unreachable, a server error, a timeout) is a *RegistryError.
func (v *Verifier) Verify(ctx context.Context, ref name.Digest, reg Registry) (Result, error) {
	auth := reg.Auth
	if auth == nil {
		auth = authn.Anonymous
	}
	w := &watch{next: reg.Transport}
	var rt http.RoundTripper = w
	if reg.UserAgent != "" {
		rt = transport.NewUserAgent(rt, reg.UserAgent)
	}
	repoName := ref.Context()
	// go-containerregistry's handshake: the scheme (https, or http where
	// go-containerregistry allows it), then basic or bearer auth for a
	// pull of the repository.
	rt, err := transport.NewWithContext(ctx, repoName.Registry, auth, rt, []string{repoName.Scope(transport.PullScope)})
	if err != nil {
		// Credentials the registry or its token service refuse fail
		// again; anything else may pass.
		var terr *transport.Error
		if errors.As(err, &terr) && (terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden) {
			return 0, err
		}
		return 0, &RegistryError{Err: err}
	}
	repo, err := orasremote.NewRepository(ref.Name())
	if err != nil {
		return 0, err
	}
	repo.Client = &http.Client{Transport: rt}
	_, outcomes, err := notationgo.Verify(ctx, v.verifier, registry.NewRepository(repo),
		notationgo.VerifyOptions{ArtifactReference: ref.Name(), MaxSignatureAttempts: maxSignatureAttempts})
	if err != nil {
		if w.trouble.Load() || ctx.Err() != nil {
			return 0, &RegistryError{Err: err}
		}
		return 0, err
	}
	return checkOutcome(ctx, outcomes, ref.Name())
}

// checkOutcome is Flux's reading of notation's outcome: skipped
// verification is ignored; an authenticity check that failed with action
// log (level audit) is ignored too, not verified; otherwise verified.
func checkOutcome(ctx context.Context, outcomes []*notationgo.VerificationOutcome, ref string) (Result, error) {
	if len(outcomes) == 0 {
		return 0, fmt.Errorf("signature verification failed for all the signatures associated with %s", ref)
	}
	outcome := outcomes[0]
	if outcome.VerificationLevel == trustpolicy.LevelSkip {
		return Ignored, nil
	}
	result := Verified
	for _, r := range outcome.VerificationResults {
		if r.Error == nil {
			continue
		}
		if r.Type == trustpolicy.TypeAuthenticity {
			result = Ignored
		}
		logr.FromContextOrDiscard(ctx).Info("notation verification check failed", "type", string(r.Type), "ref", ref, "error", r.Error.Error())
	}
	return result, nil
}

// RegistryError is a verification the registry cut short: it could not be
// reached, answered with a server error, or the time ran out. Retrying
// may succeed.
type RegistryError struct {
	// Err is the failure, in notation's or go-containerregistry's words.
	Err error
}

// Error is the failure's message.
func (e *RegistryError) Error() string { return e.Err.Error() }

// Unwrap returns the failure.
func (e *RegistryError) Unwrap() error { return e.Err }

// Handling is how a failed Verify is handled: transient when the registry
// cut it short, stalling when the trust policy has no statement for the
// artifact (the Secret must change), final otherwise (no signature, none
// that the trust policy accepts: a new revision may be signed).
func Handling(err error) failure.Handling {
	var regErr *RegistryError
	var noPolicy notationgo.NoApplicableTrustPolicyError
	switch {
	case errors.As(err, &regErr):
		return failure.Transient
	case errors.As(err, &noPolicy):
		return failure.Stalling
	}
	return failure.Final
}

// watch notes whether a request to the registry failed for a reason of
// the registry's or the network's (an error, a 5xx, a 429), which makes a
// failed verification transient. The handshake's ping (GET /v2/) is not
// watched: go-containerregistry tries https and http at once on a local
// registry, and one of them failing says nothing.
type watch struct {
	next    http.RoundTripper
	trouble atomic.Bool
}

// RoundTrip sends req and notes trouble.
func (w *watch) RoundTrip(req *http.Request) (*http.Response, error) {
	next := w.next
	if next == nil {
		next = http.DefaultTransport
	}
	resp, err := next.RoundTrip(req)
	if req.URL.Path != "/v2/" && (err != nil || resp.StatusCode >= http.StatusInternalServerError || resp.StatusCode == http.StatusTooManyRequests) {
		w.trouble.Store(true)
	}
	return resp, err
}
