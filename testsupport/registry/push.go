package registry

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Media types and annotations of artifacts made by `flux push artifact`.
const (
	// FluxContentMediaType is the media type of a Flux artifact's layer.
	FluxContentMediaType types.MediaType = "application/vnd.cncf.flux.content.v1.tar+gzip"
	// FluxConfigMediaType is the media type of a Flux artifact's config.
	FluxConfigMediaType types.MediaType = "application/vnd.cncf.flux.config.v1+json"
	// SourceAnnotation and RevisionAnnotation say where an artifact was
	// built from (flux push artifact --source --revision).
	SourceAnnotation   = "org.opencontainers.image.source"
	RevisionAnnotation = "org.opencontainers.image.revision"
	// CreatedAnnotation is when the artifact was built.
	CreatedAnnotation = "org.opencontainers.image.created"
)

// Entry is one entry of a layer's tar.
type Entry struct {
	// Name is the path in the archive, as is (it may be hostile).
	Name string
	// Body is a regular file's content.
	Body string
	// Type is the tar type flag; tar.TypeReg when zero.
	Type byte
	// Linkname is a link's target.
	Linkname string
	// Size, when positive, overrides the size of a regular file whose
	// Body is empty: the body is that many zero bytes (a decompression
	// bomb compresses to almost nothing).
	Size int64
}

// Files returns regular-file entries for files (path -> content), in path
// order.
func Files(files map[string]string) []Entry {
	var out []Entry
	for _, p := range slices.Sorted(maps.Keys(files)) {
		out = append(out, Entry{Name: p, Body: files[p]})
	}
	return out
}

// TarGz returns the gzip-compressed tar of entries, in order.
func TarGz(tb testing.TB, entries ...Entry) []byte {
	tb.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Linkname: e.Linkname, Mode: 0o644, ModTime: time.Unix(0, 0)}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag == tar.TypeDir {
			h.Mode = 0o755
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Body))
			if e.Body == "" && e.Size > 0 {
				h.Size = e.Size
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			tb.Fatalf("registry: tar header %q: %v", e.Name, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if e.Body != "" {
			if _, err := tw.Write([]byte(e.Body)); err != nil {
				tb.Fatal(err)
			}
			continue
		}
		zeros := make([]byte, 64<<10)
		for left := h.Size; left > 0; left -= int64(len(zeros)) {
			if _, err := tw.Write(zeros[:min(left, int64(len(zeros)))]); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// Layer is one layer of an artifact.
type Layer struct {
	// MediaType of the layer; FluxContentMediaType when empty.
	MediaType types.MediaType
	// Data is the layer's blob, as stored.
	Data []byte
}

// Artifact is an OCI artifact or image to push.
type Artifact struct {
	// Layers in order.
	Layers []Layer
	// ConfigMediaType is the config's media type; FluxConfigMediaType
	// when empty.
	ConfigMediaType types.MediaType
	// Annotations of the manifest.
	Annotations map[string]string
	// Platform, when set, is written into the config (an image of a
	// multi-platform index).
	Platform *v1.Platform
}

// FluxArtifact is what `flux push artifact --source source --revision
// revision` pushes for a directory holding files: one tar+gzip layer of
// the Flux content media type, the Flux config media type, and the
// source, revision and created annotations.
func FluxArtifact(tb testing.TB, files map[string]string, source, revision string) Artifact {
	tb.Helper()
	return Artifact{
		Layers: []Layer{{Data: TarGz(tb, Files(files)...)}},
		Annotations: map[string]string{
			SourceAnnotation:   source,
			RevisionAnnotation: revision,
			CreatedAnnotation:  "2026-11-24T00:00:00Z",
		},
	}
}

// Image builds the artifact as a go-containerregistry image with an OCI
// manifest.
func (a Artifact) Image(tb testing.TB) v1.Image {
	tb.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	if a.Platform != nil {
		cf, err := img.ConfigFile()
		if err != nil {
			tb.Fatal(err)
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, cf.Variant = a.Platform.OS, a.Platform.Architecture, a.Platform.Variant
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			tb.Fatal(err)
		}
	}
	mt := a.ConfigMediaType
	if mt == "" {
		mt = FluxConfigMediaType
	}
	img = mutate.ConfigMediaType(img, mt)
	for _, l := range a.Layers {
		lmt := l.MediaType
		if lmt == "" {
			lmt = FluxContentMediaType
		}
		var err error
		if img, err = mutate.Append(img, mutate.Addendum{Layer: static.NewLayer(l.Data, lmt), MediaType: lmt}); err != nil {
			tb.Fatal(err)
		}
	}
	if len(a.Annotations) > 0 {
		img = mutate.Annotations(img, a.Annotations).(v1.Image)
	}
	return img
}

// Push pushes the artifact to repo:tag and returns its manifest digest.
func (s *Server) Push(tb testing.TB, repo, tag string, a Artifact) v1.Hash {
	tb.Helper()
	return s.PushImage(tb, repo, tag, a.Image(tb))
}

// PushImage pushes img to repo:tag and returns its manifest digest.
func (s *Server) PushImage(tb testing.TB, repo, tag string, img v1.Image) v1.Hash {
	tb.Helper()
	ref := s.tag(tb, repo, tag)
	if err := remote.Write(ref, img, s.RemoteOptions()...); err != nil {
		tb.Fatalf("registry: push %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

// PushIndex pushes a multi-platform image index of the artifacts, each
// with its Platform set, to repo:tag and returns the index's digest.
func (s *Server) PushIndex(tb testing.TB, repo, tag string, artifacts ...Artifact) v1.Hash {
	tb.Helper()
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, a := range artifacts {
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        a.Image(tb),
			Descriptor: v1.Descriptor{Platform: a.Platform},
		})
	}
	ref := s.tag(tb, repo, tag)
	if err := remote.WriteIndex(ref, idx, s.RemoteOptions()...); err != nil {
		tb.Fatalf("registry: push index %s: %v", ref, err)
	}
	d, err := idx.Digest()
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

func (s *Server) tag(tb testing.TB, repo, tag string) name.Tag {
	tb.Helper()
	var opts []name.Option
	if !s.Options.TLS {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.NewTag(s.Ref(repo, tag), opts...)
	if err != nil {
		tb.Fatalf("registry: reference: %v", err)
	}
	return ref
}

// BlobPath is the file in the registry's storage holding a blob's content,
// for tests that corrupt what the registry serves.
func (s *Server) BlobPath(d v1.Hash) string {
	return filepath.Join(s.Dir, "docker", "registry", "v2", "blobs", d.Algorithm, d.Hex[:2], d.Hex, "data")
}
