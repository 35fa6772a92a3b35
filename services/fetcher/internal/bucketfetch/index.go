package bucketfetch

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// object is a listed object: its ETag, which the revision covers, and its
// size, which the size limit is checked against before downloading.
type object struct {
	etag string
	size int64
}

// Revision returns Flux's revision of a bucket listing, "sha256:<hex>":
// the SHA-256 of one line "<key> <etag>\n" per object, in the byte order
// of the keys (Flux's index.Digester). It depends on nothing but the keys
// and their ETags, so the same listing in any order has the same revision.
func Revision(etags map[string]string) string {
	return "sha256:" + digestHex(etags)
}

// digestHex is the hex SHA-256 of the listing, as Revision describes.
func digestHex(etags map[string]string) string {
	keys := make([]string, 0, len(etags))
	for k := range etags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	for _, k := range keys {
		// A hash.Hash never fails to write.
		_, _ = fmt.Fprintf(h, "%s %s\n", k, etags[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// errUnsafeKey is wrapped by the errors of keys that cannot be written
// inside the download directory.
var errUnsafeKey = errors.New("unsafe object key")

// objectPath returns the path, relative to the download directory, an
// object key is written to: the key, cleaned of empty and "." elements. A
// key that is absolute, has a ".." element or names no file is refused: a
// hostile bucket must not write outside the directory.
func objectPath(key string) (string, error) {
	switch {
	case key == "":
		return "", fmt.Errorf("%w: empty key", errUnsafeKey)
	case strings.HasPrefix(key, "/"):
		return "", fmt.Errorf("%w '%s': absolute path", errUnsafeKey, key)
	case strings.ContainsRune(key, 0):
		return "", fmt.Errorf("%w '%s': NUL character", errUnsafeKey, key)
	}
	if slices.Contains(strings.Split(key, "/"), "..") {
		return "", fmt.Errorf("%w '%s': '..' element", errUnsafeKey, key)
	}
	rel := path.Clean(key)
	if rel == "." {
		return "", fmt.Errorf("%w '%s': no file name", errUnsafeKey, key)
	}
	return filepath.FromSlash(rel), nil
}
