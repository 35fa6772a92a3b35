package ociimage

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// ContainerdImageName is the annotation containerd's importer names an
// image by; org.opencontainers.image.ref.name holds the same full reference.
const ContainerdImageName = "io.containerd.image.name"

// RefName is the OCI annotation naming an index.json entry.
const RefName = "org.opencontainers.image.ref.name"

// WriteLayout writes images as an OCI image layout at dir, replacing what
// was there: one index.json entry per image, an image index each, named by
// both annotations, in reference order.
func WriteLayout(dir string, images []*Built) error {
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("clear %s: %w", tmp, err)
	}
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return fmt.Errorf("create layout %s: %w", tmp, err)
	}
	sorted := append([]*Built(nil), images...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Spec.Ref < sorted[j].Spec.Ref })
	for _, b := range sorted {
		anns := map[string]string{RefName: b.Spec.Ref, ContainerdImageName: b.Spec.Ref}
		if err := p.AppendIndex(b.Index, layout.WithAnnotations(anns)); err != nil {
			return fmt.Errorf("write %s into the layout: %w", b.Spec.Ref, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("clear %s: %w", dir, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("move layout into place: %w", err)
	}
	return nil
}

// WriteArchive writes images as one tar of an OCI image layout, which
// `ctr -n k8s.io images import` reads, naming each image by its full
// reference. Entries are sorted and stamped with mtime, so the same images
// give the same archive.
func WriteArchive(file string, images []*Built, mtime time.Time) error {
	dir, err := os.MkdirTemp(filepath.Dir(file), ".archive-")
	if err != nil {
		return fmt.Errorf("archive scratch directory: %w", err)
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, "oci")
	if err := WriteLayout(root, images); err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := tarDir(tmp, root, mtime); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, file); err != nil {
		return fmt.Errorf("move archive into place: %w", err)
	}
	return nil
}

// tarDir writes the files under root into a tar at file, sorted, with
// directories, 0644/0755 modes, root ownership and mtime.
func tarDir(file, root string, mtime time.Time) error {
	var names []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			rel += "/"
		}
		names = append(names, rel)
		return nil
	})
	if err != nil {
		return fmt.Errorf("list %s: %w", root, err)
	}
	sort.Strings(names)
	out, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("create archive: %w", err)
	}
	tw := tar.NewWriter(out)
	for _, n := range names {
		if err := addToTar(tw, root, n, mtime); err != nil {
			out.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		out.Close()
		return fmt.Errorf("finish archive: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("finish archive: %w", err)
	}
	return nil
}

func addToTar(tw *tar.Writer, root, n string, mtime time.Time) error {
	hdr := &tar.Header{Name: n, ModTime: mtime.UTC().Truncate(time.Second)}
	if strings.HasSuffix(n, "/") {
		hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("archive %s: %w", n, err)
		}
		return nil
	}
	f, err := os.Open(filepath.Join(root, filepath.FromSlash(n)))
	if err != nil {
		return fmt.Errorf("archive %s: %w", n, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("archive %s: %w", n, err)
	}
	hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, 0o644, st.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("archive %s: %w", n, err)
	}
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("archive %s: %w", n, err)
	}
	return nil
}

// PushRef is where Push puts an image under prefix (host[:port][/path]):
// the last element of its repository and its tag, so
// ghcr.io/headwater-gitops/fetcher:v0.1.0 goes to <prefix>/fetcher:v0.1.0.
func PushRef(prefix, ref string) (string, error) {
	r, err := name.NewTag(ref)
	if err != nil {
		return "", fmt.Errorf("parse %s: %w", ref, err)
	}
	return strings.TrimSuffix(prefix, "/") + "/" + path.Base(r.RepositoryStr()) + ":" + r.TagStr(), nil
}

// Push writes every image's index to prefix (see PushRef), with the
// credentials of the Docker config (docker login). insecure allows plain
// HTTP, for a local registry.
func Push(ctx context.Context, prefix string, images []*Built, insecure bool, log io.Writer) error {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	for _, b := range images {
		to, err := PushRef(prefix, b.Spec.Ref)
		if err != nil {
			return err
		}
		ref, err := name.NewTag(to, opts...)
		if err != nil {
			return fmt.Errorf("parse %s: %w", to, err)
		}
		if err := remote.WriteIndex(ref, b.Index, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("push %s: %w", to, err)
		}
		d, err := b.Index.Digest()
		if err != nil {
			return fmt.Errorf("digest of %s: %w", to, err)
		}
		fmt.Fprintf(log, "pushed %s@%s\n", to, d)
	}
	return nil
}

// SizeTable writes a Markdown table of every image's platforms: the
// compressed size (the manifest's layers) and the unpacked size (the
// uncompressed layer tars), in MiB.
func SizeTable(w io.Writer, images []*Built) {
	fmt.Fprintln(w, "| Image | Platform | Compressed | Unpacked |")
	fmt.Fprintln(w, "|---|---|---:|---:|")
	for _, b := range images {
		for _, i := range b.Images {
			fmt.Fprintf(w, "| `%s` | %s | %.1f MiB | %.1f MiB |\n", b.Spec.Ref, i.Platform,
				float64(i.Compressed)/(1<<20), float64(i.Unpacked)/(1<<20))
		}
	}
}
