package e2e

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	gcrv1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/registry"
)

// The OCIRepository tests run on the package's Env (directory storage),
// each against a registry of its own (the CNCF distribution registry).

const ociKind = sourcev1.OCIRepositoryKind

// TestOCIRepositoryWalkthrough is what a Flux user does with an
// OCIRepository: `flux push artifact` to a registry that requires
// credentials over TLS with its own CA, an OCIRepository with a semver
// range, a secretRef and a certSecretRef becomes Ready with the artifact;
// pushing a newer version and requesting a reconcile stores a new
// artifact; a reconcile with nothing new downloads nothing; wrong
// credentials fail the reconcile and keep the last artifact served.
func TestOCIRepositoryWalkthrough(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	const name = "oci-walkthrough"
	reg := registry.New(t, registry.Options{Username: "flux", Password: "s3cr3t", TLS: true})
	v1 := map[string]string{"deploy/app.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n", "README.md": "app\n"}
	d1 := reg.Push(t, "apps/podinfo", "1.0.0", registry.FluxArtifact(t, v1, "https://github.com/acme/podinfo", "main@sha1:1111"))
	createDockerSecret(t, name+"-auth", reg.DockerConfigJSON("flux", "s3cr3t"))
	createSecret(t, name+"-ca", map[string]string{"ca.crt": string(reg.CACert())})
	createOCIRepository(t, name, reg.URL("apps/podinfo"), func(o *sourcev1.OCIRepository) {
		o.Spec.Reference = &sourcev1.OCIRepositoryRef{SemVer: ">=1.0.0"}
		o.Spec.SecretRef = &meta.LocalObjectReference{Name: name + "-auth"}
		o.Spec.CertSecretRef = &meta.LocalObjectReference{Name: name + "-ca"}
	})

	rev1 := "1.0.0@" + d1.String()
	obj := waitOCIArtifact(t, name, rev1)
	checkOCIStored(t, obj, rev1)
	checkOCIContent(t, obj, v1)
	t.Run("Events", func(t *testing.T) {
		want := fmt.Sprintf("stored artifact with revision '%s' from '%s', origin source 'https://github.com/acme/podinfo', origin revision 'main@sha1:1111'",
			rev1, reg.URL("apps/podinfo"))
		e := waitKindEvent(t, ociKind, name, corev1.EventTypeNormal, "NewArtifact", nil)
		if e.Message != want {
			t.Errorf("NewArtifact Event %q\nwant               %q", e.Message, want)
		}
		ce := waitCloudEvent(t, recorder, ociKind, name, events.TypeArtifactStored, nil)
		if o := ce.outcome(); o.Artifact.URL != obj.Status.Artifact.URL || o.Revision != rev1 {
			t.Errorf("CloudEvent artifact url %s revision %s", o.Artifact.URL, o.Revision)
		}
	})

	// A newer version is pushed: the range picks it.
	v2 := map[string]string{"deploy/app.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-v2\n"}
	d2 := reg.Push(t, "apps/podinfo", "1.1.0", registry.FluxArtifact(t, v2, "https://github.com/acme/podinfo", "main@sha1:2222"))
	requestOCIReconcile(t, name)
	rev2 := "1.1.0@" + d2.String()
	obj2 := waitOCIArtifact(t, name, rev2)
	checkOCIStored(t, obj2, rev2)
	checkOCIContent(t, obj2, v2)

	t.Run("nothing new downloads nothing", func(t *testing.T) {
		before := reg.Settle(t)
		token := requestOCIReconcile(t, name)
		var obj3 *sourcev1.OCIRepository
		eventually(t, "lastHandledReconcileAt "+token, func() error {
			obj3 = getOCI(t, name)
			if obj3.Status.LastHandledReconcileAt != token {
				return fmt.Errorf("lastHandledReconcileAt %q", obj3.Status.LastHandledReconcileAt)
			}
			return nil
		})
		waitCloudEvent(t, recorder, ociKind, name, events.TypeArtifactUnchanged, func(o *events.Outcome) bool { return o.Job.ReconcileToken == token })
		if a, prev := obj3.Status.Artifact, obj2.Status.Artifact; a.Digest != prev.Digest || !a.LastUpdateTime.Equal(&prev.LastUpdateTime) {
			t.Errorf("artifact changed on a reconcile with nothing new: %+v, was %+v", a, prev)
		}
		for _, r := range reg.Settle(t)[len(before):] {
			if r.Method == http.MethodGet && (strings.Contains(r.Path, "/blobs/") || strings.Contains(r.Path, "/manifests/")) {
				t.Errorf("a reconcile with nothing new downloaded %s", r.Path)
			}
		}
	})

	t.Run("wrong credentials", func(t *testing.T) {
		patchDockerSecret(t, name+"-auth", reg.DockerConfigJSON("flux", "wrong"))
		requestOCIReconcile(t, name)
		// A semver range lists the tags first: Flux's reason for that is
		// ReadOperationFailed.
		obj := waitOCICondition(t, name, sourcev1.FetchFailedCondition, metav1.ConditionTrue, sourcev1.ReadOperationFailedReason)
		ready := conditionOf(t, obj, meta.ReadyCondition)
		if ready.Status != metav1.ConditionFalse || !strings.Contains(ready.Message, "UNAUTHORIZED") || strings.Contains(ready.Message, "wrong") {
			t.Errorf("Ready=%s %q, want False saying unauthorized without the password", ready.Status, ready.Message)
		}
		waitKindEvent(t, ociKind, name, corev1.EventTypeWarning, sourcev1.ReadOperationFailedReason, func(msg string) bool {
			return strings.Contains(msg, "UNAUTHORIZED")
		})
		if a := obj.Status.Artifact; a == nil || a.Digest != obj2.Status.Artifact.Digest {
			t.Fatalf("artifact after the failure %+v, want the previous one", a)
		}
		checkOCIContent(t, obj, v2)
	})
	t.Cleanup(func() { requireServicesRunning(t) })
}

// TestOCIRepositoryRefs checks spec.ref (tag, digest), a multi-platform
// index, spec.layerSelector and spec.ignore, each on an OCIRepository of
// its own against one registry without credentials.
func TestOCIRepositoryRefs(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	reg := registry.New(t, registry.Options{})
	files := map[string]string{"app.yaml": "kind: ConfigMap\n", "notes.md": "notes\n"}
	tagged := reg.Push(t, "app", "v1", registry.FluxArtifact(t, files, "", ""))
	latest := reg.Push(t, "app", "latest", registry.FluxArtifact(t, map[string]string{"latest.yaml": "x\n"}, "", ""))
	twoLayers := reg.Push(t, "layers", "v1", registry.Artifact{Layers: []registry.Layer{
		{Data: registry.TarGz(t, registry.Files(map[string]string{"first.yaml": "1\n"})...)},
		{MediaType: "application/vnd.acme.config.v1.tar+gzip", Data: registry.TarGz(t, registry.Files(map[string]string{"second.yaml": "2\n"})...)},
	}})
	amd := registry.FluxArtifact(t, map[string]string{"arch.yaml": "amd64\n"}, "", "")
	amd.Platform = &platformLinuxAMD64
	arm := registry.FluxArtifact(t, map[string]string{"arch.yaml": "arm64\n"}, "", "")
	arm.Platform = &platformLinuxARM64
	index := reg.PushIndex(t, "multi", "v1", arm, amd)
	ignore := "*.md\n"

	tests := []struct {
		name  string
		url   string
		spec  func(*sourcev1.OCIRepository)
		rev   string
		files map[string]string
	}{
		{name: "oci-latest", url: reg.URL("app"), rev: "latest@" + latest.String(), files: map[string]string{"latest.yaml": "x\n"}},
		{name: "oci-tag", url: reg.URL("app"), spec: func(o *sourcev1.OCIRepository) { o.Spec.Reference = &sourcev1.OCIRepositoryRef{Tag: "v1"} },
			rev: "v1@" + tagged.String(), files: files},
		{name: "oci-digest", url: reg.URL("app"), spec: func(o *sourcev1.OCIRepository) {
			o.Spec.Reference = &sourcev1.OCIRepositoryRef{Digest: tagged.String(), Tag: "latest"}
			o.Spec.Ignore = &ignore
		}, rev: tagged.String(), files: map[string]string{"app.yaml": files["app.yaml"]}},
		{name: "oci-layer-selector", url: reg.URL("layers"), spec: func(o *sourcev1.OCIRepository) {
			o.Spec.Reference = &sourcev1.OCIRepositoryRef{Tag: "v1"}
			o.Spec.LayerSelector = &sourcev1.OCILayerSelector{MediaType: "application/vnd.acme.config.v1.tar+gzip", Operation: sourcev1.OCILayerExtract}
		}, rev: "v1@" + twoLayers.String(), files: map[string]string{"second.yaml": "2\n"}},
		{name: "oci-index", url: reg.URL("multi"), spec: func(o *sourcev1.OCIRepository) { o.Spec.Reference = &sourcev1.OCIRepositoryRef{Tag: "v1"} },
			rev: "v1@" + index.String(), files: map[string]string{"arch.yaml": "amd64\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			opts := []func(*sourcev1.OCIRepository){}
			if tt.spec != nil {
				opts = append(opts, tt.spec)
			}
			createOCIRepository(t, tt.name, tt.url, opts...)
			obj := waitOCIArtifact(t, tt.name, tt.rev)
			checkOCIStored(t, obj, tt.rev)
			checkOCIContent(t, obj, tt.files)
			if ls := obj.Spec.LayerSelector; ls != nil && (obj.Status.ObservedLayerSelector == nil || *obj.Status.ObservedLayerSelector != *ls) {
				t.Errorf("status.observedLayerSelector %v, want %v", obj.Status.ObservedLayerSelector, ls)
			}
		})
	}

	// Two sources of the same content: the second reuses the first's
	// artifact (the content cache) after proving its own access, and the
	// layer is downloaded once.
	t.Run("oci-shared", func(t *testing.T) {
		d := reg.Push(t, "shared", "v1", registry.FluxArtifact(t, map[string]string{"shared.yaml": "x\n"}, "", ""))
		rev := "v1@" + d.String()
		for _, name := range []string{"oci-shared-a", "oci-shared-b"} {
			createOCIRepository(t, name, reg.URL("shared"), func(o *sourcev1.OCIRepository) { o.Spec.Reference = &sourcev1.OCIRepositoryRef{Tag: "v1"} })
			obj := waitOCIArtifact(t, name, rev)
			checkOCIContent(t, obj, map[string]string{"shared.yaml": "x\n"})
		}
		if n := reg.CountRequests(http.MethodGet, "/v2/shared/blobs/"); n != 1 {
			t.Errorf("%d blob downloads for two sources of the same content, want 1 (the layer, once)", n)
		}
	})

	// Layer operation copy stores the layer as it is: the artifact's
	// bytes and digest are the layer's, its metadata the annotations.
	t.Run("oci-copy", func(t *testing.T) {
		const name = "oci-copy"
		layer := registry.TarGz(t, registry.Files(map[string]string{"chart/Chart.yaml": "name: app\n"})...)
		a := registry.FluxArtifact(t, nil, "https://github.com/acme/chart", "v1@sha1:3333")
		a.Layers = []registry.Layer{{MediaType: "application/vnd.cncf.helm.chart.content.v1.tar+gzip", Data: layer}}
		d := reg.Push(t, "copy", "v1", a)
		createOCIRepository(t, name, reg.URL("copy"), func(o *sourcev1.OCIRepository) {
			o.Spec.Reference = &sourcev1.OCIRepositoryRef{Tag: "v1"}
			o.Spec.LayerSelector = &sourcev1.OCILayerSelector{MediaType: "application/vnd.cncf.helm.chart.content.v1.tar+gzip", Operation: sourcev1.OCILayerCopy}
		})
		rev := "v1@" + d.String()
		obj := waitOCIArtifact(t, name, rev)
		checkOCIStored(t, obj, rev)
		if body := download(t, obj.Status.Artifact.URL); !bytes.Equal(body, layer) {
			t.Errorf("artifact is %d bytes, want the layer's %d bytes as they are", len(body), len(layer))
		}
		if want := sha256Digest(layer); obj.Status.Artifact.Digest != want {
			t.Errorf("artifact digest %s, want the layer's %s", obj.Status.Artifact.Digest, want)
		}
		if md := obj.Status.Artifact.Metadata; md[registry.RevisionAnnotation] != "v1@sha1:3333" {
			t.Errorf("artifact metadata %v, want the manifest's annotations", md)
		}
	})

	// Changing the layer selector rebuilds the artifact of the same digest.
	t.Run("layer selector changed", func(t *testing.T) {
		const name = "oci-layer-change"
		createOCIRepository(t, name, reg.URL("layers"), func(o *sourcev1.OCIRepository) {
			o.Spec.Reference = &sourcev1.OCIRepositoryRef{Tag: "v1"}
		})
		rev := "v1@" + twoLayers.String()
		obj := waitOCIArtifact(t, name, rev)
		checkOCIContent(t, obj, map[string]string{"first.yaml": "1\n"})
		patchOCI(t, name, func(o *sourcev1.OCIRepository) {
			o.Spec.LayerSelector = &sourcev1.OCILayerSelector{MediaType: "application/vnd.acme.config.v1.tar+gzip"}
		})
		eventually(t, "the second layer's artifact", func() error {
			obj = waitOCIArtifact(t, name, rev)
			if obj.Status.ObservedLayerSelector == nil {
				return fmt.Errorf("observedLayerSelector not set yet")
			}
			return nil
		})
		checkOCIContent(t, obj, map[string]string{"second.yaml": "2\n"})
	})
}

// checkOCIStored checks everything Flux shows for an OCIRepository that
// stored an artifact of revision rev.
func checkOCIStored(t *testing.T, obj *sourcev1.OCIRepository, rev string) {
	t.Helper()
	a := obj.Status.Artifact
	digest := rev[strings.LastIndex(rev, "@")+1:]
	dir := fmt.Sprintf("ocirepository/%s/%s/", obj.Namespace, obj.Name)
	if path := dir + digest + ".tar.gz"; a.Path != path || a.URL != env.ArtifactURL(path) {
		t.Errorf("artifact path %q url %q, want %q", a.Path, a.URL, path)
	}
	if want := env.ArtifactURL(dir + "latest.tar.gz"); obj.Status.URL != want {
		t.Errorf("status.url %q, want %q", obj.Status.URL, want)
	}
	if !digestPattern.MatchString(a.Digest) || a.Revision != rev {
		t.Errorf("artifact digest %q revision %q, want sha256:<hex> and %q", a.Digest, a.Revision, rev)
	}
	want := fmt.Sprintf("stored artifact for digest '%s'", rev)
	for _, typ := range []string{meta.ReadyCondition, sourcev1.ArtifactInStorageCondition} {
		if c := conditionOf(t, obj, typ); c.Status != metav1.ConditionTrue || c.Reason != meta.SucceededReason || c.Message != want {
			t.Errorf("%s=%s %s %q, want True %s %q", typ, c.Status, c.Reason, c.Message, meta.SucceededReason, want)
		}
	}
	if (obj.Spec.Ignore == nil) != (obj.Status.ObservedIgnore == nil) {
		t.Errorf("status.observedIgnore %v, spec.ignore %v", obj.Status.ObservedIgnore, obj.Spec.Ignore)
	}
}

// checkOCIContent downloads the artifact and latest.tar.gz (status.url)
// and checks that both are the artifact in status, holding exactly files.
func checkOCIContent(t *testing.T, obj *sourcev1.OCIRepository, files map[string]string) {
	t.Helper()
	a := obj.Status.Artifact
	body := download(t, a.URL)
	if got := sha256Digest(body); got != a.Digest {
		t.Errorf("downloaded %s has digest %s, status says %s", a.URL, got, a.Digest)
	}
	if d := diffTrees(untarArtifact(t, body), files); d != "" {
		t.Errorf("artifact %s: %s", a.URL, d)
	}
	if got := sha256Digest(download(t, obj.Status.URL)); got != a.Digest {
		t.Errorf("%s has digest %s, want the artifact's %s", obj.Status.URL, got, a.Digest)
	}
}

// createOCIRepository creates the OCIRepository name for url with an
// interval of a minute and whatever the options set; it is deleted when
// the test ends, before its registry stops.
func createOCIRepository(t *testing.T, name, url string, opts ...func(*sourcev1.OCIRepository)) {
	t.Helper()
	obj := &sourcev1.OCIRepository{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       sourcev1.OCIRepositorySpec{URL: url, Interval: metav1.Duration{Duration: time.Minute}},
	}
	for _, o := range opts {
		o(obj)
	}
	createObject(t, obj)
}

// getOCI returns the OCIRepository name.
func getOCI(t *testing.T, name string) *sourcev1.OCIRepository {
	t.Helper()
	return getObject(t, name, &sourcev1.OCIRepository{})
}

// patchOCI applies mutate to the OCIRepository name with a merge patch.
func patchOCI(t *testing.T, name string, mutate func(*sourcev1.OCIRepository)) {
	t.Helper()
	patchObject(t, getOCI(t, name), mutate)
}

// requestOCIReconcile sets reconcile.fluxcd.io/requestedAt to now, as
// `flux reconcile source oci` does, and returns the token.
func requestOCIReconcile(t *testing.T, name string) string {
	t.Helper()
	return requestReconcileOf(t, getOCI(t, name))
}

// waitOCIArtifact waits until the OCIRepository name is Ready for its
// current generation with an artifact of revision rev, and returns it.
func waitOCIArtifact(t *testing.T, name, rev string) *sourcev1.OCIRepository {
	t.Helper()
	return waitReady(t, "ocirepository "+name, func() *sourcev1.OCIRepository { return getOCI(t, name) },
		func(o *sourcev1.OCIRepository) int64 { return o.Status.ObservedGeneration }, rev)
}

// waitOCICondition waits until the OCIRepository name has a condition of
// type with status and reason, and returns the object.
func waitOCICondition(t *testing.T, name, typ string, status metav1.ConditionStatus, reason string) *sourcev1.OCIRepository {
	t.Helper()
	return waitConditionOf(t, "ocirepository "+name, func() *sourcev1.OCIRepository { return getOCI(t, name) }, typ, status, reason)
}

// createDockerSecret creates a kubernetes.io/dockerconfigjson Secret.
func createDockerSecret(t *testing.T, name string, config []byte) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: config}}
	if err := env.Client.Create(t.Context(), s); err != nil {
		t.Fatalf("create secret %s: %v", name, err)
	}
}

// patchDockerSecret replaces a dockerconfigjson Secret's config.
func patchDockerSecret(t *testing.T, name string, config []byte) {
	t.Helper()
	patchSecret(t, name, map[string]string{corev1.DockerConfigJsonKey: string(config)})
}

var (
	platformLinuxAMD64 = gcrv1.Platform{OS: "linux", Architecture: "amd64"}
	platformLinuxARM64 = gcrv1.Platform{OS: "linux", Architecture: "arm64"}
)

// TestOCIRepositoryVerify checks spec.verify with cosign public keys: a
// signed artifact is stored with SourceVerified=True; an unsigned one is
// not stored, SourceVerified=False and Ready=False say why, with a Warning
// Event.
func TestOCIRepositoryVerify(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	reg := registry.New(t, registry.Options{})
	signed := reg.Push(t, "app", "signed", registry.FluxArtifact(t, map[string]string{"app.yaml": "signed\n"}, "", ""))
	reg.Push(t, "app", "unsigned", registry.FluxArtifact(t, map[string]string{"app.yaml": "unsigned\n"}, "", ""))
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	reg.Sign(t, "app", signed, key)
	createSecret(t, "oci-cosign-keys", map[string]string{"cosign.pub": string(registry.PublicKeyPEM(t, key))})
	verify := func(tag string) func(*sourcev1.OCIRepository) {
		return func(o *sourcev1.OCIRepository) {
			o.Spec.Reference = &sourcev1.OCIRepositoryRef{Tag: tag}
			o.Spec.Verify = &sourcev1.OCIRepositoryVerification{Provider: "cosign", SecretRef: &meta.LocalObjectReference{Name: "oci-cosign-keys"}}
		}
	}

	t.Run("signed", func(t *testing.T) {
		t.Parallel()
		createOCIRepository(t, "oci-signed", reg.URL("app"), verify("signed"))
		rev := "signed@" + signed.String()
		obj := waitOCIArtifact(t, "oci-signed", rev)
		checkOCIContent(t, obj, map[string]string{"app.yaml": "signed\n"})
		c := conditionOf(t, obj, sourcev1.SourceVerifiedCondition)
		if c.Status != metav1.ConditionTrue || c.Reason != meta.SucceededReason || c.Message != "verified signature of revision "+rev {
			t.Errorf("SourceVerified=%s %s %q", c.Status, c.Reason, c.Message)
		}
	})
	t.Run("unsigned", func(t *testing.T) {
		t.Parallel()
		createOCIRepository(t, "oci-unsigned", reg.URL("app"), verify("unsigned"))
		obj := waitOCICondition(t, "oci-unsigned", sourcev1.SourceVerifiedCondition, metav1.ConditionFalse, sourcev1.VerificationError)
		want := "failed to verify the signature using provider 'cosign': no matching signatures were found for '" + reg.Host + "/app:unsigned'"
		if c := conditionOf(t, obj, sourcev1.SourceVerifiedCondition); c.Message != want {
			t.Errorf("SourceVerified message %q\nwant %q", c.Message, want)
		}
		obj = waitOCICondition(t, "oci-unsigned", meta.ReadyCondition, metav1.ConditionFalse, sourcev1.VerificationError)
		waitKindEvent(t, ociKind, "oci-unsigned", corev1.EventTypeWarning, sourcev1.VerificationError, nil)
		if obj.Status.Artifact != nil {
			t.Errorf("an unverified artifact was stored: %+v", obj.Status.Artifact)
		}
	})
}
