package ociimage

import (
	"bytes"
	"encoding/pem"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// NonRoot is the uid and gid the images run as: distroless's "nonroot".
const NonRoot = 65532

// CertFile is where the base layer puts the CA roots, Debian's path, which
// Go's crypto/x509 reads first on Linux.
const CertFile = "etc/ssl/certs/ca-certificates.crt"

// CARoots returns the PEM bundle of the NSS roots that the pinned module
// golang.org/x/crypto/x509roots/fallback embeds, so the bundle, and the
// image digest, depend on go.mod and not on the machine. Roots that NSS
// distrusts after a date are left out: a PEM file cannot carry that
// constraint, and trusting them without it would trust more than NSS does.
func CARoots() ([]byte, error) {
	var buf bytes.Buffer
	n := 0
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, fmt.Errorf("encode CA root: %w", err)
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("x509roots/fallback bundle holds no unconstrained roots")
	}
	return buf.Bytes(), nil
}

// BaseFiles is the file system every image starts from, in place of a
// distroless base: CA roots, /etc/passwd and /etc/group naming root and
// nonroot (65532), and empty /data and /tmp owned by nonroot (/tmp sticky
// and world-writable, as on any Unix).
func BaseFiles() ([]File, error) {
	roots, err := CARoots()
	if err != nil {
		return nil, err
	}
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group := "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
	return []File{
		{Path: "etc/passwd", Mode: 0o644, Data: []byte(passwd)},
		{Path: "etc/group", Mode: 0o644, Data: []byte(group)},
		{Path: CertFile, Mode: 0o644, Data: roots},
		{Path: "data", Mode: 0o755, UID: NonRoot, GID: NonRoot, Dir: true},
		{Path: "home/nonroot", Mode: 0o700, UID: NonRoot, GID: NonRoot, Dir: true},
		{Path: "tmp", Mode: 0o1777, UID: NonRoot, GID: NonRoot, Dir: true},
	}, nil
}

// WriteBaseDir writes BaseFiles under dir, modes included and ownership
// left to the caller, for the Dockerfile, which copies the same base into
// its image (chowning /data and /tmp) rather than starting from distroless.
func WriteBaseDir(dir string) error {
	files, err := BaseFiles()
	if err != nil {
		return err
	}
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.Path))
		if f.Dir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return fmt.Errorf("write base: %w", err)
			}
		} else {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return fmt.Errorf("write base: %w", err)
			}
			if err := os.WriteFile(p, f.Data, 0o644); err != nil {
				return fmt.Errorf("write base: %w", err)
			}
		}
		// Chmod, not the umask-bound create modes: /tmp is sticky and 1777.
		if err := os.Chmod(p, fs.FileMode(f.Mode&0o777)|modeBits(f.Mode)); err != nil {
			return fmt.Errorf("write base: %w", err)
		}
	}
	return nil
}

// modeBits turns the tar sticky bit into its fs.FileMode.
func modeBits(mode int64) fs.FileMode {
	if mode&0o1000 != 0 {
		return fs.ModeSticky
	}
	return 0
}
