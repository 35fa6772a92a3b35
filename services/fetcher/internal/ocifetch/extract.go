package ocifetch

import (
	"archive/tar"
	"cmp"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// errUnsafe marks a tar entry that would be written outside the download
// directory, or that is not a file or a directory Headwater extracts.
var errUnsafe = errors.New("unsafe tar entry")

// extract downloads layer and extracts it into dir with Flux's rules
// (regular files and directories; symbolic links are left out), refusing
// entries that climb out of dir, links that point out of it, files over
// the fetcher's size limit and content over the extraction bound. The
// whole blob is read, so that content that does not match its digest
// fails the download.
func (r *resolved) extract(ctx context.Context, layer v1.Layer, dir string) error {
	layerError := func(h failure.Handling, err error) error {
		return source.FailedWith(h, sourcev1.OCILayerOperationFailedReason, "failed to extract layer contents from artifact: %w", err)
	}
	mt, err := layer.MediaType()
	if err != nil {
		return layerError(failure.Final, err)
	}
	if !tarGzip(string(mt)) {
		return layerError(failure.Final, fmt.Errorf("layer media type '%s' is not a tar+gzip: select one with spec.layerSelector.mediaType", mt))
	}
	limit := r.src.maxExtractSize()
	if size, err := layer.Size(); err == nil && size > limit {
		return layerError(failure.Final, fmt.Errorf("%w: layer is %d bytes, over the limit of %d", archive.ErrTooLarge, size, limit))
	}
	blob, err := layer.Compressed()
	if err != nil {
		e := pullError(err, "failed to extract the first layer from artifact: %w", err)
		e.Reason = sourcev1.OCILayerOperationFailedReason
		return e
	}
	defer blob.Close()
	var readErr error
	src := archive.OnReadError(blob, func(err error) { readErr = cmp.Or(readErr, err) })
	err = untar(ctx, src, dir, r.src.MaxFileSize, limit)
	if err == nil {
		// Read to the end: the digest is checked there.
		_, err = io.Copy(io.Discard, src)
	}
	switch {
	case err == nil:
		return nil
	case readErr != nil:
		// The registry failed, or served other bytes than the digest.
		e := pullError(readErr, "failed to extract layer contents from artifact: %w", readErr)
		e.Reason = sourcev1.OCILayerOperationFailedReason
		return e
	case ctx.Err() != nil:
		return layerError(failure.Transient, ctx.Err())
	case localFailure(err):
		return layerError(failure.Transient, err)
	default:
		// The content itself is unusable: it fails again until it changes.
		return layerError(failure.Final, err)
	}
}

// blobName is the file a copied layer is written to in the download
// directory.
const blobName = "layer.blob"

// copyLayer writes layer's blob as it is into dir and returns its path:
// Flux's layer operation copy. The blob is bounded by the fetcher's file
// size limit and checked against its digest.
func (r *resolved) copyLayer(layer v1.Layer, dir string) (string, error) {
	layerError := func(h failure.Handling, format string, args ...any) error {
		return source.FailedWith(h, sourcev1.OCILayerOperationFailedReason, format, args...)
	}
	size, err := layer.Size()
	if err != nil {
		return "", layerError(failure.Final, "failed to copy layer from artifact: %w", err)
	}
	if limit := r.src.MaxFileSize; limit > 0 && size > limit {
		return "", layerError(failure.Final, "failed to copy layer from artifact: %w: layer is %d bytes, over the limit of %d",
			archive.ErrTooLarge, size, limit)
	}
	blob, err := layer.Compressed()
	if err != nil {
		e := pullError(err, "failed to extract the first layer from artifact: %w", err)
		e.Reason = sourcev1.OCILayerOperationFailedReason
		return "", e
	}
	defer blob.Close()
	p := filepath.Join(dir, blobName)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return "", layerError(failure.Transient, "failed to create file to copy layer to: %w", err)
	}
	var readErr error
	_, err = io.Copy(f, archive.OnReadError(blob, func(err error) { readErr = cmp.Or(readErr, err) }))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case err == nil:
		return p, nil
	case readErr != nil:
		e := pullError(readErr, "failed to copy layer from artifact: %w", readErr)
		e.Reason = sourcev1.OCILayerOperationFailedReason
		return "", e
	default:
		return "", layerError(failure.Transient, "failed to copy layer from artifact: %w", err)
	}
}

// tarGzip reports whether a media type is a gzip-compressed tar: Flux's
// (application/vnd.cncf.flux.content.v1.tar+gzip), OCI's and Docker's
// image layers, Helm charts.
func tarGzip(mediaType string) bool {
	return strings.Contains(mediaType, "tar") && (strings.HasSuffix(mediaType, "+gzip") || strings.HasSuffix(mediaType, ".gzip"))
}

// localFailure reports whether err is the download directory's (a full
// disk), not the content's: entries that clash (a file where a directory
// is, the same path twice as file and directory) are the content's.
func localFailure(err error) bool {
	var pathErr *fs.PathError
	if !errors.As(err, &pathErr) {
		return false
	}
	return !errors.Is(err, fs.ErrExist) && !errors.Is(err, syscall.ENOTDIR) && !errors.Is(err, syscall.EISDIR)
}

// untar extracts the gzip-compressed tar r into dir.
func untar(ctx context.Context, r io.Reader, dir string, maxFile, maxTotal int64) error {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("requires gzip-compressed body: %w", err)
	}
	defer gz.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	log := logr.FromContextOrDiscard(ctx)
	tr := tar.NewReader(gz)
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("tar error: %w", err)
		}
		rel, err := entryPath(h.Name)
		if err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if rel != "" {
				if err := root.MkdirAll(rel, 0o755); err != nil {
					return err
				}
			}
		case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // TypeRegA is what old tars write
			if rel == "" {
				return fmt.Errorf("%w: tar entry %q is a file at the root", errUnsafe, h.Name)
			}
			if maxFile > 0 && h.Size > maxFile {
				return fmt.Errorf("%w: file '%s' is %d bytes, over the limit of %d", archive.ErrTooLarge, rel, h.Size, maxFile)
			}
			if total += h.Size; total > maxTotal {
				return fmt.Errorf("%w: layer contents exceed %d bytes", archive.ErrTooLarge, maxTotal)
			}
			if err := writeFile(root, rel, h, tr); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if escapes(rel, h.Linkname) {
				return fmt.Errorf("%w: tar entry '%s' links outside the artifact ('%s')", errUnsafe, rel, h.Linkname)
			}
			// As Flux: symbolic links are left out of the artifact.
			log.V(1).Info("skipping symbolic link in layer", "path", rel)
		default:
			return fmt.Errorf("%w: tar file entry %s contained unsupported file type %c", errUnsafe, h.Name, h.Typeflag)
		}
	}
}

// writeFile writes a regular file's entry under root, its directory
// created if needed.
func writeFile(root *os.Root, rel string, h *tar.Header, body io.Reader) error {
	if d := path.Dir(rel); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	mode := os.FileMode(0o644)
	if h.Mode&0o111 != 0 {
		mode = 0o755
	}
	f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if n != h.Size {
		return fmt.Errorf("tar entry '%s': wrote %d bytes, expected %d", rel, n, h.Size)
	}
	return nil
}

// entryPath returns a tar entry's name as a clean relative path ("" for
// the root, "./"), refusing, as Flux does, absolute names, backslashes and
// any ".." segment.
func entryPath(name string) (string, error) {
	if name != "" && path.Clean(name) == "." {
		return "", nil
	}
	rel, err := archive.SafeName(name)
	if err != nil {
		return "", fmt.Errorf("%w: tar contained invalid name error %q", errUnsafe, name)
	}
	return rel, nil
}

// escapes reports whether a link at rel to target points out of the tree.
func escapes(rel, target string) bool {
	if target == "" || path.IsAbs(target) || strings.Contains(target, `\`) {
		return true
	}
	t := path.Clean(path.Join(path.Dir(rel), target))
	return t == ".." || strings.HasPrefix(t, "../")
}
