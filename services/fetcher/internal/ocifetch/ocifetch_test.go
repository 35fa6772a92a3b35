package ocifetch

import (
	"archive/tar"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/testsupport/registry"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// kube returns a Secrets reader over objects in the default namespace.
func kube(t *testing.T, objs ...client.Object) secrets.Reader {
	t.Helper()
	scheme := runtime.NewScheme()
	must(t, corev1.AddToScheme(scheme))
	return secrets.NewKube(fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build())
}

func secret(name string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Data: data}
}

// request is a fetch request for an OCIRepository with spec.
func request(spec sourcev1.OCIRepositorySpec) *events.FetchRequested {
	return &events.FetchRequested{
		Job: events.Job{ID: "job-1", RequestedAt: time.Now(),
			Object: events.ObjectRef{Kind: Kind, Namespace: "default", Name: "podinfo", UID: "uid-1", Generation: 1}},
		OCIRepository: &spec,
	}
}

func TestFetch(t *testing.T) {
	reg := registry.New(t, registry.Options{})
	app := map[string]string{"deploy/app.yaml": "v: 1\n", "README.md": "docs\n", "logo.png": "png"}
	v110 := reg.Push(t, "app", "1.1.0", registry.FluxArtifact(t, app, "https://github.com/x/app", "main@sha1:1234"))
	v120 := reg.Push(t, "app", "1.2.0", registry.FluxArtifact(t, map[string]string{"v": "1.2.0"}, "", ""))
	reg.Push(t, "app", "2.0.0", registry.FluxArtifact(t, map[string]string{"v": "2.0.0"}, "", ""))
	reg.Push(t, "app", "1.3.0-rc.1", registry.FluxArtifact(t, map[string]string{"v": "1.3.0-rc.1"}, "", ""))
	latest := reg.Push(t, "app", "latest", registry.FluxArtifact(t, map[string]string{"v": "latest"}, "", ""))
	twoLayers := reg.Push(t, "two", "v1", registry.Artifact{Layers: []registry.Layer{
		{Data: registry.TarGz(t, registry.Files(map[string]string{"first": "1"})...)},
		{MediaType: "application/vnd.acme.manifests.v1.tar+gzip", Data: registry.TarGz(t, registry.Files(map[string]string{"second": "2"})...)},
	}})
	ignore := "*.md\n"
	cases := []struct {
		name     string
		spec     sourcev1.OCIRepositorySpec
		revision string
		files    map[string]string
		message  string
	}{
		{name: "latest by default", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("app")},
			revision: "latest@" + latest.String(), files: map[string]string{"v": "latest"}},
		{name: "tag", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("app"), Reference: &sourcev1.OCIRepositoryRef{Tag: "1.1.0"}},
			revision: "1.1.0@" + v110.String(),
			// Flux's default exclusions apply without ignore rules.
			files: map[string]string{"deploy/app.yaml": "v: 1\n", "README.md": "docs\n"},
			message: "stored artifact with revision '1.1.0@" + v110.String() + "' from '" + reg.URL("app") +
				"', origin source 'https://github.com/x/app', origin revision 'main@sha1:1234'"},
		{name: "semver", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("app"), Reference: &sourcev1.OCIRepositoryRef{SemVer: ">=1.0.0 <2.0.0", Tag: "latest"}},
			revision: "1.2.0@" + v120.String(), files: map[string]string{"v": "1.2.0"}},
		{name: "semver filter", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("app"), Reference: &sourcev1.OCIRepositoryRef{SemVer: ">=1.0.0-0", SemverFilter: ".*-rc.*"}},
			revision: "1.3.0-rc.1@", files: map[string]string{"v": "1.3.0-rc.1"}},
		{name: "digest over semver", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("app"),
			Reference: &sourcev1.OCIRepositoryRef{Digest: v110.String(), SemVer: "*"}, Ignore: &ignore},
			revision: v110.String(), files: map[string]string{"deploy/app.yaml": "v: 1\n", "logo.png": "png"}},
		{name: "first layer by default", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("two"), Reference: &sourcev1.OCIRepositoryRef{Tag: "v1"}},
			revision: "v1@" + twoLayers.String(), files: map[string]string{"first": "1"}},
		{name: "layer selector", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("two"), Reference: &sourcev1.OCIRepositoryRef{Tag: "v1"},
			LayerSelector: &sourcev1.OCILayerSelector{MediaType: "application/vnd.acme.manifests.v1.tar+gzip", Operation: sourcev1.OCILayerExtract}},
			revision: "v1@" + twoLayers.String(), files: map[string]string{"second": "2"}},
	}
	src := &Source{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rev, content, got, err := sourcetest.Fetch(t, src, request(tc.spec))
			must(t, err)
			if !strings.HasPrefix(rev, tc.revision) || content.Revision != rev {
				t.Errorf("revision %s (content %s), want %s", rev, content.Revision, tc.revision)
			}
			_, digest, _ := strings.Cut(rev, "@")
			if digest == "" {
				digest = rev
			}
			if content.ArtifactName != digest+".tar.gz" {
				t.Errorf("artifact name %s, want %s.tar.gz", content.ArtifactName, digest)
			}
			if !maps.Equal(got, tc.files) {
				t.Errorf("files %v, want %v", got, tc.files)
			}
			if tc.message != "" && content.EventMessage != tc.message {
				t.Errorf("message %q\nwant    %q", content.EventMessage, tc.message)
			}
		})
	}
}

// Resolving a tag asks for the manifest's digest with HEAD and nothing
// else: an unchanged artifact costs no download.
func TestResolveDownloadsNothing(t *testing.T) {
	reg := registry.New(t, registry.Options{})
	d := reg.Push(t, "app", "v1", registry.FluxArtifact(t, map[string]string{"a": "b"}, "", ""))
	before := len(reg.Settle(t))
	res, err := (&Source{}).Resolve(context.Background(), request(sourcev1.OCIRepositorySpec{URL: reg.URL("app"), Reference: &sourcev1.OCIRepositoryRef{Tag: "v1"}}))
	must(t, err)
	if res.Revision() != "v1@"+d.String() {
		t.Fatalf("revision %s", res.Revision())
	}
	after := reg.Settle(t)
	heads := 0
	for _, r := range after[before : len(after)-1] {
		switch {
		case r.Method == http.MethodHead && strings.Contains(r.Path, "/manifests/v1"):
			heads++
		case r.Method == http.MethodGet && r.Path != "/v2/":
			t.Errorf("resolving made a download: %+v", r)
		}
	}
	if heads != 1 {
		t.Errorf("resolving made %d HEAD requests for the tag, want 1: %v", heads, after[before:])
	}
	// A digest in the spec resolves without asking the registry at all.
	before = len(after)
	res, err = (&Source{}).Resolve(context.Background(), request(sourcev1.OCIRepositorySpec{URL: reg.URL("app"), Reference: &sourcev1.OCIRepositoryRef{Digest: d.String()}}))
	must(t, err)
	after = reg.Settle(t)
	if n := len(after) - 1 - before; n != 0 || res.Revision() != d.String() {
		t.Errorf("digest resolved to %s with %d requests: %v", res.Revision(), n, after[before:])
	}
	before = len(after)
	// Proving access to it asks for the manifest with HEAD.
	must(t, res.(source.Shareable).ProveAccess(context.Background()))
	if reg.WaitRequests(http.MethodHead, "/manifests/"+d.String(), 1, 5*time.Second) != 1 {
		t.Errorf("ProveAccess requests: %v", reg.Requests()[before:])
	}
}

func TestMultiPlatformIndex(t *testing.T) {
	reg := registry.New(t, registry.Options{})
	amd := registry.FluxArtifact(t, map[string]string{"arch": "amd64"}, "", "")
	amd.Platform = &v1.Platform{OS: "linux", Architecture: "amd64"}
	arm := registry.FluxArtifact(t, map[string]string{"arch": "arm64"}, "", "")
	arm.Platform = &v1.Platform{OS: "linux", Architecture: "arm64"}
	win := registry.FluxArtifact(t, map[string]string{"arch": "windows"}, "", "")
	win.Platform = &v1.Platform{OS: "windows", Architecture: "amd64"}
	idx := reg.PushIndex(t, "multi", "v1", arm, amd)
	reg.PushIndex(t, "noamd", "v1", arm, win)

	rev, _, got, err := sourcetest.Fetch(t, &Source{}, request(sourcev1.OCIRepositorySpec{URL: reg.URL("multi"), Reference: &sourcev1.OCIRepositoryRef{Tag: "v1"}}))
	must(t, err)
	if rev != "v1@"+idx.String() || got["arch"] != "amd64" {
		t.Errorf("revision %s, files %v: want the index digest and the linux/amd64 content", rev, got)
	}
	_, _, _, err = sourcetest.Fetch(t, &Source{}, request(sourcev1.OCIRepositorySpec{URL: reg.URL("noamd"), Reference: &sourcev1.OCIRepositoryRef{Tag: "v1"}}))
	sourcetest.CheckFailure(t, err, sourcev1.OCIPullFailedReason, failure.Final, "has no manifest for platform 'linux/amd64' (it has: linux/arm64, windows/amd64)")
}

// TestOnePingAFetch checks that a fetch's requests (the tag listing of a
// semver range, the manifest, the layer) share what the registry's ping
// told the first of them: one ping a fetch, on a registry that wants
// credentials.
func TestOnePingAFetch(t *testing.T) {
	reg := registry.New(t, registry.Options{Username: "flux", Password: "s3cr3t"})
	reg.Push(t, "app", "1.0.0", registry.FluxArtifact(t, map[string]string{"v": "1"}, "", ""))
	src := &Source{Secrets: kube(t, secret("creds", map[string][]byte{".dockerconfigjson": reg.DockerConfigJSON("flux", "s3cr3t")}))}
	before := len(reg.Settle(t))
	rev, _, got, err := sourcetest.Fetch(t, src, request(sourcev1.OCIRepositorySpec{URL: reg.URL("app"), Insecure: true,
		SecretRef: &meta.LocalObjectReference{Name: "creds"}, Reference: &sourcev1.OCIRepositoryRef{SemVer: "1.x"}}))
	must(t, err)
	if !strings.HasPrefix(rev, "1.0.0@") || got["v"] != "1" {
		t.Fatalf("revision %s, files %v", rev, got)
	}
	after := reg.Settle(t)
	pings := 0
	for _, r := range after[before : len(after)-1] {
		if r.Path == "/v2/" {
			pings++
		}
	}
	if pings != 1 {
		t.Errorf("the fetch pinged the registry %d times, want once: %v", pings, after[before:])
	}
}

func TestAuthentication(t *testing.T) {
	reg := registry.New(t, registry.Options{Username: "flux", Password: "s3cr3t", TLS: true})
	d := reg.Push(t, "app", "v1", registry.FluxArtifact(t, map[string]string{"a": "b"}, "", ""))
	certPEM, keyPEM, err := reg.ClientCert("flux")
	must(t, err)
	pull := map[string][]byte{".dockerconfigjson": reg.DockerConfigJSON("flux", "s3cr3t")}
	src := &Source{Secrets: kube(t,
		secret("creds", pull),
		secret("wrong", map[string][]byte{".dockerconfigjson": reg.DockerConfigJSON("flux", "nope")}),
		secret("other-registry", map[string][]byte{".dockerconfigjson": []byte(`{"auths":{"example.com":{"auth":"Zmx1eDpzM2NyM3Q="}}}`)}),
		secret("legacy", map[string][]byte{".dockercfg": []byte(`{"` + reg.Host + `":{"auth":"Zmx1eDpzM2NyM3Q="}}`)}),
		secret("opaque", map[string][]byte{"username": []byte("flux")}),
		secret("broken", map[string][]byte{".dockerconfigjson": []byte("{")}),
		secret("ca", map[string][]byte{"ca.crt": reg.CACert()}),
		secret("mtls", map[string][]byte{"ca.crt": reg.CACert(), "tls.crt": certPEM, "tls.key": keyPEM}),
		secret("no-ca", map[string][]byte{"other": []byte("x")}),
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "puller"},
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "other-registry"}, {Name: "creds"}}},
	)}
	ref := func(name string) *meta.LocalObjectReference { return &meta.LocalObjectReference{Name: name} }
	spec := func(edit func(*sourcev1.OCIRepositorySpec)) sourcev1.OCIRepositorySpec {
		s := sourcev1.OCIRepositorySpec{URL: reg.URL("app"), Reference: &sourcev1.OCIRepositoryRef{Tag: "v1"}, CertSecretRef: ref("ca")}
		edit(&s)
		return s
	}
	cases := []struct {
		name     string
		spec     sourcev1.OCIRepositorySpec
		reason   string
		handling failure.Handling
		message  string
	}{
		{name: "secretRef", spec: spec(func(s *sourcev1.OCIRepositorySpec) { s.SecretRef = ref("creds") })},
		{name: "legacy dockercfg", spec: spec(func(s *sourcev1.OCIRepositorySpec) { s.SecretRef = ref("legacy") })},
		{name: "service account", spec: spec(func(s *sourcev1.OCIRepositorySpec) { s.ServiceAccountName = "puller" })},
		{name: "client certificate", spec: spec(func(s *sourcev1.OCIRepositorySpec) { s.SecretRef = ref("creds"); s.CertSecretRef = ref("mtls") })},
		{name: "insecure skips the certificate check", spec: spec(func(s *sourcev1.OCIRepositorySpec) {
			s.SecretRef = ref("creds")
			s.CertSecretRef = nil
			s.Insecure = true
		})},
		{name: "no credentials", spec: spec(func(*sourcev1.OCIRepositorySpec) {}),
			reason: sourcev1.OCIPullFailedReason, handling: failure.Final, message: "failed to determine artifact digest: "},
		{name: "wrong password", spec: spec(func(s *sourcev1.OCIRepositorySpec) { s.SecretRef = ref("wrong") }),
			reason: sourcev1.OCIPullFailedReason, handling: failure.Final, message: "UNAUTHORIZED: authentication required"},
		{name: "credentials for another registry", spec: spec(func(s *sourcev1.OCIRepositorySpec) { s.SecretRef = ref("other-registry") }),
			reason: sourcev1.OCIPullFailedReason, handling: failure.Final, message: "failed to determine artifact digest"},
		{name: "missing secret", spec: spec(func(s *sourcev1.OCIRepositorySpec) { s.SecretRef = ref("absent") }),
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient, message: "failed to get credential: failed to get secret 'default/absent'"},
		{name: "missing service account", spec: spec(func(s *sourcev1.OCIRepositorySpec) { s.ServiceAccountName = "absent" }),
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient, message: "failed to get service account 'default/absent'"},
		{name: "not a docker config", spec: spec(func(s *sourcev1.OCIRepositorySpec) { s.SecretRef = ref("opaque") }),
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling, message: "must be of type kubernetes.io/dockerconfigjson"},
		{name: "malformed docker config", spec: spec(func(s *sourcev1.OCIRepositorySpec) { s.SecretRef = ref("broken") }),
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling, message: "invalid '.dockerconfigjson'"},
		{name: "untrusted certificate", spec: spec(func(s *sourcev1.OCIRepositorySpec) { s.SecretRef = ref("creds"); s.CertSecretRef = nil }),
			reason: sourcev1.OCIPullFailedReason, handling: failure.Transient, message: "certificate"},
		{name: "cert secret without keys", spec: spec(func(s *sourcev1.OCIRepositorySpec) { s.CertSecretRef = ref("no-ca") }),
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling, message: "failed to generate transport for"},
		{name: "proxy secret missing", spec: spec(func(s *sourcev1.OCIRepositorySpec) { s.ProxySecretRef = ref("absent") }),
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient, message: "failed to get proxy address"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rev, _, got, err := sourcetest.Fetch(t, src, request(tc.spec))
			if tc.reason == "" {
				must(t, err)
				if rev != "v1@"+d.String() || got["a"] != "b" {
					t.Errorf("revision %s, files %v", rev, got)
				}
				return
			}
			sourcetest.CheckFailure(t, err, tc.reason, tc.handling, tc.message)
		})
	}
}

func TestProxy(t *testing.T) {
	reg := registry.New(t, registry.Options{})
	reg.Push(t, "app", "v1", registry.FluxArtifact(t, map[string]string{"a": "b"}, "", ""))
	proxied := 0
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied++
		(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(&url.URL{Scheme: "http", Host: reg.Host}) }}).ServeHTTP(w, r)
	}))
	defer proxy.Close()
	src := &Source{Secrets: kube(t, secret("proxy", map[string][]byte{"address": []byte(proxy.URL)}),
		secret("bad-proxy", map[string][]byte{"address": []byte("ftp://proxy")}))}
	spec := sourcev1.OCIRepositorySpec{URL: reg.URL("app"), Reference: &sourcev1.OCIRepositoryRef{Tag: "v1"},
		ProxySecretRef: &meta.LocalObjectReference{Name: "proxy"}, Insecure: true}
	_, _, got, err := sourcetest.Fetch(t, src, request(spec))
	must(t, err)
	if got["a"] != "b" || proxied == 0 {
		t.Errorf("files %v, %d requests through the proxy", got, proxied)
	}
	spec.ProxySecretRef.Name = "bad-proxy"
	_, _, _, err = sourcetest.Fetch(t, src, request(spec))
	sourcetest.CheckFailure(t, err, sourcev1.AuthenticationFailedReason, failure.Stalling, "proxy URL must use one of the supported schemes")
}

func TestBadInput(t *testing.T) {
	reg := registry.New(t, registry.Options{})
	push := func(repo string, entries ...registry.Entry) {
		reg.Push(t, repo, "v1", registry.Artifact{Layers: []registry.Layer{{Data: registry.TarGz(t, entries...)}}})
	}
	push("dotdot", registry.Entry{Name: "ok", Body: "x"}, registry.Entry{Name: "a/../../evil", Body: "x"})
	push("absolute", registry.Entry{Name: "/etc/evil", Body: "x"})
	push("symlink-out", registry.Entry{Name: "link", Type: tar.TypeSymlink, Linkname: "../../etc/passwd"})
	push("symlink-abs", registry.Entry{Name: "link", Type: tar.TypeSymlink, Linkname: "/etc/passwd"})
	push("hardlink", registry.Entry{Name: "a", Body: "x"}, registry.Entry{Name: "b", Type: tar.TypeLink, Linkname: "a"})
	push("fifo", registry.Entry{Name: "pipe", Type: tar.TypeFifo})
	push("bomb", registry.Entry{Name: "zeros", Size: 8 << 20})
	push("many", registry.Entry{Name: "a", Size: 600 << 10}, registry.Entry{Name: "b", Size: 600 << 10})
	push("clash", registry.Entry{Name: "a", Body: "x"}, registry.Entry{Name: "a/b", Body: "y"})
	// Symbolic links inside the tree are left out, as Flux does.
	push("symlink-in", registry.Entry{Name: "dir/a", Body: "x"}, registry.Entry{Name: "dir/link", Type: tar.TypeSymlink, Linkname: "a"})
	reg.Push(t, "plain-tar", "v1", registry.Artifact{Layers: []registry.Layer{{MediaType: "application/vnd.oci.image.layer.v1.tar", Data: []byte("x")}}})
	reg.Push(t, "not-gzip", "v1", registry.Artifact{Layers: []registry.Layer{{Data: []byte("not gzip at all")}}})
	reg.Push(t, "no-layers", "v1", registry.Artifact{})
	corrupt := registry.TarGz(t, registry.Files(map[string]string{"a": "original"})...)
	reg.Push(t, "corrupt", "v1", registry.Artifact{Layers: []registry.Layer{{Data: corrupt}}})
	// The registry serves other bytes than the manifest's digest names.
	sum := sha256.Sum256(corrupt)
	tampered := registry.TarGz(t, registry.Files(map[string]string{"a": "tampered"})...)
	if len(tampered) != len(corrupt) {
		t.Fatalf("tampered layer is %d bytes, original %d: make them the same length", len(tampered), len(corrupt))
	}
	must(t, os.WriteFile(reg.BlobPath(v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}), tampered, 0o644))
	reg.Push(t, "semver", "1.0.0", registry.FluxArtifact(t, map[string]string{"a": "b"}, "", ""))

	src := &Source{MaxFileSize: 4 << 20, MaxExtractSize: 1 << 20}
	tag := &sourcev1.OCIRepositoryRef{Tag: "v1"}
	cases := []struct {
		name     string
		spec     sourcev1.OCIRepositorySpec
		reason   string
		handling failure.Handling
		message  string
	}{
		{name: "dot dot", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("dotdot"), Reference: tag},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: `tar contained invalid name error "a/../../evil"`},
		{name: "absolute path", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("absolute"), Reference: tag},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: `invalid name error "/etc/evil"`},
		{name: "symlink out", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("symlink-out"), Reference: tag},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: "tar entry 'link' links outside the artifact ('../../etc/passwd')"},
		{name: "absolute symlink", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("symlink-abs"), Reference: tag},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: "links outside the artifact"},
		{name: "hard link", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("hardlink"), Reference: tag},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: "tar file entry b contained unsupported file type 1"},
		{name: "fifo", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("fifo"), Reference: tag},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: "unsupported file type 6"},
		{name: "decompression bomb over the file size", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("bomb"), Reference: tag},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: "file 'zeros' is 8388608 bytes, over the limit of 4194304"},
		{name: "over the total size", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("many"), Reference: tag},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: "layer contents exceed 1048576 bytes"},
		{name: "clashing entries", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("clash"), Reference: tag},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: "mkdirat a: file exists"},
		{name: "media type not tar+gzip", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("plain-tar"), Reference: tag},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: "layer media type 'application/vnd.oci.image.layer.v1.tar' is not a tar+gzip"},
		{name: "not gzip", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("not-gzip"), Reference: tag},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: "requires gzip-compressed body"},
		{name: "no layers", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("no-layers"), Reference: tag},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: "no layers found in artifact"},
		{name: "no layer with the media type", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("dotdot"), Reference: tag,
			LayerSelector: &sourcev1.OCILayerSelector{MediaType: "application/x-other"}},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: "failed to find layer with media type 'application/x-other' in artifact"},
		{name: "blob does not match its digest", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("corrupt"), Reference: tag},
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: "error verifying sha256 checksum"},
		{name: "semver matches nothing", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("semver"), Reference: &sourcev1.OCIRepositoryRef{SemVer: ">=2.0.0"}},
			reason: sourcev1.ReadOperationFailedReason, handling: failure.Final, message: "failed to determine the artifact tag for '" + reg.URL("semver") + "': no match found for semver: >=2.0.0"},
		{name: "invalid semver", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("semver"), Reference: &sourcev1.OCIRepositoryRef{SemVer: "not a range"}},
			reason: sourcev1.ReadOperationFailedReason, handling: failure.Stalling, message: "semver 'not a range' parse error"},
		{name: "invalid semver filter", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("semver"), Reference: &sourcev1.OCIRepositoryRef{SemVer: "*", SemverFilter: "("}},
			reason: sourcev1.ReadOperationFailedReason, handling: failure.Stalling, message: "failed to compile regex pattern '('"},
		{name: "missing tag", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("semver"), Reference: &sourcev1.OCIRepositoryRef{Tag: "absent"}},
			reason: sourcev1.OCIPullFailedReason, handling: failure.Final, message: "failed to determine artifact digest"},
		{name: "invalid digest", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("semver"), Reference: &sourcev1.OCIRepositoryRef{Digest: "sha256:nothex"}},
			reason: sourcev1.OCIPullFailedReason, handling: failure.Stalling, message: "failed to determine artifact digest"},
		{name: "not oci://", spec: sourcev1.OCIRepositorySpec{URL: "https://" + reg.Host + "/app"},
			reason: sourcev1.URLInvalidReason, handling: failure.Stalling, message: "URL must be in format 'oci://<domain>/<org>/<repo>'"},
		{name: "tag in the URL", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("app") + ":v1"},
			reason: sourcev1.URLInvalidReason, handling: failure.Stalling, message: "repository can only contain the characters"},
		{name: "unreachable registry", spec: sourcev1.OCIRepositorySpec{URL: "oci://127.0.0.1:1/app"},
			reason: sourcev1.OCIPullFailedReason, handling: failure.Transient, message: "connection refused"},
		{name: "unknown provider", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("app"), Provider: "oracle"},
			reason: source.UnsupportedProviderReason, handling: failure.Stalling, message: "OCI provider 'oracle' is not supported: use 'generic', 'aws', 'azure' or 'gcp'"},
		{name: "notation without a secret", spec: sourcev1.OCIRepositorySpec{URL: reg.URL("no-layers"), Reference: tag,
			Verify: &sourcev1.OCIRepositoryVerification{Provider: "notation"}},
			reason: sourcev1.VerificationError, handling: failure.Stalling,
			message: "failed to verify the signature using provider 'notation': verification secret cannot be empty: '" + reg.Host + "/no-layers@sha256:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := sourcetest.Fetch(t, src, request(tc.spec))
			sourcetest.CheckFailure(t, err, tc.reason, tc.handling, tc.message)
		})
	}
	t.Run("symlinks inside are left out", func(t *testing.T) {
		_, _, got, err := sourcetest.Fetch(t, src, request(sourcev1.OCIRepositorySpec{URL: reg.URL("symlink-in"), Reference: tag}))
		must(t, err)
		if !maps.Equal(got, map[string]string{"dir/a": "x"}) {
			t.Errorf("files %v", got)
		}
	})
}

// hostile serves the registry's responses but replaces the manifest of
// every tag with body.
func hostile(t *testing.T, reg *registry.Server, body []byte) *httptest.Server {
	sum := sha256.Sum256(body)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(&url.URL{Scheme: "http", Host: reg.Host}) }}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.URL.Path, "/manifests/") {
			proxy.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		w.Header().Set("Docker-Content-Digest", digest)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		if r.Method == http.MethodGet {
			_, _ = w.Write(body)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestHostileManifests(t *testing.T) {
	reg := registry.New(t, registry.Options{})
	cases := []struct {
		name     string
		body     []byte
		reason   string
		handling failure.Handling
		message  string
	}{
		{name: "not json", body: []byte("this is not a manifest"),
			reason: sourcev1.OCILayerOperationFailedReason, handling: failure.Final, message: "failed to parse artifact manifest"},
		{name: "huge", body: []byte(`{"schemaVersion":2,"annotations":{"x":"` + strings.Repeat("a", maxManifestSize) + `"}}`),
			reason: sourcev1.OCIPullFailedReason, handling: failure.Final, message: "manifest is larger than 4194304 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := hostile(t, reg, tc.body)
			host := strings.TrimPrefix(srv.URL, "http://")
			_, _, _, err := sourcetest.Fetch(t, &Source{}, request(sourcev1.OCIRepositorySpec{URL: "oci://" + host + "/app", Reference: &sourcev1.OCIRepositoryRef{Tag: "v1"}}))
			sourcetest.CheckFailure(t, err, tc.reason, tc.handling, tc.message)
		})
	}
}

func TestContentIdentity(t *testing.T) {
	reg := registry.New(t, registry.Options{})
	reg.Push(t, "app", "v1", registry.FluxArtifact(t, map[string]string{"a": "b"}, "", ""))
	identity := func(spec sourcev1.OCIRepositorySpec) []string {
		res, err := (&Source{}).Resolve(context.Background(), request(spec))
		must(t, err)
		parts, ok := res.(source.Shareable).ContentIdentity()
		if !ok {
			t.Fatal("not shareable")
		}
		return parts
	}
	base := sourcev1.OCIRepositorySpec{URL: reg.URL("app"), Reference: &sourcev1.OCIRepositoryRef{Tag: "v1"}}
	ign := "*.md"
	withIgnore, withSelector := base, base
	withIgnore.Ignore = &ign
	withSelector.LayerSelector = &sourcev1.OCILayerSelector{MediaType: "x"}
	a, b, c := identity(base), identity(withIgnore), identity(withSelector)
	if strings.Join(a, "\x00") == strings.Join(b, "\x00") || strings.Join(a, "\x00") == strings.Join(c, "\x00") {
		t.Errorf("identities do not tell ignore rules or layer selectors apart: %q %q %q", a, b, c)
	}
	if strings.Contains(strings.Join(a, " "), "@") {
		t.Errorf("identity %q holds credentials", a)
	}
}

// Layer operation copy writes the blob as it is, checked against its
// digest, for the packager to store unchanged.
func TestCopy(t *testing.T) {
	reg := registry.New(t, registry.Options{})
	layer := registry.TarGz(t, registry.Files(map[string]string{"chart/Chart.yaml": "name: app\n"})...)
	a := registry.FluxArtifact(t, nil, "https://github.com/x/app", "v1@sha1:1234")
	a.Layers = []registry.Layer{{MediaType: "application/vnd.cncf.helm.chart.content.v1.tar+gzip", Data: layer}}
	d := reg.Push(t, "chart", "v1", a)
	reg.Push(t, "big", "v1", registry.Artifact{Layers: []registry.Layer{{Data: registry.TarGz(t, registry.Entry{Name: "noise", Body: strings.Repeat("x", 1<<10) + randomText(t, 4<<10)})}}})

	copySpec := func(repo string) sourcev1.OCIRepositorySpec {
		return sourcev1.OCIRepositorySpec{URL: reg.URL(repo), Reference: &sourcev1.OCIRepositoryRef{Tag: "v1"},
			LayerSelector: &sourcev1.OCILayerSelector{Operation: sourcev1.OCILayerCopy}}
	}
	ctx := context.Background()
	res, err := (&Source{}).Resolve(ctx, request(copySpec("chart")))
	must(t, err)
	dir := t.TempDir()
	content, err := res.Download(ctx, dir)
	must(t, err)
	got, err := os.ReadFile(content.File)
	must(t, err)
	if string(got) != string(layer) || filepath.Dir(content.File) != dir {
		t.Errorf("blob %s holds %d bytes, want the layer's %d under %s", content.File, len(got), len(layer), dir)
	}
	if content.ArtifactName != d.String()+".tar.gz" || content.Metadata[registry.RevisionAnnotation] != "v1@sha1:1234" {
		t.Errorf("artifact name %s, metadata %v", content.ArtifactName, content.Metadata)
	}

	_, _, _, err = sourcetest.Fetch(t, &Source{MaxFileSize: 2 << 10}, request(copySpec("big")))
	sourcetest.CheckFailure(t, err, sourcev1.OCILayerOperationFailedReason, failure.Final, "failed to copy layer from artifact: file too large")
}

// randomText is n bytes that do not compress.
func randomText(t *testing.T, n int) string {
	b := make([]byte, n/2)
	_, err := rand.Read(b)
	must(t, err)
	return hex.EncodeToString(b)
}

func TestVerify(t *testing.T) {
	reg := registry.New(t, registry.Options{})
	signed := reg.Push(t, "app", "signed", registry.FluxArtifact(t, map[string]string{"a": "signed"}, "", ""))
	reg.Push(t, "app", "unsigned", registry.FluxArtifact(t, map[string]string{"a": "unsigned"}, "", ""))
	other := reg.Push(t, "app", "other-key", registry.FluxArtifact(t, map[string]string{"a": "other"}, "", ""))
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	reg.Sign(t, "app", signed, key)
	reg.Sign(t, "app", other, otherKey)
	src := &Source{Secrets: kube(t,
		secret("cosign", map[string][]byte{"cosign.pub": registry.PublicKeyPEM(t, key), "README": []byte("not a key")}),
		secret("no-keys", map[string][]byte{"README": []byte("x")}),
		secret("bad-key", map[string][]byte{"cosign.pub": []byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")}),
	)}
	spec := func(tag, secretName string) sourcev1.OCIRepositorySpec {
		return sourcev1.OCIRepositorySpec{URL: reg.URL("app"), Reference: &sourcev1.OCIRepositoryRef{Tag: tag},
			Verify: &sourcev1.OCIRepositoryVerification{Provider: "cosign", SecretRef: &meta.LocalObjectReference{Name: secretName}}}
	}
	rev, content, got, err := sourcetest.Fetch(t, src, request(spec("signed", "cosign")))
	must(t, err)
	v := content.Verification
	if v == nil || !v.Verified || v.Reason != meta.SucceededReason || v.Message != "verified signature of revision "+rev || got["a"] != "signed" {
		t.Errorf("verification %+v, files %v", v, got)
	}
	res, err := src.Resolve(context.Background(), request(spec("signed", "cosign")))
	must(t, err)
	if _, ok := res.(source.Shareable).ContentIdentity(); ok {
		t.Error("a verified source shares content")
	}

	cases := []struct {
		name, tag, secret string
		handling          failure.Handling
		message           string
	}{
		{name: "unsigned", tag: "unsigned", secret: "cosign", handling: failure.Final,
			message: "failed to verify the signature using provider 'cosign': no matching signatures were found for '" + reg.Host + "/app:unsigned'"},
		{name: "signed with another key", tag: "other-key", secret: "cosign", handling: failure.Final, message: "no matching signatures were found"},
		{name: "no keys", tag: "signed", secret: "no-keys", handling: failure.Stalling, message: "no public keys ('*.pub') found in secret 'default/no-keys'"},
		{name: "bad key", tag: "signed", secret: "bad-key", handling: failure.Stalling, message: "key 'cosign.pub'"},
		{name: "missing secret", tag: "signed", secret: "absent", handling: failure.Transient, message: "failed to get secret 'default/absent'"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := sourcetest.Fetch(t, src, request(spec(tc.tag, tc.secret)))
			sourcetest.CheckFailure(t, err, sourcev1.VerificationError, tc.handling, tc.message)
			var unverified *source.Unverified
			if !errors.As(err, &unverified) || unverified.Verification.Verified || unverified.Verification.Reason != sourcev1.VerificationError {
				t.Errorf("failure %v carries no failed verification", err)
			}
			if f := failure.As(err); f.Condition != "" {
				t.Errorf("failure sets condition %s, want only SourceVerified=False", f.Condition)
			}
		})
	}
}
