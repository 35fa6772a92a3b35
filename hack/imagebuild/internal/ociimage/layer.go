package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one entry of a layer: a regular file when Dir is false, else a
// directory. Every entry gets the same modification time (the layer's), so
// what the layer holds decides its digest, never when or where it was built.
type File struct {
	// Path is relative to the root, without a leading or trailing slash.
	Path string
	// Mode holds the permission bits (and sticky bit) only.
	Mode int64
	// UID and GID own the entry.
	UID, GID int
	// Dir makes the entry a directory; Data is then ignored.
	Dir bool
	// Data is a regular file's content.
	Data []byte
}

// Layer is a gzip-compressed OCI layer with its uncompressed size, which a
// v1.Layer does not report.
type Layer struct {
	v1.Layer
	// Unpacked is the size of the uncompressed tar in bytes.
	Unpacked int64
}

// NewLayer writes files into a reproducible layer: entries sorted by path,
// the parent directories a path needs added (root-owned, 0755) unless files
// name them, fixed ownership and modes, every mtime set to mtime, and no
// user or group names. The same files and mtime always give the same digest
// (with the same Go release's gzip).
func NewLayer(files []File, mtime time.Time) (*Layer, error) {
	entries := map[string]File{}
	for _, f := range files {
		p := strings.Trim(path.Clean("/"+f.Path), "/")
		if p == "" {
			return nil, fmt.Errorf("layer entry %q: not below the root", f.Path)
		}
		if _, dup := entries[p]; dup {
			return nil, fmt.Errorf("layer entry %q: named twice", p)
		}
		f.Path = p
		entries[p] = f
	}
	for p := range entries {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = File{Path: d, Mode: 0o755, Dir: true}
			}
		}
	}
	names := make([]string, 0, len(entries))
	for p := range entries {
		names = append(names, p)
	}
	sort.Strings(names)

	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	mtime = mtime.UTC().Truncate(time.Second)
	for _, p := range names {
		f := entries[p]
		hdr := &tar.Header{
			Name:    p,
			Mode:    f.Mode,
			Uid:     f.UID,
			Gid:     f.GID,
			ModTime: mtime,
		}
		if f.Dir {
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		} else {
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(f.Data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("write tar header of %s: %w", p, err)
		}
		if !f.Dir {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, fmt.Errorf("write %s into the layer: %w", p, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close layer tar: %w", err)
	}
	unpacked := int64(raw.Len())

	// Compressed once, here, with a header that names no file and no time.
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.DefaultCompression)
	if err != nil {
		return nil, fmt.Errorf("gzip layer: %w", err)
	}
	if _, err := io.Copy(zw, &raw); err != nil {
		return nil, fmt.Errorf("gzip layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("gzip layer: %w", err)
	}
	compressed := gz.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(compressed)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer from tar: %w", err)
	}
	return &Layer{Layer: l, Unpacked: unpacked}, nil
}
