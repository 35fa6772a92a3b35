package notation

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/testsupport/registry"
	"github.com/headwater-gitops/headwater/testsupport/testca"
)

// signer is a certificate authority and a code-signing certificate it
// issued, made for the test.
type signer struct {
	ca    *testca.Authority
	key   crypto.PrivateKey
	chain []*x509.Certificate
}

func newSigner(t testing.TB, name string) *signer {
	t.Helper()
	ca, err := testca.New(name)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(x509.ExtKeyUsageCodeSigning, name+" signer", nil)
	if err != nil {
		t.Fatal(err)
	}
	return &signer{ca: ca, key: leaf.Pair.PrivateKey, chain: []*x509.Certificate{leaf.Pair.Leaf, ca.Cert}}
}

// policy is a trust policy with one statement for scope at level, trusting
// the named CA store and any identity.
func policy(t testing.TB, scope, level string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"version": "1.0",
		"trustPolicies": []map[string]any{{
			"name":                  "headwater",
			"registryScopes":        []string{scope},
			"signatureVerification": map[string]string{"level": level},
			"trustStores":           []string{"ca:headwater"},
			"trustedIdentities":     []string{"*"},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestNewVerifier(t *testing.T) {
	s := newSigner(t, "trusted")
	good := policy(t, "*", "strict")
	for _, tc := range []struct {
		name string
		data map[string][]byte
		want string // error message; empty for none
	}{
		{"PEM certificate", map[string][]byte{TrustPolicyKey: good, "ca.crt": s.ca.CertPEM}, ""},
		{"bundle in a .pem", map[string][]byte{TrustPolicyKey: good, "bundle.pem": append(newSigner(t, "other").ca.CertPEM, s.ca.CertPEM...)}, ""},
		{"DER certificate", map[string][]byte{TrustPolicyKey: good, "ca.crt": s.ca.Cert.Raw}, ""},
		{"no trust policy", map[string][]byte{"ca.crt": s.ca.CertPEM},
			"'trustpolicy.json' not found in secret 'default/trust'"},
		{"trust policy not JSON", map[string][]byte{TrustPolicyKey: []byte("{version: 1.0"), "ca.crt": s.ca.CertPEM},
			"error occurred while parsing trustpolicy.json: invalid character 'v' looking for beginning of object key string"},
		{"invalid trust policy", map[string][]byte{TrustPolicyKey: []byte(`{"version":"2.0"}`), "ca.crt": s.ca.CertPEM},
			`trust policy document uses unsupported version "2.0"`},
		{"no certificates", map[string][]byte{TrustPolicyKey: good, "cosign.pub": []byte("key")},
			"no certificates found in secret 'default/trust'"},
		{"not a certificate", map[string][]byte{TrustPolicyKey: good, "ca.crt": []byte("not a certificate")},
			"failed to parse certificate 'ca.crt' in secret 'default/trust': x509: malformed certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := NewVerifier(t.Context(), tc.data, "default/trust")
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("NewVerifier: %v", err)
			case tc.want == "" && v == nil:
				t.Fatal("NewVerifier returned no verifier")
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Fatalf("NewVerifier error %v\nwant %s", err, tc.want)
			}
		})
	}
}

// fixture is a registry holding artifacts signed in various ways.
type fixture struct {
	reg                       *registry.Server
	signed, unsigned, foreign v1.Hash
	trusted                   *signer
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{reg: registry.New(t, registry.Options{}), trusted: newSigner(t, "trusted")}
	f.signed = f.reg.Push(t, "app", "signed", registry.FluxArtifact(t, map[string]string{"app.yaml": "signed\n"}, "", ""))
	f.unsigned = f.reg.Push(t, "app", "unsigned", registry.FluxArtifact(t, map[string]string{"app.yaml": "unsigned\n"}, "", ""))
	f.foreign = f.reg.Push(t, "app", "foreign", registry.FluxArtifact(t, map[string]string{"app.yaml": "foreign\n"}, "", ""))
	f.reg.SignNotation(t, "app", f.signed, f.trusted.key, f.trusted.chain)
	other := newSigner(t, "untrusted")
	f.reg.SignNotation(t, "app", f.foreign, other.key, other.chain)
	return f
}

func (f *fixture) ref(t testing.TB, d v1.Hash) name.Digest {
	t.Helper()
	ref, err := name.NewDigest(f.reg.Host + "/app@" + d.String())
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

func (f *fixture) verifier(t testing.TB, scope, level string) *Verifier {
	t.Helper()
	v, err := NewVerifier(t.Context(), map[string][]byte{TrustPolicyKey: policy(t, scope, level), "ca.crt": f.trusted.ca.CertPEM}, "default/trust")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestVerify(t *testing.T) {
	f := newFixture(t)
	reg := Registry{Transport: http.DefaultTransport.(*http.Transport).Clone(), UserAgent: "headwater-test"}
	scope := f.reg.Host + "/app"
	for _, tc := range []struct {
		name         string
		scope, level string
		digest       v1.Hash
		want         Result
		wantErr      string // a part of the error's message
		handling     failure.Handling
	}{
		{name: "signed by the trusted CA", scope: scope, level: "strict", digest: f.signed, want: Verified},
		{name: "wildcard scope", scope: "*", level: "strict", digest: f.signed, want: Verified},
		{name: "unsigned", scope: scope, level: "strict", digest: f.unsigned, handling: failure.Final,
			wantErr: fmt.Sprintf("no signature is associated with %q, make sure the artifact was signed successfully", f.ref(t, f.unsigned).Name())},
		{name: "signed by a CA not in the trust store", scope: scope, level: "strict", digest: f.foreign, handling: failure.Final,
			wantErr: "the signature's certificate chain does not contain any trusted certificate"},
		{name: "trust policy for another scope", scope: "registry.example.com/app", level: "strict", digest: f.signed, handling: failure.Stalling,
			wantErr: fmt.Sprintf("artifact %q has no applicable trust policy statement", f.ref(t, f.signed).Name())},
		{name: "level skip", scope: scope, level: "skip", digest: f.unsigned, want: Ignored},
		{name: "level audit logs an untrusted signer", scope: scope, level: "audit", digest: f.foreign, want: Ignored},
		{name: "level audit verifies a trusted signer", scope: scope, level: "audit", digest: f.signed, want: Verified},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := f.verifier(t, tc.scope, tc.level).Verify(t.Context(), f.ref(t, tc.digest), reg)
			if tc.wantErr == "" {
				if err != nil || got != tc.want {
					t.Fatalf("Verify = %v, %v; want %v", got, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Verify error %v\nwant one saying %s", err, tc.wantErr)
			}
			if h := Handling(err); h != tc.handling {
				t.Errorf("Handling = %s, want %s", h, tc.handling)
			}
		})
	}
}

// TestVerifyReadsTheReferrersTag checks where the signature is found: the
// distribution registry has no Referrers API (404), so the verifier falls
// back to the referrers tag "sha256-<hex>" that signing wrote.
func TestVerifyReadsTheReferrersTag(t *testing.T) {
	f := newFixture(t)
	before := len(f.reg.Settle(t))
	if _, err := f.verifier(t, "*", "strict").Verify(t.Context(), f.ref(t, f.signed), Registry{}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	var api, tag bool
	for _, r := range f.reg.Settle(t)[before:] {
		seen = append(seen, fmt.Sprintf("%s %s %d", r.Method, r.Path, r.Status))
		api = api || strings.HasPrefix(r.Path, "/v2/app/referrers/"+f.signed.String())
		tag = tag || r.Method == http.MethodGet && r.Path == "/v2/app/manifests/sha256-"+f.signed.Hex && r.Status == http.StatusOK
	}
	if !api || !tag {
		t.Errorf("requests %v\nwant the Referrers API asked, then the referrers tag read", seen)
	}
}

// TestVerifyUsesTheCredentials checks that the registry is reached with
// the caller's credentials and transport: a registry that requires them
// verifies with them and refuses without.
func TestVerifyUsesTheCredentials(t *testing.T) {
	reg := registry.New(t, registry.Options{Username: "flux", Password: "s3cr3t", TLS: true})
	s := newSigner(t, "trusted")
	d := reg.Push(t, "app", "v1", registry.FluxArtifact(t, map[string]string{"a": "1"}, "", ""))
	reg.SignNotation(t, "app", d, s.key, s.chain)
	v, err := NewVerifier(t.Context(), map[string][]byte{TrustPolicyKey: policy(t, "*", "strict"), "ca.crt": s.ca.CertPEM}, "default/trust")
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewDigest(reg.Host + "/app@" + d.String())
	if err != nil {
		t.Fatal(err)
	}
	rt := trustingTransport(t, reg)
	if got, err := v.Verify(t.Context(), ref, Registry{Transport: rt, Auth: &authn.Basic{Username: "flux", Password: "s3cr3t"}}); err != nil || got != Verified {
		t.Fatalf("with credentials: %v, %v", got, err)
	}
	_, err = v.Verify(t.Context(), ref, Registry{Transport: rt, Auth: &authn.Basic{Username: "flux", Password: "wrong"}})
	if err == nil || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("wrong credentials: %v, want a failure that does not print the password", err)
	}
	if h := Handling(err); h != failure.Final {
		t.Errorf("wrong credentials: Handling = %s, want final", h)
	}
}

// trustingTransport is a transport that trusts the registry's CA.
func trustingTransport(t testing.TB, reg *registry.Server) http.RoundTripper {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(reg.CACert())
	tr := remote.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return tr
}

// TestVerifyUnreachable checks that a registry that cannot be reached is
// a transient failure.
func TestVerifyUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := newSigner(t, "trusted")
	v, err := NewVerifier(t.Context(), map[string][]byte{TrustPolicyKey: policy(t, "*", "strict"), "ca.crt": s.ca.CertPEM}, "default/trust")
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewDigest(addr + "/app@sha256:" + strings.Repeat("a", 64))
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.Verify(t.Context(), ref, Registry{})
	var regErr *RegistryError
	if !errors.As(err, &regErr) || Handling(err) != failure.Transient {
		t.Fatalf("Verify error %v (%T), want a transient *RegistryError", err, err)
	}
}

// BenchmarkVerify measures one verification of a signed artifact: its time
// and the registry requests it makes.
func BenchmarkVerify(b *testing.B) {
	f := newFixture(b)
	v := f.verifier(b, "*", "strict")
	ref := f.ref(b, f.signed)
	reg := Registry{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	before := len(f.reg.Settle(b))
	start := time.Now()
	b.ResetTimer()
	for b.Loop() {
		if _, err := v.Verify(b.Context(), ref, reg); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	elapsed := time.Since(start)
	requests := f.reg.Settle(b)[before:]
	// The closing Settle marker is not the verifier's.
	n := len(requests) - 1
	b.ReportMetric(float64(n)/float64(b.N), "requests/op")
	if b.N > 0 {
		b.Logf("%d verifications in %s; requests of the last: %v", b.N, elapsed, lastVerification(requests))
	}
}

// lastVerification lists the requests after the last ping of a list.
func lastVerification(rs []registry.Request) []string {
	var out []string
	for _, r := range rs {
		if r.Path == "/v2/" {
			out = out[:0]
		}
		if strings.Contains(r.Path, "settle=") {
			continue
		}
		out = append(out, fmt.Sprintf("%s %s %d", r.Method, r.Path, r.Status))
	}
	return out
}
