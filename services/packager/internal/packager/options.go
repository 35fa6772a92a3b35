package packager

import (
	// The digest algorithms are only available when their hash is linked.
	_ "crypto/sha256"
	_ "crypto/sha512"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/compose"

	"github.com/headwater-gitops/headwater/services/packager/internal/retention"
)

// Options configure how artifacts are written and kept; the flag names and
// defaults are Flux source-controller's.
type Options struct {
	// DigestAlgo is the artifact digest algorithm: sha256, sha384 or sha512.
	DigestAlgo string
	// RetentionRecords is the number of newest artifacts a source keeps.
	RetentionRecords int
	// RetentionTTL is how long an older artifact is kept at least.
	RetentionTTL time.Duration
	// MaxFileSize, when positive, rejects staged content with a larger file.
	MaxFileSize int64
	// MaxUnpackSize and MaxUnpackEntries, when positive, bound what one
	// unpack of an ArtifactGenerator job writes to disk: each source's
	// tree, and the tarballs one output extracts (compose.Limits); and
	// what the copy operations of all the job's outputs write together.
	MaxUnpackSize    int64
	MaxUnpackEntries int
	// NoCrossNamespaceRefs refuses an ArtifactGenerator job naming a
	// source of another namespace than the generator's (Flux's
	// --no-cross-namespace-refs; the watcher refuses it first).
	NoCrossNamespaceRefs bool
	// ContentCacheTTL is how long a content cache entry nobody uses is
	// kept; zero records nothing in the content cache.
	ContentCacheTTL time.Duration
	// CompressionLevel is the artifacts' gzip level, 1 (fastest) to 9;
	// archive.DefaultLevel when 0.
	CompressionLevel int
}

// MinContentCacheTTL is the shortest ContentCacheTTL: the packager
// refreshes the index of an entry it copies once a minute
// (contentcache.RefreshAfter), and an entry in use must outlive that.
const MinContentCacheTTL = 5 * time.Minute

// BindFlags registers the options on fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.DigestAlgo, "artifact-digest-algo", digest.SHA256.String(),
		"The hashing algorithm used to calculate the digest of artifacts: sha256, sha384 or sha512.")
	fs.IntVar(&o.RetentionRecords, "artifact-retention-records", 2,
		"The maximum number of artifacts to be kept in storage after a garbage collection.")
	fs.DurationVar(&o.RetentionTTL, "artifact-retention-ttl", time.Minute,
		"The duration of time that artifacts from previous reconciliations will be kept in storage before being garbage collected.")
	fs.Int64Var(&o.MaxFileSize, "max-file-size", 0,
		"The largest file, in bytes, an artifact may contain; 0 means no limit.")
	fs.Int64Var(&o.MaxUnpackSize, "max-unpack-size", compose.DefaultMaxUnpackSize,
		"The most bytes one unpack of an ArtifactGenerator job (a source's tree, the tarballs an output extracts), and the copy operations of all its outputs together, may write; 0 means no limit.")
	fs.IntVar(&o.MaxUnpackEntries, "max-unpack-entries", compose.DefaultMaxUnpackEntries,
		"The most files and directories one unpack of an ArtifactGenerator job, and the copy operations of all its outputs together, may write; 0 means no limit.")
	fs.BoolVar(&o.NoCrossNamespaceRefs, "no-cross-namespace-refs", false,
		"When set to true, an ArtifactGenerator job may copy sources of the generator's own namespace only (AccessDenied otherwise), as Flux's flag; see docs/security.md.")
	fs.DurationVar(&o.ContentCacheTTL, "content-cache-ttl", time.Hour,
		"How long an entry of the content cache (artifacts reused by sources with identical content) is kept after its last use; 0 records nothing.")
	fs.IntVar(&o.CompressionLevel, "compression-level", archive.DefaultLevel,
		"The gzip level of artifacts, 1 (fastest) to 9 (smallest).")
}

// Validate reports the first invalid option.
func (o Options) Validate() error {
	switch {
	case !o.Algorithm().Available():
		return fmt.Errorf("--artifact-digest-algo: unsupported algorithm %q (sha256, sha384 or sha512)", o.DigestAlgo)
	case o.RetentionRecords < 0:
		return errors.New("--artifact-retention-records must not be negative")
	case o.RetentionTTL < 0:
		return errors.New("--artifact-retention-ttl must not be negative")
	case o.MaxFileSize < 0:
		return errors.New("--max-file-size must not be negative")
	case o.MaxUnpackSize < 0:
		return errors.New("--max-unpack-size must not be negative")
	case o.MaxUnpackEntries < 0:
		return errors.New("--max-unpack-entries must not be negative")
	case o.CompressionLevel < 0 || o.CompressionLevel > 9:
		return errors.New("--compression-level must be from 1 to 9")
	case o.ContentCacheTTL != 0 && o.ContentCacheTTL < MinContentCacheTTL:
		return fmt.Errorf("--content-cache-ttl must be 0 or at least %s", MinContentCacheTTL)
	}
	return nil
}

// Algorithm is the digest algorithm DigestAlgo names (sha256 when empty).
func (o Options) Algorithm() digest.Algorithm {
	if o.DigestAlgo == "" {
		return digest.SHA256
	}
	return digest.Algorithm(o.DigestAlgo)
}

// compose is what bounds an ArtifactGenerator job's builds and unpacks,
// with a copy budget of its own: each job takes one.
func (o Options) compose() compose.Options {
	limits := compose.Limits{MaxSize: o.MaxUnpackSize, MaxEntries: o.MaxUnpackEntries,
		SizeFlag: "-max-unpack-size", EntriesFlag: "-max-unpack-entries"}
	return compose.Options{MaxFileSize: o.MaxFileSize, Limits: limits, Copied: compose.NewBudget(limits)}
}

// Retention is the garbage collection policy of the options.
func (o Options) Retention() retention.Policy {
	return retention.Policy{Records: o.RetentionRecords, TTL: o.RetentionTTL}
}
