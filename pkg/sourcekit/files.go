package sourcekit

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
)

// Reasons of the failures of Download and ExtractTarGz.
const (
	// InvalidArchiveReason: the content is not a gzipped tarball, or one
	// with an entry that leaves its root.
	InvalidArchiveReason = "InvalidArchive"
	// TooLargeReason: the content is larger than the fetcher allows.
	TooLargeReason = "ContentTooLarge"
)

// Download writes at most max bytes of r to file and returns the hex
// SHA-256 of what it wrote: a revision "sha256:<hex>" for content that
// has no other. More than max bytes is a Final TooLargeReason failure; a
// read that breaks off is Transient.
func Download(r io.Reader, file string, max int64) (string, error) {
	out, err := os.Create(file)
	if err != nil {
		return "", err
	}
	defer out.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), io.LimitReader(r, max+1))
	if err != nil {
		return "", Transient(sourcev1.URLInvalidReason, "failed to download: %s", err.Error())
	}
	if n > max {
		return "", Final(TooLargeReason, "the content is larger than the fetcher's limit of %d bytes", max)
	}
	return hex.EncodeToString(h.Sum(nil)), out.Close()
}

// ExtractTarGz unpacks the gzipped tarball file into dir, safely: regular
// files and directories only (links and devices are skipped), no entry
// that is absolute or leaves dir through "..", at most max bytes in all.
// A tarball that breaks these rules is a Final InvalidArchiveReason or
// TooLargeReason failure, which names the entry.
func ExtractTarGz(file, dir string, max int64) error {
	in, err := os.Open(file)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	zr, err := gzip.NewReader(in)
	if err != nil {
		return Final(InvalidArchiveReason, "the content is not a gzipped tarball: %s", err.Error())
	}
	tr, left := tar.NewReader(zr), max
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return Final(InvalidArchiveReason, "the tarball is corrupt: %s", err.Error())
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if path.IsAbs(hdr.Name) || name == ".." || strings.HasPrefix(name, "../") {
			return Final(InvalidArchiveReason, "the tarball's entry '%s' leaves its root", hdr.Name)
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, 0o755)
		case tar.TypeReg:
			if left -= hdr.Size; left < 0 {
				return Final(TooLargeReason, "the tarball holds more than the fetcher's limit of %d bytes", max)
			}
			err = writeFile(target, tr, hdr.Size)
		}
		if err != nil {
			return fmt.Errorf("extract %s: %w", name, err)
		}
	}
}

// writeFile writes size bytes of r to target, making its directory.
func writeFile(target string, r io.Reader, size int64) error {
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(out, r, size); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
