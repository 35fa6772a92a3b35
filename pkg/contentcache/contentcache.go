// Package contentcache is the content cache shared by the fetcher and the
// packager, which makes identical sources cost one fetch: a content key
// digests everything that determines an artifact's bytes, and the packager,
// having stored an artifact for a key, records it under the internal
// directory .cache of the shared storage:
//
//	.cache/<key>.json    the index: what the artifact is (Index)
//	.cache/<key>.tar.gz  the cache's own copy of the artifact
//
// Before downloading, the fetcher looks its key up (Lookup, which only
// reads); on a hit the packager copies the cached artifact to the source's
// directory and nothing is fetched. The copy is a hard link on a directory
// storage and a server-side copy on S3: no bytes move through a service.
// The cache's copy belongs to no source, so no source's retention deletes
// it; the packager's janitor removes entries unused for a while, and the
// packager refreshes the index of an entry it copies (Refresh). The
// packager is the cache's one writer. See docs/design.md.
package contentcache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// Dir is the internal storage directory of the cache.
const Dir = ".cache"

// FormatVersion is digested into every key: a change of what a key covers,
// or of how artifacts are made from fetched content, bumps it, so that
// entries made the old way are never reused.
const FormatVersion = "headwater-content-v1"

// RefreshAfter is the age after which the index of an entry in use is
// written again (Refresh), so that the janitor, which removes entries
// unused for longer than its TTL (much longer than this), leaves entries
// in use alone.
const RefreshAfter = time.Minute

// maxIndexSize bounds the index read into memory.
const maxIndexSize = 64 << 10

// Index is the content of .cache/<key>.json.
type Index struct {
	// Key is the content key.
	Key string `json:"key"`
	// Artifact is the storage key of the cache's copy of the artifact,
	// .cache/<key>.tar.gz.
	Artifact string `json:"artifact"`
	// Digest of the artifact, "<algorithm>:<hex>".
	Digest string `json:"digest"`
	// Algorithm of the digest, e.g. "sha256".
	Algorithm string `json:"algorithm"`
	// Size of the artifact in bytes.
	Size int64 `json:"size"`
	// Revision the artifact was made from.
	Revision string `json:"revision"`
	// ArtifactName is the file name sources store the artifact under.
	ArtifactName string `json:"artifactName"`
	// EventMessage is the message of the NewArtifact event for it.
	EventMessage string `json:"eventMessage,omitempty"`
	// Metadata is the artifact's metadata (an OCI artifact's annotations).
	Metadata map[string]string `json:"metadata,omitempty"`
}

const (
	indexSuffix    = ".json"
	artifactSuffix = ".tar.gz"
)

// IndexKey is the storage key of the index of a content key.
func IndexKey(key string) string { return Dir + "/" + key + indexSuffix }

// ArtifactKey is the storage key of the cache's copy of the artifact of a
// content key.
func ArtifactKey(key string) string { return Dir + "/" + key + artifactSuffix }

// Key digests the parts that determine an artifact's bytes into a content
// key (64 hex digits): FormatVersion, the kind, the source's identity (see
// source.Shareable), the revision, the includes' digests and where they
// go, and the largest file the fetcher accepts.
func Key(kind string, identity []string, revision string, includes []events.Include, maxFileSize int64) string {
	h := sha256.New()
	field := func(s string) { h.Write([]byte(strconv.Itoa(len(s)) + ":" + s + "\n")) }
	field(FormatVersion)
	field(kind)
	field(strconv.Itoa(len(identity)))
	for _, p := range identity {
		field(p)
	}
	field(revision)
	field(strconv.Itoa(len(includes)))
	for _, in := range includes {
		field(in.Artifact.Digest)
		field(in.FromPath)
		field(in.ToPath)
	}
	field(strconv.FormatInt(maxFileSize, 10))
	return hex.EncodeToString(h.Sum(nil))
}

// Lookup returns the index of key when the cache holds an artifact for it
// made from revision, nil when it does not. It checks that the cached
// artifact is stored with the recorded size, and writes nothing. Errors are
// the storage's, or a cancelled ctx; a malformed index is a miss. The index
// is read while the artifact is described (its key follows from key), so on
// S3 a look-up waits for one round trip, not two.
func Lookup(ctx context.Context, store storage.Storage, key, revision string) (*Index, error) {
	var (
		info    storage.Info
		statErr error
		wg      sync.WaitGroup
	)
	wg.Go(func() { info, statErr = store.Stat(ctx, ArtifactKey(key)) })
	idx, err := readIndex(ctx, store, key, revision)
	wg.Wait()
	switch {
	case err != nil || idx == nil:
		return nil, err
	case errors.Is(statErr, storage.ErrNotFound):
		return nil, nil
	case statErr != nil:
		return nil, fmt.Errorf("content cache: %w", statErr)
	case info.Size != idx.Size:
		return nil, nil
	}
	return idx, nil
}

// readIndex reads the index of key, nil when there is none or it is not
// one of an artifact of revision.
func readIndex(ctx context.Context, store storage.Storage, key, revision string) (*Index, error) {
	obj, err := store.Open(ctx, IndexKey(key))
	if errors.Is(err, storage.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("content cache: %w", err)
	}
	body, err := io.ReadAll(io.LimitReader(obj, maxIndexSize+1))
	_ = obj.Close()
	if err != nil {
		return nil, fmt.Errorf("content cache: read %s: %w", IndexKey(key), err)
	}
	var idx Index
	if len(body) > maxIndexSize || json.Unmarshal(body, &idx) != nil || idx.Key != key || idx.Artifact != ArtifactKey(key) ||
		idx.Revision != revision || idx.Size < 0 || idx.Digest == "" || idx.ArtifactName == "" ||
		!strings.HasPrefix(idx.Digest, idx.Algorithm+":") {
		return nil, nil
	}
	return &idx, nil
}

// ValidKey reports whether key is a content key: 64 lowercase hex digits.
func ValidKey(key string) bool {
	if len(key) != 64 {
		return false
	}
	for _, c := range key {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// KeyOfArtifact returns the content key of a cached artifact's storage key,
// and false when key is not one.
func KeyOfArtifact(key string) (string, bool) { return keyOf(key, artifactSuffix) }

// KeyOfIndex returns the content key of an index's storage key, and false
// when key is not one.
func KeyOfIndex(key string) (string, bool) { return keyOf(key, indexSuffix) }

func keyOf(key, suffix string) (string, bool) {
	rest, ok := strings.CutPrefix(key, Dir+"/")
	if !ok {
		return "", false
	}
	k, ok := strings.CutSuffix(rest, suffix)
	if !ok || !ValidKey(k) {
		return "", false
	}
	return k, true
}

// Record adds the artifact from (as Put, Stat or Open described it) to the
// cache under idx.Key: it writes the index, then copies the artifact to
// idx.Artifact, only if from's key still holds the object described
// (storage.CopyMatching; on S3 two requests in all). A reader that finds
// the index before the copy exists sees a miss, never a wrong artifact: a
// key's artifact is the same bytes whoever makes it.
func Record(ctx context.Context, store storage.Storage, from storage.Info, idx Index) error {
	if err := writeIndex(ctx, store, &idx); err != nil {
		return err
	}
	info, err := store.CopyMatching(ctx, from, idx.Artifact)
	if err != nil {
		return fmt.Errorf("content cache: %w", err)
	}
	if info.Size != idx.Size {
		return fmt.Errorf("content cache: copied %d bytes of %s, want %d", info.Size, from.Key, idx.Size)
	}
	return nil
}

// Refresh keeps the entry of idx.Key, whose artifact a source has just
// copied, from the janitor: it writes the index idx again when the stored
// one is older than RefreshAfter at now, or when the janitor removed it
// since the fetcher looked it up (the cached artifact outlives its index
// while a pending job names it). A recent index is left alone.
func Refresh(ctx context.Context, store storage.Storage, idx Index, now time.Time) error {
	info, err := store.Stat(ctx, IndexKey(idx.Key))
	switch {
	case err == nil && now.Sub(info.ModTime) < RefreshAfter:
		return nil
	case err != nil && !errors.Is(err, storage.ErrNotFound):
		return fmt.Errorf("content cache: %w", err)
	}
	return writeIndex(ctx, store, &idx)
}

// writeIndex writes idx, naming its artifact, as the index of idx.Key.
func writeIndex(ctx context.Context, store storage.Storage, idx *Index) error {
	if !ValidKey(idx.Key) {
		return fmt.Errorf("content cache: invalid key %q", idx.Key)
	}
	idx.Artifact = ArtifactKey(idx.Key)
	body, err := json.Marshal(idx)
	if err != nil {
		return fmt.Errorf("content cache: %w", err)
	}
	if _, err := store.Put(ctx, IndexKey(idx.Key), bytes.NewReader(body)); err != nil {
		return fmt.Errorf("content cache: write index: %w", err)
	}
	return nil
}

// Forget removes the entry of key, index first.
func Forget(ctx context.Context, store storage.Storage, key string) error {
	return errors.Join(store.Delete(ctx, IndexKey(key)), store.Delete(ctx, ArtifactKey(key)))
}
