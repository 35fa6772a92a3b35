// Package source is the contract between the fetch job handler and the
// kinds of source it fetches: a kind implements Source, and the handler does
// the rest (the unchanged check, staging, publishing and retries) the same
// way for every kind.
package source

import (
	"context"
	"io/fs"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// DefaultTimeout is the deadline of a whole fetch when the spec sets none,
// as in Flux.
const DefaultTimeout = 60 * time.Second

// TimeoutOf is a spec's timeout, DefaultTimeout when it sets none.
func TimeoutOf(d *metav1.Duration) time.Duration {
	if d != nil && d.Duration > 0 {
		return d.Duration
	}
	return DefaultTimeout
}

// Source fetches sources of one kind.
type Source interface {
	// Timeout is the deadline of the whole fetch of req, from resolving the
	// revision to staging the content.
	Timeout(req *events.FetchRequested) time.Duration
	// Resolve checks req, reads the credentials it names and asks the
	// upstream for its current revision without downloading any content
	// (but where the revision is the content's digest, as a Helm index's,
	// which is downloaded only when it changed). A Resolved that is an
	// io.Closer is closed when the job ends. Errors are *failure.Error values.
	Resolve(ctx context.Context, req *events.FetchRequested) (Resolved, error)
}

// Resolved is an upstream revision, ready to be downloaded.
type Resolved interface {
	// Revision is the upstream revision in Flux's format, e.g.
	// "main@sha1:<commit>".
	Revision() string
	// Download writes the content into dir, an empty directory the caller
	// removes afterwards, and describes it. Errors are *failure.Error values.
	Download(ctx context.Context, dir string) (*Content, error)
}

// Shareable is implemented by a Resolved whose content may be reused from
// another source's identical artifact instead of being downloaded.
type Shareable interface {
	// ContentIdentity returns what, besides the kind, the revision and the
	// fetcher's limits, determines the downloaded content byte for byte
	// (the upstream without credentials, the content-affecting spec); ok
	// is false when the content must not be shared.
	ContentIdentity() (parts []string, ok bool)
	// ProveAccess confirms that this source's own credentials can read the
	// upstream (when resolving did not already), before content another
	// source fetched is handed to it. Errors are *failure.Error values.
	ProveAccess(ctx context.Context) error
}

// Content is downloaded content, ready to be staged.
type Content struct {
	// Root is the directory to archive.
	Root string
	// FS, when set, is the tree to archive in place of Root: content that
	// is on no disk (a git commit's tree read from its packfile). Tree
	// returns whichever is set.
	FS fs.FS
	// File, when set, is a file that is the artifact itself (a Helm chart,
	// a Helm repository index, an OCI layer copied as is): it is staged
	// and stored unchanged, and Root and Exclude are not used.
	File string
	// Exclude leaves paths out of the archive (see archive.TarOptions).
	Exclude func(rel string, isDir bool) bool
	// Revision of the downloaded content, which may be newer than the
	// resolved one if the upstream moved in between.
	Revision string
	// ArtifactName is the file name the artifact is stored under.
	ArtifactName string
	// EventMessage is the message of the NewArtifact event, in Flux's words.
	EventMessage string
	// Metadata is the artifact's metadata (an OCI artifact's annotations).
	Metadata map[string]string
	// Verification is the result of checking the content's signatures
	// (a GitRepository's spec.verify); nil when none were asked for.
	Verification *events.Verification
}

// Tree is the tree to archive: FS, or else the directory Root.
func (c *Content) Tree() fs.FS {
	if c.FS != nil {
		return c.FS
	}
	return os.DirFS(c.Root)
}
