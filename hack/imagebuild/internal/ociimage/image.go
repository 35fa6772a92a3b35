package ociimage

import (
	"debug/elf"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Source is the repository the Headwater images name in their source label.
const Source = "https://github.com/headwater-gitops/headwater"

// Platform is an os/arch pair the images are built for. Variant is set for
// arm64 ("v8"), as registries and containerd expect.
type Platform struct {
	OS, Arch, Variant string
}

// ParsePlatform reads "os/arch" or "os/arch/variant".
func ParsePlatform(s string) (Platform, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return Platform{}, fmt.Errorf("platform %q: want os/arch[/variant]", s)
	}
	p := Platform{OS: parts[0], Arch: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	} else if p.Arch == "arm64" {
		p.Variant = "v8"
	}
	return p, nil
}

// String is the os/arch[/variant] form.
func (p Platform) String() string {
	if p.Variant != "" {
		return p.OS + "/" + p.Arch + "/" + p.Variant
	}
	return p.OS + "/" + p.Arch
}

// Spec says what one image is: its name, the static binary it wraps and how
// that binary runs.
type Spec struct {
	// Ref is the full reference, registry/repository:tag.
	Ref string
	// Binary is the host path of the static binary; "{os}" and "{arch}"
	// stand for the platform being built.
	Binary string
	// Path is where the binary lands in the image, absolute.
	Path string
	// Entrypoint runs the binary; Path alone when empty.
	Entrypoint []string
	// User is "uid:gid"; empty runs as root, as some upstream images do.
	User string
	// Env is added to PATH and SSL_CERT_FILE, which every image sets.
	Env []string
	// Labels are the OCI annotations of the config (org.opencontainers.image.*).
	Labels map[string]string
}

// BinaryFor returns the host path of the binary for p.
func (s Spec) BinaryFor(p Platform) string {
	return strings.NewReplacer("{os}", p.OS, "{arch}", p.Arch).Replace(s.Binary)
}

// Built is an image index and what it is made of, per platform.
type Built struct {
	// Spec is what was built.
	Spec Spec
	// Index holds one image per platform.
	Index v1.ImageIndex
	// Images are the index's images, in platform order.
	Images []PlatformImage
}

// PlatformImage is one platform's image of a Built index, with its sizes.
type PlatformImage struct {
	// Platform is what the image runs on.
	Platform Platform
	// Image is the image itself.
	Image v1.Image
	// Compressed is the sum of the manifest's layer sizes.
	Compressed int64
	// Unpacked is the sum of the layers' uncompressed tar sizes.
	Unpacked int64
}

// Builder assembles images that share one base layer per run.
type Builder struct {
	// Created is the time of every file, the config's created time and
	// the created label: SOURCE_DATE_EPOCH.
	Created time.Time
	base    *Layer
}

// NewBuilder prepares the base layer for images created at created.
func NewBuilder(created time.Time) (*Builder, error) {
	files, err := BaseFiles()
	if err != nil {
		return nil, err
	}
	base, err := NewLayer(files, created)
	if err != nil {
		return nil, fmt.Errorf("base layer: %w", err)
	}
	return &Builder{Created: created.UTC().Truncate(time.Second), base: base}, nil
}

// Build assembles s for every platform into one OCI image index.
func (b *Builder) Build(s Spec, platforms []Platform) (*Built, error) {
	if !path.IsAbs(s.Path) {
		return nil, fmt.Errorf("image %s: binary path %q in the image is not absolute", s.Ref, s.Path)
	}
	built := &Built{Spec: s}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		img, err := b.image(s, p)
		if err != nil {
			return nil, fmt.Errorf("image %s for %s: %w", s.Ref, p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add: img.Image,
			Descriptor: v1.Descriptor{
				MediaType: types.OCIManifestSchema1,
				Platform:  &v1.Platform{OS: p.OS, Architecture: p.Arch, Variant: p.Variant},
			},
		})
		built.Images = append(built.Images, *img)
	}
	built.Index = idx
	return built, nil
}

func (b *Builder) image(s Spec, p Platform) (*PlatformImage, error) {
	bin := s.BinaryFor(p)
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("read binary: %w", err)
	}
	if err := CheckStatic(bin, p); err != nil {
		return nil, err
	}
	app, err := NewLayer([]File{{Path: s.Path, Mode: 0o755, Data: data}}, b.Created)
	if err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}

	created := v1.Time{Time: b.Created}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: b.base, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "imagebuild: base (CA roots, passwd, group, /data, /tmp)",
		}},
		mutate.Addendum{Layer: app, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "imagebuild: " + s.Path,
		}},
	)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Variant = p.OS, p.Arch, p.Variant
	cfg.Created = created
	entrypoint := s.Entrypoint
	if len(entrypoint) == 0 {
		entrypoint = []string{s.Path}
	}
	cfg.Config = v1.Config{
		User:       s.User,
		Entrypoint: entrypoint,
		Env: append([]string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"SSL_CERT_FILE=/" + CertFile,
		}, s.Env...),
		WorkingDir: "/",
		Labels:     s.Labels,
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	out := &PlatformImage{Platform: p, Image: img, Unpacked: b.base.Unpacked + app.Unpacked}
	for _, l := range m.Layers {
		out.Compressed += l.Size
	}
	return out, nil
}

// CheckStatic refuses a binary that is not a static ELF executable for p:
// a dynamically linked one would not start on an image without libc, and
// one for another architecture would not start at all.
func CheckStatic(bin string, p Platform) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("binary %s: %w", bin, err)
	}
	defer f.Close()
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "arm": elf.EM_ARM,
		"386": elf.EM_386, "ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390, "riscv64": elf.EM_RISCV}[p.Arch]
	if p.OS != "linux" || want == elf.EM_NONE {
		return fmt.Errorf("binary %s: platform %s is not one imagebuild knows", bin, p)
	}
	if f.Machine != want {
		return fmt.Errorf("binary %s is for %s, not %s", bin, f.Machine, p)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("binary %s is dynamically linked (build it with CGO_ENABLED=0)", bin)
		}
	}
	return nil
}

// HeadwaterSpec is a Headwater image: the binary at /headwater, run as
// nonroot, labelled with the version and revision stamped into it. The
// image "headwater" holds every service (its -target picks one); any other
// name is an image of that service alone.
func HeadwaterSpec(ref, service, binary, version, revision string, created time.Time) Spec {
	title, description := "headwater-"+service, "Headwater "+service+": a horizontally scalable Flux source-controller"
	if service == "headwater" {
		title, description = "headwater", "Headwater, every service in one image (-target picks one): a horizontally scalable Flux source-controller"
	}
	return Spec{
		Ref:    ref,
		Binary: binary,
		Path:   "/headwater",
		User:   strconv.Itoa(NonRoot) + ":" + strconv.Itoa(NonRoot),
		Labels: map[string]string{
			"org.opencontainers.image.title":       title,
			"org.opencontainers.image.description": description,
			"org.opencontainers.image.source":      Source,
			"org.opencontainers.image.url":         Source,
			"org.opencontainers.image.version":     version,
			"org.opencontainers.image.revision":    revision,
			"org.opencontainers.image.created":     created.UTC().Format(time.RFC3339),
		},
	}
}
