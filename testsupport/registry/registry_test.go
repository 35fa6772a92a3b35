package registry

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

func TestPushAndPull(t *testing.T) {
	cases := []struct {
		name string
		opts Options
	}{
		{name: "plain http", opts: Options{}},
		{name: "htpasswd over tls", opts: Options{Username: "flux", Password: "s3cret", TLS: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := New(t, tc.opts)
			a := FluxArtifact(t, map[string]string{"deploy/app.yaml": "kind: ConfigMap\n"}, "https://github.com/x/y", "main@sha1:abc")
			digest := s.Push(t, "app", "v1", a)

			ref, err := name.ParseReference(s.Ref("app", "v1"), nameOpts(s)...)
			if err != nil {
				t.Fatal(err)
			}
			desc, err := remote.Head(ref, s.RemoteOptions()...)
			if err != nil {
				t.Fatal(err)
			}
			if desc.Digest != digest {
				t.Fatalf("HEAD digest %s, pushed %s", desc.Digest, digest)
			}
			img, err := remote.Image(ref, s.RemoteOptions()...)
			if err != nil {
				t.Fatal(err)
			}
			m, err := img.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			if m.Config.MediaType != FluxConfigMediaType || len(m.Layers) != 1 || m.Layers[0].MediaType != FluxContentMediaType {
				t.Fatalf("manifest config %s, layers %+v: want Flux's media types", m.Config.MediaType, m.Layers)
			}
			if m.Annotations[RevisionAnnotation] != "main@sha1:abc" {
				t.Fatalf("annotations %v", m.Annotations)
			}
			layers, _ := img.Layers()
			rc, err := layers[0].Compressed()
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			gz, err := gzip.NewReader(rc)
			if err != nil {
				t.Fatal(err)
			}
			tr := tar.NewReader(gz)
			h, err := tr.Next()
			if err != nil || h.Name != "deploy/app.yaml" {
				t.Fatalf("first entry %v, %v", h, err)
			}
			body, _ := io.ReadAll(tr)
			if string(body) != "kind: ConfigMap\n" {
				t.Fatalf("body %q", body)
			}
			if n := s.WaitRequests("GET", "/blobs/"+m.Layers[0].Digest.String(), 1, 5*time.Second); n != 1 {
				t.Fatalf("layer downloads recorded: %d, want 1; requests %v", n, s.Requests())
			}
			if _, err := os.Stat(s.BlobPath(m.Layers[0].Digest)); err != nil {
				t.Fatalf("blob path: %v", err)
			}
		})
	}
}

func TestAuthRequired(t *testing.T) {
	s := New(t, Options{Username: "flux", Password: "s3cret"})
	s.Push(t, "app", "v1", FluxArtifact(t, map[string]string{"a": "b"}, "", ""))
	ref, _ := name.ParseReference(s.Ref("app", "v1"), name.Insecure)
	for _, auth := range []authn.Authenticator{authn.Anonymous, &authn.Basic{Username: "flux", Password: "wrong"}} {
		_, err := remote.Head(ref, remote.WithAuth(auth))
		var terr *transport.Error
		if !errors.As(err, &terr) || terr.StatusCode != http.StatusUnauthorized {
			t.Fatalf("HEAD with %T: %v, want 401", auth, err)
		}
	}
	if !strings.Contains(string(s.DockerConfigJSON("flux", "s3cret")), s.Host) {
		t.Fatal("docker config does not name the host")
	}
}

func TestTLSNeedsTheCA(t *testing.T) {
	s := New(t, Options{TLS: true})
	ref, _ := name.ParseReference(s.Ref("app", "v1"))
	if _, err := remote.Head(ref); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("HEAD without the CA: %v, want a certificate error", err)
	}
	if !bytes.Contains(s.CACert(), []byte("BEGIN CERTIFICATE")) {
		t.Fatal("no CA certificate")
	}
}

func TestIndex(t *testing.T) {
	s := New(t, Options{})
	amd := FluxArtifact(t, map[string]string{"arch": "amd64"}, "", "")
	amd.Platform = &v1.Platform{OS: "linux", Architecture: "amd64"}
	arm := FluxArtifact(t, map[string]string{"arch": "arm64"}, "", "")
	arm.Platform = &v1.Platform{OS: "linux", Architecture: "arm64"}
	digest := s.PushIndex(t, "multi", "v1", amd, arm)
	ref, _ := name.ParseReference(s.Ref("multi", "v1"), name.Insecure)
	idx, err := remote.Index(ref)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := idx.Digest(); d != digest || len(m.Manifests) != 2 || m.Manifests[1].Platform.Architecture != "arm64" {
		t.Fatalf("index %s %+v", d, m.Manifests)
	}
}

func TestBomb(t *testing.T) {
	data := TarGz(t, Entry{Name: "zeros", Size: 64 << 20})
	if len(data) > 1<<20 {
		t.Fatalf("a 64 MiB file of zeros compressed to %d bytes", len(data))
	}
}

func nameOpts(s *Server) []name.Option {
	if s.Options.TLS {
		return nil
	}
	return []name.Option{name.Insecure}
}
