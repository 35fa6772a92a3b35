package cosign

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sigstore/sigstore-go/pkg/root"

	"github.com/headwater-gitops/headwater/testsupport/registry"
	"github.com/headwater-gitops/headwater/testsupport/sigstoretest"
)

const (
	issuer   = "https://token.actions.githubusercontent.com"
	identity = "https://github.com/acme/app/.github/workflows/release.yaml@refs/heads/main"
)

// TestKeyless verifies keyless signatures against a virtual Sigstore's
// trusted root, in both of cosign's formats: v2's ".sig" image and v3's
// bundle referrer; and key-signed v3 bundles.
func TestKeyless(t *testing.T) {
	reg := registry.New(t, registry.Options{})
	ss := sigstoretest.New(t)
	trusted, err := TrustedRoot(map[string][]byte{TrustedRootKey: ss.TrustedRootJSON(t)}, "default/sigstore")
	if err != nil {
		t.Fatal(err)
	}
	other := sigstoretest.New(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	match := []Identity{{Issuer: "^https://token.actions.githubusercontent.com$", Subject: "^https://github.com/acme/app/"}}
	keyless := func(t *testing.T, ids []Identity) *Verifier {
		v, err := NewKeylessVerifier(trusted, ids)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	withKey := func(t *testing.T, k *ecdsa.PrivateKey) *Verifier {
		v, err := NewVerifier(map[string][]byte{"cosign.pub": registry.PublicKeyPEM(t, k)})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name string
		// sign signs digest, an artifact of repo.
		sign       func(t *testing.T, repo string, digest v1.Hash)
		identities []Identity
		key        *ecdsa.PrivateKey // a verifier with this key instead of keyless
		// err is "" when the signature verifies, or part of the error.
		err string
	}{
		{name: "sig tag", sign: func(t *testing.T, repo string, d v1.Hash) { ss.SignTag(t, reg, repo, d, identity, issuer) },
			identities: match},
		{name: "bundle referrer", sign: func(t *testing.T, repo string, d v1.Hash) { ss.SignBundle(t, reg, repo, d, identity, issuer) },
			identities: match},
		{name: "any identity without matchers", sign: func(t *testing.T, repo string, d v1.Hash) {
			ss.SignBundle(t, reg, repo, d, "someone@example.com", "https://accounts.example.com")
		}},
		{name: "one of the identities", sign: func(t *testing.T, repo string, d v1.Hash) { ss.SignTag(t, reg, repo, d, identity, issuer) },
			identities: []Identity{{Issuer: "gitlab", Subject: ".*"}, match[0]}},
		{name: "sig tag from another subject", sign: func(t *testing.T, repo string, d v1.Hash) {
			ss.SignTag(t, reg, repo, d, "https://github.com/evil/app/.github/workflows/release.yaml@refs/heads/main", issuer)
		}, identities: match,
			err: "none of the expected identities matched what was in the certificate, got subjects [https://github.com/evil/app/.github/workflows/release.yaml@refs/heads/main] with issuer https://token.actions.githubusercontent.com"},
		{name: "bundle from another issuer", sign: func(t *testing.T, repo string, d v1.Hash) {
			ss.SignBundle(t, reg, repo, d, identity, "https://accounts.example.com")
		}, identities: match,
			err: "none of the expected identities matched what was in the certificate, got subjects [" + identity + "] with issuer https://accounts.example.com"},
		{name: "sig tag of another digest", sign: func(t *testing.T, repo string, d v1.Hash) {
			ss.SignTagPayload(t, reg, repo, d, sigstoretest.SimpleSigningPayload(t, reg.Host+"/"+repo, tampered), identity, issuer)
		}, identities: match, err: "signature payload does not name digest " + "sha256:"},
		{name: "bundle of another digest", sign: func(t *testing.T, repo string, d v1.Hash) {
			ss.SignBundleStatement(t, reg, repo, d, sigstoretest.Statement(t, tampered), identity, issuer)
		}, identities: match, err: "provided artifact digest does not match any digest in statement"},
		{name: "sig tag from another Sigstore", sign: func(t *testing.T, repo string, d v1.Hash) { other.SignTag(t, reg, repo, d, identity, issuer) },
			identities: match, err: "no matching signatures were found: log inclusion"},
		{name: "bundle from another Sigstore", sign: func(t *testing.T, repo string, d v1.Hash) { other.SignBundle(t, reg, repo, d, identity, issuer) },
			identities: match, err: "no matching signatures were found: log inclusion"},
		{name: "bundle with the key", sign: func(t *testing.T, repo string, d v1.Hash) { sigstoretest.SignBundleWithKey(t, reg, repo, d, key) },
			key: key},
		{name: "bundle with another key", sign: func(t *testing.T, repo string, d v1.Hash) { sigstoretest.SignBundleWithKey(t, reg, repo, d, otherKey) },
			key: key, err: "no matching signatures were found: signature"},
		{name: "key-signed bundle, keyless", sign: func(t *testing.T, repo string, d v1.Hash) { sigstoretest.SignBundleWithKey(t, reg, repo, d, key) },
			identities: match, err: "signature has no certificate: it was made with a key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := strings.ToLower(strings.NewReplacer(" ", "-", ",", "").Replace(tc.name))
			digest := reg.Push(t, repo, "v1", registry.FluxArtifact(t, map[string]string{"app": tc.name}, "", ""))
			tc.sign(t, repo, digest)
			v := withKeyOrKeyless(t, tc.key, withKey, func(t *testing.T) *Verifier { return keyless(t, tc.identities) })
			err := v.Verify(t.Context(), repository(t, reg, repo), digest, reg.RemoteOptions()...)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("Verify: %v", err)
			case tc.err == "":
				return
			case err == nil || !strings.Contains(err.Error(), tc.err):
				t.Fatalf("Verify: %v, want an error containing %q", err, tc.err)
			case !errors.Is(err, ErrNoMatch):
				t.Fatalf("Verify: %v is not ErrNoMatch", err)
			}
		})
	}
	t.Run("referrers API refused", func(t *testing.T) {
		// A registry that answers 405 to the Referrers API still serves
		// the ".sig" image.
		digest := reg.Push(t, "refused", "v1", registry.FluxArtifact(t, map[string]string{"app": "refused"}, "", ""))
		ss.SignTag(t, reg, "refused", digest, identity, issuer)
		target, err := url.Parse("http://" + reg.Host)
		if err != nil {
			t.Fatal(err)
		}
		proxy := httputil.NewSingleHostReverseProxy(target)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "/referrers/") {
				http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
				return
			}
			proxy.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		r, err := name.NewRepository(strings.TrimPrefix(srv.URL, "http://")+"/refused", name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := keyless(t, match).Verify(t.Context(), r, digest); err != nil {
			t.Fatalf("Verify: %v", err)
		}
	})
	t.Run("unsigned", func(t *testing.T) {
		digest := reg.Push(t, "unsigned", "v1", registry.FluxArtifact(t, map[string]string{"app": "unsigned"}, "", ""))
		err := keyless(t, match).Verify(t.Context(), repository(t, reg, "unsigned"), digest, reg.RemoteOptions()...)
		var sigErr *SignaturesError
		if !errors.As(err, &sigErr) {
			t.Fatalf("Verify: %v, want a SignaturesError (no signature image)", err)
		}
	})
}

// tampered is a digest no test artifact has.
var tampered = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("0f", 32)}

// withKeyOrKeyless is the verifier with key when there is one, keyless
// otherwise.
func withKeyOrKeyless(t *testing.T, key *ecdsa.PrivateKey, withKey func(*testing.T, *ecdsa.PrivateKey) *Verifier, keyless func(*testing.T) *Verifier) *Verifier {
	if key != nil {
		return withKey(t, key)
	}
	return keyless(t)
}

// repository is repo of reg as go-containerregistry names it.
func repository(t *testing.T, reg *registry.Server, repo string) name.Repository {
	t.Helper()
	r, err := name.NewRepository(reg.Host+"/"+repo, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestTrustedRoot reads trusted_root.json from a Secret's data, and says
// what is wrong with one that does not serve.
func TestTrustedRoot(t *testing.T) {
	good := sigstoretest.New(t).TrustedRootJSON(t)
	empty, err := root.NewTrustedRoot(root.TrustedRootMediaType01, nil, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	emptyJSON, err := empty.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data map[string][]byte
		err  string
	}{
		{name: "valid", data: map[string][]byte{TrustedRootKey: good}},
		{name: "missing", data: map[string][]byte{"root.json": good}, err: "'trusted_root.json' not found in secret 'default/sigstore'"},
		{name: "not JSON", data: map[string][]byte{TrustedRootKey: []byte("not: json")}, err: "unable to parse trusted root: "},
		{name: "wrong media type", data: map[string][]byte{TrustedRootKey: []byte(`{"mediaType":"application/json"}`)},
			err: "unable to parse trusted root: "},
		{name: "no authorities", data: map[string][]byte{TrustedRootKey: emptyJSON},
			err: "unable to parse trusted root: no certificate authorities found in trusted root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := TrustedRoot(tc.data, "default/sigstore")
			switch {
			case tc.err == "" && (err != nil || len(tr.FulcioCertificateAuthorities()) != 1 || len(tr.RekorLogs()) != 1):
				t.Fatalf("TrustedRoot: %v, %v; want the virtual Sigstore's", tr, err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("TrustedRoot: %v, want an error containing %q", err, tc.err)
			}
		})
	}
	if _, err := NewKeylessVerifier(root.TrustedMaterialCollection{}, []Identity{{Issuer: "(", Subject: ".*"}}); err == nil ||
		!strings.Contains(err.Error(), "invalid matchOIDCIdentity[0]") {
		t.Errorf("an issuer that is no regular expression: %v", err)
	}
}

// TestPublicRoot reads the public root from a TUF repository that fails:
// the error says so, and is remembered for the retry interval.
func TestPublicRoot(t *testing.T) {
	var requests atomic.Int32
	tuf := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		requests.Add(1)
		http.Error(w, "no such repository", http.StatusNotFound)
	}))
	t.Cleanup(tuf.Close)
	p := NewPublicRoot()
	p.Mirror = tuf.URL
	p.RetryInterval = time.Hour
	_, err := p.TrustedMaterial()
	if err == nil || !strings.HasPrefix(err.Error(), "unable to initialize trusted root from the public Sigstore TUF repository: ") {
		t.Fatalf("TrustedMaterial: %v", err)
	}
	n := requests.Load()
	if n == 0 {
		t.Fatal("the TUF repository was not asked")
	}
	if _, again := p.TrustedMaterial(); again == nil || again.Error() != err.Error() || requests.Load() != n {
		t.Errorf("within the retry interval: %v after %d requests, want the same error and no request (%d)", again, requests.Load(), n)
	}
}
