// Package storage is Headwater's shared artifact storage: the interface the
// fetcher, packager and artifact-server share, Flux's layout of keys, and
// two implementations: Dir, a local or shared directory (the embedded
// default), and S3, any S3-compatible object store. The latest pointer is a
// symlink in a directory and a server-side copy on S3; beside it, its
// order record (latest.go) says which job set it last.
//
// Keys are slash-separated paths relative to the storage root:
//
//	<kind>/<namespace>/<name>/<file>         an artifact (Flux's layout)
//	<kind>/<namespace>/<name>/latest.tar.gz  the latest pointer
//	.latest/<kind>/<namespace>/<name>/latest.tar.gz.json  the pointer's order record
//	.staging/<job>.tar                       content between fetcher and packager
//
// Keys whose first segment starts with a dot are internal and never served.
package storage

import (
	"context"
	// go-digest only knows the hash functions linked into the binary.
	_ "crypto/sha256"
	_ "crypto/sha512"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
)

// ErrNotFound is returned (wrapped) for a key with no object.
var ErrNotFound = errors.New("not found")

// ErrInvalidKey is returned (wrapped) for a key that is not a clean relative
// path inside the storage.
var ErrInvalidKey = errors.New("invalid key")

// ErrSuperseded is returned (wrapped) by SetLatest when the pointer was
// set for a newer job, and stays as it is.
var ErrSuperseded = errors.New("pointer set by a newer job")

// ErrChanged is returned (wrapped) by CopyMatching when the source key no
// longer holds the object the caller described.
var ErrChanged = errors.New("object changed")

// Info describes a stored object.
type Info struct {
	// Key of the object.
	Key string
	// Size in bytes.
	Size int64
	// ModTime is when the object was last written.
	ModTime time.Time
	// ETag changes whenever the object's content may have changed.
	ETag string
}

// Object is an open stored object, readable and seekable (for HTTP ranges).
type Object interface {
	io.ReadSeekCloser
	// Info describes the object that was opened.
	Info() Info
}

// Storage is the shared store of artifacts and staged content. Every
// implementation is safe for concurrent use by many processes.
type Storage interface {
	// Put stores r's content under key atomically: readers see the old
	// object or the complete new one, never a partial one. It describes
	// what it stored; the ModTime may be the writer's clock (S3), where
	// Stat's is the store's.
	Put(ctx context.Context, key string, r io.Reader) (Info, error)
	// Open opens key for reading.
	Open(ctx context.Context, key string) (Object, error)
	// Stat describes key without reading it.
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes key; a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// List describes the objects directly under the directory key dir,
	// excluding pointers made by SetLatest.
	List(ctx context.Context, dir string) ([]Info, error)
	// SetLatest makes the pointer key resolve to target, an object in the
	// same directory, atomically, for a job requested at requestedAt
	// (events.Job.RequestedAt): pointers follow job order, not the order
	// artifacts are stored in. When the pointer was last set for a job
	// requested later, it stays and SetLatest fails wrapping
	// ErrSuperseded; a job requested at the same time moves it (a
	// redelivered job sets it again). Replicas may call it concurrently:
	// the pointer ends at the newest job's target. Deleting the pointer
	// forgets its job's time.
	SetLatest(ctx context.Context, key, target string, requestedAt time.Time) error
	// DeleteLatest removes the pointer key for a job requested at
	// requestedAt, in the same order as SetLatest: a pointer set for a
	// newer job stays (ErrSuperseded). Its order record stays too, saying
	// when it was removed, so that an older job finishing later does not
	// set it again.
	DeleteLatest(ctx context.Context, key string, requestedAt time.Time) error
	// LatestTarget returns the key of the object the pointer key leads
	// to, by name: the symlink's target (Dir), the target its order record
	// names (S3, where the pointer is a copy whose ETag may differ from
	// its target's). It wraps ErrNotFound when there is no pointer, or on
	// S3 when no record names one (a pointer set before records were
	// kept): the caller then has only what Stat says of the pointer.
	LatestTarget(ctx context.Context, key string) (string, error)
	// Copy makes dst a copy of the object src atomically, without the bytes
	// passing through the caller (a hard link in a directory, a server-side
	// copy on S3), and describes dst. A missing src wraps ErrNotFound. The
	// copy's ModTime and ETag may be src's (Dir) or new ones (S3).
	Copy(ctx context.Context, src, dst string) (Info, error)
	// CopyMatching is Copy of the object src describes (as Open, Stat or
	// Put described it, by its ETag): when src.Key now holds another
	// object it fails wrapping ErrChanged and leaves dst alone, so dst
	// gets exactly the bytes the caller saw. It saves Copy's look-up of
	// src (on S3 one request instead of two).
	CopyMatching(ctx context.Context, src Info, dst string) (Info, error)
}

// TemporarySweeper is a Storage whose writes leave temporary files behind
// when their writer dies mid-write (Dir: a killed process cannot remove
// the file it was renaming into place). The packager's janitor calls it.
type TemporarySweeper interface {
	// SweepTemporary removes the temporary files of writes last written
	// to before cutoff and returns what it removed. A live write touches
	// its file at every chunk, so only one abandoned or stalled for longer
	// than the caller allows is removed.
	SweepTemporary(ctx context.Context, cutoff time.Time) ([]string, error)
}

// LatestName is the file name of the pointer to a source's newest artifact.
const LatestName = "latest.tar.gz"

// StagingDir is the internal directory of staged content.
const StagingDir = ".staging"

// SourceDir is the directory of one source's artifacts: <kind>/<namespace>/<name>.
func SourceDir(kind, namespace, name string) string {
	return strings.ToLower(kind) + "/" + namespace + "/" + name
}

// ArtifactKey is the key of an artifact file of a source.
func ArtifactKey(kind, namespace, name, file string) string {
	return SourceDir(kind, namespace, name) + "/" + file
}

// StagingKey is the key of a job's staged content. The job ID is hashed, so
// any ID maps to a safe, fixed-length name.
func StagingKey(jobID string) string {
	return StagingDir + "/" + digest.SHA256.FromString(jobID).Encoded() + ".tar"
}

// CleanKey checks that key is a clean, relative, slash-separated path with no
// "." or ".." segments, and returns it.
func CleanKey(key string) (string, error) {
	if key == "" || strings.HasPrefix(key, "/") || strings.Contains(key, "\\") || strings.ContainsRune(key, 0) ||
		path.Clean(key) != key {
		return "", fmt.Errorf("%w: %q", ErrInvalidKey, key)
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "." || seg == ".." {
			return "", fmt.Errorf("%w: %q", ErrInvalidKey, key)
		}
	}
	return key, nil
}

// IsInternal reports whether key lies in an internal (dot) directory.
func IsInternal(key string) bool {
	return strings.HasPrefix(key, ".")
}

// Verify reports whether the object at key has the given digest (in
// "<algorithm>:<hex>" form). A missing object wraps ErrNotFound; a mismatch
// returns a *DigestMismatchError.
func Verify(ctx context.Context, s Storage, key, want string) error {
	expected, err := digest.Parse(want)
	if err != nil {
		return fmt.Errorf("verify %s: bad digest %q: %w", key, want, err)
	}
	obj, err := s.Open(ctx, key)
	if err != nil {
		return err
	}
	defer obj.Close()
	verifier := expected.Verifier()
	if _, err := io.Copy(verifier, obj); err != nil {
		return fmt.Errorf("verify %s: read: %w", key, err)
	}
	if !verifier.Verified() {
		return &DigestMismatchError{Key: key, Expected: want}
	}
	return nil
}

// DigestMismatchError says a stored object's content does not match the
// digest recorded for it.
type DigestMismatchError struct {
	Key      string
	Expected string
}

// Error uses Flux's wording for the ArtifactVerificationFailed Event.
func (e *DigestMismatchError) Error() string {
	return fmt.Sprintf("failed to verify integrity of artifact: computed digest doesn't match '%s'", e.Expected)
}
