package e2e

import (
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	gcrv1 "github.com/google/go-containerregistry/pkg/v1"
	helmregistry "helm.sh/helm/v3/pkg/registry"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	ociregistry "github.com/headwater-gitops/headwater/testsupport/registry"
	"github.com/headwater-gitops/headwater/testsupport/testca"
)

// The notation tests sign with notation-go (as `notation sign` does)
// certificates made by the test: a CA and a leaf with the code-signing
// extended key usage. The CA is the trust store the verify Secret holds
// beside trustpolicy.json; another CA's leaf signs what must not verify.

// notationSigner is a CA and a code-signing certificate it issued.
type notationSigner struct {
	caPEM []byte
	key   crypto.PrivateKey
	chain []*x509.Certificate
}

func newNotationSigner(t *testing.T, name string) *notationSigner {
	t.Helper()
	ca, err := testca.New(name)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(x509.ExtKeyUsageCodeSigning, name+" signer", nil)
	if err != nil {
		t.Fatal(err)
	}
	return &notationSigner{caPEM: ca.CertPEM, key: leaf.Pair.PrivateKey, chain: []*x509.Certificate{leaf.Pair.Leaf, ca.Cert}}
}

// trustPolicy is a notation trust policy with one strict statement for
// scope, trusting the CA store and any identity.
func trustPolicy(t *testing.T, scope string) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"version": "1.0",
		"trustPolicies": []map[string]any{{
			"name": "headwater", "registryScopes": []string{scope},
			"signatureVerification": map[string]string{"level": "strict"},
			"trustStores":           []string{"ca:headwater"}, "trustedIdentities": []string{"*"},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// notationCase is a change that makes verification fail: the verify
// Secret's data, and the tag (or chart version) to move to; the failure
// shows in SourceVerified and Ready with reason, a message that contains
// want, and a Warning Event with Ready's reason and the same message.
type notationCase struct {
	name   string
	secret map[string]string
	ref    string
	reason string
	want   string
}

// TestOCIRepositoryNotation checks spec.verify with provider notation: an
// artifact signed by a certificate of the Secret's trust store is stored
// with SourceVerified=True; then each failure (an unsigned artifact, one
// signed by a CA not in the trust store, a trust policy that does not
// parse, one for another registry scope, a Secret without a trust policy)
// sets SourceVerified=False and Ready=False with Flux's reason and
// message and a Warning Event, keeps the verified artifact served with
// the same digest and stores nothing new; with the Secret put right, a
// new signed artifact is stored and verified.
func TestOCIRepositoryNotation(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name, secret = "oci-notation", "oci-notation-trust"
	reg := ociregistry.New(t, ociregistry.Options{})
	trusted, untrusted := newNotationSigner(t, "trusted"), newNotationSigner(t, "untrusted")
	digests := map[string]gcrv1.Hash{}
	for _, tag := range []string{"v1", "unsigned", "untrusted", "v2", "v3", "v4", "v5"} {
		digests[tag] = reg.Push(t, "app", tag, ociregistry.FluxArtifact(t, map[string]string{"app.yaml": tag + "\n"}, "", ""))
		switch tag {
		case "unsigned":
		case "untrusted":
			reg.SignNotation(t, "app", digests[tag], untrusted.key, untrusted.chain)
		default:
			reg.SignNotation(t, "app", digests[tag], trusted.key, trusted.chain)
		}
	}
	ref := func(tag string) string { return reg.Host + "/app@" + digests[tag].String() }
	good := map[string]string{"trustpolicy.json": trustPolicy(t, reg.Host+"/app"), "ca.crt": string(trusted.caPEM)}
	createSecret(t, secret, good)
	createOCIRepository(t, name, reg.URL("app"), func(o *sourcev1.OCIRepository) {
		o.Spec.Reference = &sourcev1.OCIRepositoryRef{Tag: "v1"}
		o.Spec.Verify = &sourcev1.OCIRepositoryVerification{Provider: "notation", SecretRef: &meta.LocalObjectReference{Name: secret}}
	})
	rev := "v1@" + digests["v1"].String()
	obj := waitOCIArtifact(t, name, rev)
	checkOCIContent(t, obj, map[string]string{"app.yaml": "v1\n"})
	if c := conditionOf(t, obj, sourcev1.SourceVerifiedCondition); c.Status != metav1.ConditionTrue || c.Reason != meta.SucceededReason ||
		c.Message != "verified signature of revision "+rev {
		t.Errorf("SourceVerified=%s %s %q", c.Status, c.Reason, c.Message)
	}
	verified := *obj.Status.Artifact
	stored := storedFilesOf(t, "ocirepository", name)

	const prefix = "failed to verify the signature using provider 'notation': "
	for _, tc := range []notationCase{
		{name: "unsigned artifact", secret: good, ref: "unsigned", reason: sourcev1.VerificationError,
			want: prefix + fmt.Sprintf("no signature is associated with %q, make sure the artifact was signed successfully", ref("unsigned"))},
		{name: "certificate not in the trust store", secret: good, ref: "untrusted", reason: sourcev1.VerificationError,
			want: prefix + "signature verification failed"},
		{name: "trust policy that does not parse", ref: "v2", reason: sourcev1.VerificationError,
			secret: map[string]string{"trustpolicy.json": "{version: 1.0", "ca.crt": string(trusted.caPEM)},
			want:   prefix + "error occurred while parsing trustpolicy.json: invalid character 'v'"},
		{name: "trust policy for another registry scope", ref: "v3", reason: sourcev1.VerificationError,
			secret: map[string]string{"trustpolicy.json": trustPolicy(t, "registry.example.com/app"), "ca.crt": string(trusted.caPEM)},
			want:   prefix + fmt.Sprintf("artifact %q has no applicable trust policy statement", ref("v3"))},
		{name: "Secret without a trust policy", ref: "v4", reason: sourcev1.VerificationError,
			secret: map[string]string{"ca.crt": string(trusted.caPEM)},
			want:   prefix + fmt.Sprintf("'trustpolicy.json' not found in secret '%s/%s'", namespace, secret)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			patchSecret(t, secret, tc.secret)
			patchOCI(t, name, func(o *sourcev1.OCIRepository) { o.Spec.Reference.Tag = tc.ref })
			obj := waitNotationFailure(t, "ocirepository "+name, func() fluxSource { return getOCI(t, name) }, tc.reason, tc.reason, tc.want)
			waitKindEvent(t, ociKind, name, corev1.EventTypeWarning, tc.reason, func(msg string) bool { return strings.Contains(msg, tc.want) })
			a := obj.(*sourcev1.OCIRepository).Status.Artifact
			if a == nil || a.Digest != verified.Digest || a.Revision != verified.Revision {
				t.Fatalf("artifact after the failure %+v, want the verified one %+v", a, verified)
			}
			if got := sha256Digest(download(t, a.URL)); got != verified.Digest {
				t.Errorf("%s serves digest %s, want %s", a.URL, got, verified.Digest)
			}
			if now := storedFilesOf(t, "ocirepository", name); !sameFiles(now, stored) {
				t.Errorf("storage holds %v after the failure, held %v", now, stored)
			}
		})
	}

	t.Run("recovers", func(t *testing.T) {
		patchSecret(t, secret, good)
		patchOCI(t, name, func(o *sourcev1.OCIRepository) { o.Spec.Reference.Tag = "v5" })
		rev := "v5@" + digests["v5"].String()
		obj := waitOCIArtifact(t, name, rev)
		checkOCIContent(t, obj, map[string]string{"app.yaml": "v5\n"})
		if c := conditionOf(t, obj, sourcev1.SourceVerifiedCondition); c.Status != metav1.ConditionTrue || c.Message != "verified signature of revision "+rev {
			t.Errorf("SourceVerified=%s %q", c.Status, c.Message)
		}
	})
}

// TestHelmChartNotation checks a HelmChart's spec.verify with provider
// notation on charts of an OCI HelmRepository, as
// TestOCIRepositoryNotation does an OCIRepository's: a chart signed with
// a trusted certificate is stored with SourceVerified=True; each failure
// keeps it. A chart that does not verify fails as Flux's build does
// (BuildFailed, Ready reason ChartVerificationError); a Secret that cannot
// verify anything fails before (Ready reason VerificationError).
func TestHelmChartNotation(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name, secret = "chart-notation", "chart-notation-trust"
	reg := ociregistry.New(t, ociregistry.Options{})
	push, err := helmregistry.NewClient(helmregistry.ClientOptPlainHTTP(), helmregistry.ClientOptWriter(io.Discard),
		helmregistry.ClientOptCredentialsFile(filepath.Join(t.TempDir(), "creds.json")))
	if err != nil {
		t.Fatal(err)
	}
	trusted, untrusted := newNotationSigner(t, "trusted"), newNotationSigner(t, "untrusted")
	digests := map[string]gcrv1.Hash{}
	for _, v := range []string{"1.0.0", "2.0.0", "3.0.0", "4.0.0", "5.0.0", "6.0.0", "7.0.0"} {
		p, err := chartrepo.Package(t.TempDir(), chartrepo.Chart{Name: "podinfo", Version: v})
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		res, err := push.Push(data, reg.Host+"/charts/podinfo:"+v)
		if err != nil {
			t.Fatal(err)
		}
		d, err := gcrv1.NewHash(res.Manifest.Digest)
		if err != nil {
			t.Fatal(err)
		}
		digests[v] = d
		switch v {
		case "2.0.0": // unsigned
		case "3.0.0":
			reg.SignNotation(t, "charts/podinfo", d, untrusted.key, untrusted.chain)
		default:
			reg.SignNotation(t, "charts/podinfo", d, trusted.key, trusted.chain)
		}
	}
	ref := func(v string) string { return reg.Host + "/charts/podinfo@" + digests[v].String() }
	good := map[string]string{"trustpolicy.json": trustPolicy(t, reg.Host+"/charts/podinfo"), "ca.crt": string(trusted.caPEM)}
	createSecret(t, secret, good)
	createObject(t, &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: sourcev1.HelmRepositorySpec{URL: reg.URL("charts"), Type: sourcev1.HelmRepositoryTypeOCI, Insecure: true,
			Interval: metav1.Duration{Duration: 5 * time.Minute}},
	})
	createObject(t, &sourcev1.HelmChart{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: sourcev1.HelmChartSpec{Chart: "podinfo", Version: "1.0.0", Interval: metav1.Duration{Duration: 5 * time.Minute},
			SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: name},
			Verify:    &sourcev1.HelmChartVerification{Provider: "notation", SecretRef: &meta.LocalObjectReference{Name: secret}}},
	})
	get := func() *sourcev1.HelmChart { return getObject(t, name, &sourcev1.HelmChart{}) }
	chart := waitHelmChart(t, name, "1.0.0")
	if c := conditionOf(t, chart, sourcev1.SourceVerifiedCondition); c.Status != metav1.ConditionTrue || c.Reason != meta.SucceededReason ||
		c.Message != "verified signature of version 1.0.0" {
		t.Errorf("SourceVerified=%s %s %q", c.Status, c.Reason, c.Message)
	}
	verified := *chart.Status.Artifact
	stored := storedFilesOf(t, "helmchart", name)

	failed := func(version string) string {
		return fmt.Sprintf("chart verification error: failed to verify oci://%s/charts/podinfo:%s: ", reg.Host, version)
	}
	const prefix = "failed to verify the signature using provider 'notation': "
	for _, tc := range []notationCase{
		{name: "unsigned chart", secret: good, ref: "2.0.0", reason: "ChartVerificationError",
			want: failed("2.0.0") + fmt.Sprintf("no signature is associated with %q, make sure the artifact was signed successfully", ref("2.0.0"))},
		{name: "certificate not in the trust store", secret: good, ref: "3.0.0", reason: "ChartVerificationError",
			want: failed("3.0.0") + "signature verification failed"},
		{name: "trust policy that does not parse", ref: "4.0.0", reason: sourcev1.VerificationError,
			secret: map[string]string{"trustpolicy.json": "{version: 1.0", "ca.crt": string(trusted.caPEM)},
			want:   prefix + "error occurred while parsing trustpolicy.json: invalid character 'v'"},
		{name: "trust policy for another registry scope", ref: "5.0.0", reason: "ChartVerificationError",
			secret: map[string]string{"trustpolicy.json": trustPolicy(t, "registry.example.com/charts/podinfo"), "ca.crt": string(trusted.caPEM)},
			want:   failed("5.0.0") + fmt.Sprintf("artifact %q has no applicable trust policy statement", ref("5.0.0"))},
		{name: "Secret without a trust policy", ref: "6.0.0", reason: sourcev1.VerificationError,
			secret: map[string]string{"ca.crt": string(trusted.caPEM)},
			want:   prefix + fmt.Sprintf("'trustpolicy.json' not found in secret '%s/%s'", namespace, secret)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			patchSecret(t, secret, tc.secret)
			patchObject(t, get(), func(c *sourcev1.HelmChart) { c.Spec.Version = tc.ref })
			obj := waitNotationFailure(t, "helmchart "+name, func() fluxSource { return get() }, sourcev1.VerificationError, tc.reason, tc.want)
			if tc.reason == "ChartVerificationError" {
				if c := conditionOf(t, obj, sourcev1.BuildFailedCondition); c.Status != metav1.ConditionTrue || c.Reason != tc.reason || !strings.Contains(c.Message, tc.want) {
					t.Errorf("BuildFailed=%s %s %q", c.Status, c.Reason, c.Message)
				}
			}
			waitKindEvent(t, sourcev1.HelmChartKind, name, corev1.EventTypeWarning, tc.reason, func(msg string) bool { return strings.Contains(msg, tc.want) })
			a := obj.(*sourcev1.HelmChart).Status.Artifact
			if a == nil || a.Digest != verified.Digest || a.Revision != verified.Revision {
				t.Fatalf("artifact after the failure %+v, want the verified one %+v", a, verified)
			}
			if got := sha256Digest(download(t, a.URL)); got != verified.Digest {
				t.Errorf("%s serves digest %s, want %s", a.URL, got, verified.Digest)
			}
			if now := storedFilesOf(t, "helmchart", name); !sameFiles(now, stored) {
				t.Errorf("storage holds %v after the failure, held %v", now, stored)
			}
		})
	}

	t.Run("recovers", func(t *testing.T) {
		patchSecret(t, secret, good)
		patchObject(t, get(), func(c *sourcev1.HelmChart) { c.Spec.Version = "7.0.0" })
		chart := waitHelmChart(t, name, "7.0.0")
		if c := conditionOf(t, chart, sourcev1.SourceVerifiedCondition); c.Status != metav1.ConditionTrue || c.Message != "verified signature of version 7.0.0" {
			t.Errorf("SourceVerified=%s %q", c.Status, c.Message)
		}
	})
}

// waitNotationFailure waits until the object has SourceVerified=False
// with reason VerificationError and Ready=False with readyReason, both
// with a message containing want, for its current generation, and returns
// it. verifiedReason is SourceVerified's expected reason.
func waitNotationFailure(t *testing.T, what string, get func() fluxSource, verifiedReason, readyReason, want string) fluxSource {
	t.Helper()
	var obj fluxSource
	eventually(t, fmt.Sprintf("%s SourceVerified=False %s and Ready=False %s saying %q", what, verifiedReason, readyReason, want), func() error {
		obj = get()
		for _, w := range []struct{ typ, reason string }{{sourcev1.SourceVerifiedCondition, verifiedReason}, {meta.ReadyCondition, readyReason}} {
			c := apimeta.FindStatusCondition(obj.GetConditions(), w.typ)
			if c == nil {
				return fmt.Errorf("no %s condition", w.typ)
			}
			if c.Status != metav1.ConditionFalse || c.Reason != w.reason || !strings.Contains(c.Message, want) || c.ObservedGeneration != obj.GetGeneration() {
				return fmt.Errorf("%s=%s %s (generation %d of %d): %s", w.typ, c.Status, c.Reason, c.ObservedGeneration, obj.GetGeneration(), c.Message)
			}
		}
		return nil
	})
	return obj
}

// storedFilesOf lists the files in the storage directory of the object
// kind/name (kind in lower case, as storage paths have it) with their
// modification times; a missing directory gives an empty map.
func storedFilesOf(t *testing.T, kind, name string) map[string]time.Time {
	t.Helper()
	dir := filepath.Join(env.StoragePath, kind, namespace, name)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	files := map[string]time.Time{}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = fi.ModTime()
	}
	return files
}

// sameFiles reports whether two listings name the same files with the
// same modification times.
func sameFiles(a, b map[string]time.Time) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !w.Equal(v) {
			return false
		}
	}
	return true
}
